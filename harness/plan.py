"""The validated config and what it plans, as plain Python (no Snakemake).

``workflow/rules/common.smk`` validates ``config`` and plans the DAG with this module, turning a
``ConfigError`` into Snakemake's ``WorkflowError``; tests and ``harness.tryout`` call it directly. Every
error names the offending config key. Everything planned is a function of the config; only ``run_on``'s
``auto`` looks at the planning host.
"""
from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import yaml

from harness.device import detect_gpu, matching_platforms
from harness.metrics import gated_metrics
from kernels.registry import FORMATS, VARIANTS, load_all, registration_sites, tile_problem, unchecked_targets
from kernels.smem import kernel_smem_bytes
from kernels.tiles import LIBRARY, SHAPE_BOUNDS, compile_check_shape, parse_shape, parse_tile, shape_class, smem_problem

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
# what ``auto`` resolved to, handed by the planning process to every job it spawns (resolve_auto)
AUTO_ENV = "LPGEMM_AUTO_PLATFORM"


class ConfigError(ValueError):
    """A config the pipeline cannot plan; the message starts with "invalid config:" and names the key."""

    def __init__(self, *lines: str):
        super().__init__("invalid config:\n" + "\n".join(f"  {line}" for line in lines))


class UnplannedTarget(ValueError):
    """A requested output that the config does not plan (e.g. a profile of a point its entry does not time)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently, so a
    second `fp8_e4m3:` entry would replace the first without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def load_config_text(path: Path | str) -> dict:
    """A config file's YAML as a dict, unvalidated. A syntax error, a duplicate key or a top level other
    than a mapping raises ConfigError("<path>:<line>:<column>: <problem>") (1-based, from YAML's mark);
    call it before Snakemake reads the file, whose own error gives neither line nor column."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    try:
        cfg = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        # where YAML noticed, and where the construct it was in began (an unclosed bracket lines before)
        found, start = e.problem_mark or e.context_mark, e.context_mark
        where = f"{path}:{found.line + 1}:{found.column + 1}" if found else str(path)
        problem = " ".join(x for x in (e.context, e.problem) if x) or str(e)
        if start and found and start.line != found.line:
            problem += f" (the construct began at {start.line + 1}:{start.column + 1})"
        raise ConfigError(f"{where}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: {e}") from None
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}:1:1: the config must be a mapping of keys (seed, run_on, ...), got {type(cfg).__name__}")
    return cfg


def load_config(path: Path | str = REPO / "config.yaml", overrides: dict | None = None) -> dict:
    """A config file, validated as the pipeline validates it (``validate``)."""
    return validate(load_config_text(path), overrides)


def _strict_types():
    """JSON Schema counts 1.0 as an integer and NaN or Inf as numbers; here an integer is an int (so
    `seed: 1.0`, which would seed other inputs than `seed: 1`, is refused) and a number is finite."""
    def integer(_, x):
        return isinstance(x, int) and not isinstance(x, bool)

    def number(_, x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({"integer": integer, "number": number})
    return jsonschema.validators.extend(base, type_checker=checker)


def check_overrides(overrides: dict, where=()) -> None:
    """An override (--configfile, --config) merges into config.yaml key by key, so an empty mapping in it
    changes nothing: refuse it instead of silently running the default."""
    for key, value in overrides.items():
        path = (*where, str(key))
        if isinstance(value, dict):
            if not value:
                raise ConfigError(f"{'.'.join(path)}: an empty mapping in an override (--configfile/--config) "
                                  "merges into config.yaml and changes nothing; to drop a variant, set it to null "
                                  "(variants: {fp8_e5m2: null})")
            check_overrides(value, path)


def drop_nulled_variants(cfg: dict) -> None:
    """`variants: {name: null}` in an override removes that entry (a merge cannot delete keys)."""
    if isinstance(cfg.get("variants"), dict):
        cfg["variants"] = {k: v for k, v in cfg["variants"].items() if v is not None}


def nvcc_archs():
    """(path, real archs sm_XX) of the nvcc on PATH; None without one (the schema's list then rules)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return (nvcc, set(out.split())) if out.split() else None


def check_targets(cfg: dict) -> None:
    found = nvcc_archs()
    if found is None:
        return
    nvcc, archs = found
    for i, target in enumerate(cfg["targets"]):
        if target.removesuffix("a") not in archs:
            raise ConfigError(f"targets.{i}: {target} is not an arch of {nvcc} (--list-gpu-code: {', '.join(sorted(archs))})")


def _key(path) -> str:
    return ".".join(str(p) for p in path)


def _alternatives(error) -> str:
    """What a oneOf/anyOf accepts: each alternative's schema description, or its type."""
    forms = [alt.get("description") or f"a value of type {alt.get('type', '?')}" for alt in error.validator_value]
    return "; or ".join(forms)


def _schema_message(error) -> str:
    if error.validator == "type" and isinstance(error.instance, float):
        if error.validator_value == "integer" and error.instance.is_integer():
            return f"{error.instance!r} is not an integer (write {int(error.instance)})"
        if not math.isfinite(error.instance):
            return f"{error.instance!r} is not a finite number"
    if error.validator in ("oneOf", "anyOf") and error.context:
        # jsonschema's own text ("is not valid under any of the given schemas") names neither the allowed
        # forms nor what is wrong: say both, the latter from the alternatives of the instance's own type
        # (a list of tiles is judged by the list form, not by the mapping form it also fails)
        by_alt: dict[int, list] = {}
        for sub in error.context:
            by_alt.setdefault(sub.schema_path[0], []).append(sub)
        near = [subs for subs in by_alt.values()
                if not any(e.validator == "type" and not e.relative_path for e in subs)]
        why = ""
        if near:
            sub = max((e for subs in near for e in subs), key=lambda e: len(e.relative_path))
            why = f"; {_key([*error.path, *sub.relative_path])}: {_schema_message(sub)}"
        elif error.validator == "oneOf" and len(by_alt) < len(error.validator_value):
            why = "; it matches more than one of them"
        got = repr(error.instance)
        return f"allowed: {_alternatives(error)} (got {got if len(got) <= 120 else got[:117] + '...'}){why}"
    if error.validator == "pattern" and isinstance(error.instance, str):
        # a tile or shape name: the grammar in words, not the regular expression
        for marker, parse in (("_s[0-9]+_t", parse_tile), ("x[1-9]", parse_shape)):
            if marker in error.validator_value:
                try:
                    parse(error.instance)
                except ValueError as e:
                    return str(e)
    return error.message


def validate(cfg: dict, overrides: dict | None = None, check_shapes: bool = True, root: Path | str | None = None) -> dict:
    """Schema first, then what a schema cannot know; every message names the offending key. Completes
    ``cfg`` in place (nulled variants dropped, defaults set) and returns it. ``overrides``: what the
    command line merged into it; ``check_shapes``: quantize a stand-in per (format, K), the costly check
    (a job re-parsing the workflow on a node reads the config its planner already checked); ``root``: what
    relative result folders (report.compare_with) are relative to, default the working directory."""
    load_all()
    check_overrides(overrides or {})
    drop_nulled_variants(cfg)
    schema = yaml.safe_load(SCHEMA.read_text())
    validator = _strict_types()(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: [str(p) for p in e.path])
    if errors:
        raise ConfigError(*(f"{_key(e.path) or '(top level)'}: {_schema_message(e)}" for e in errors))
    check_shape_names(cfg)
    class_names = check_shape_classes(cfg)
    for name, vcfg in cfg["variants"].items():
        impl = vcfg.get("uses", name)
        if impl not in VARIANTS:
            key = f"variants.{name}.uses" if "uses" in vcfg else f"variants.{name}"
            raise ConfigError(f"{key}: unknown variant {impl!r}; known: {', '.join(sorted(VARIANTS))}")
        check_tolerance(name, vcfg, VARIANTS[impl])
        check_tiles(cfg, name, impl, class_names)
        # a target nothing checks would compile "ok" whatever instructions it got (issue 9)
        for target in unchecked_targets(VARIANTS[impl], cfg["targets"]):
            site = registration_sites()[impl].rpartition(":")[0]
            raise ConfigError(f"variants.{name}: target {target} has no instruction check ({site} "
                              "Variant.sass and Variant.instructions) and no declared unsupported reason")
    check_zoo(cfg)
    check_targets(cfg)
    check_timing(cfg)
    check_cpu_memory(cfg)
    check_compare_with(cfg, root)
    if check_shapes:
        check_shapes_fit_formats(cfg)
    cfg.setdefault("tilelang_cache", ".cache/tilelang")
    return cfg


def check_zoo(cfg: dict) -> None:
    """Zoo entries (``zoo.entries`` and a layer's own ``entries``) are config entries (a registered variant the
    config does not run is skipped), not library peers, and run the zoo's distributions."""
    zoo = cfg.get("zoo")
    if not zoo:
        return
    lists = [("zoo.entries", zoo["entries"])] + [(f"zoo.layers.{j}.entries", layer["entries"])
                                                 for j, layer in enumerate(zoo["layers"]) if "entries" in layer]
    for where, entries in lists:
        for i, entry in enumerate(entries):
            if entry not in cfg["variants"]:
                if entry in VARIANTS:  # a config that drops the variant (variants: {name: null}) drops its zoo
                    continue
                raise ConfigError(f"{where}.{i}: {entry!r} is not a config entry (variants: {', '.join(cfg['variants'])})")
            if VARIANTS[cfg["variants"][entry].get("uses", entry)].family == "baseline":
                raise ConfigError(f"{where}.{i}: {entry} is a library peer; list the variants, their peers come with them")
            missing = set(zoo["distributions"]) - set(cfg["variants"][entry].get("distributions") or cfg["distributions"])
            if missing:
                raise ConfigError(f"zoo.distributions: {entry} ({where}.{i}) does not run {sorted(missing)}")


def _zoo_layer_shapes(cfg: dict):
    """(shape, layer) for every layer of the config's zoo at each of its M, in config order."""
    for layer in (cfg.get("zoo") or {}).get("layers", []):
        for M in layer["M"]:
            yield f"{M}x{layer['N']}x{layer['K']}", layer


def zoo_layers(cfg: dict) -> dict[str, list[str]]:
    """{shape: ["<model> <layer>", ...]} of the config's zoo (a shape two layers share lists both)."""
    out: dict[str, list[str]] = {}
    for shape, layer in _zoo_layer_shapes(cfg):
        name = f"{layer['model']} {layer['layer']}"
        names = out.setdefault(shape, [])
        names += [name] if name not in names else []  # one layer listed twice, for two sets of entries
    return out


def zoo_layer_entries(cfg: dict) -> dict[str, list[str]]:
    """{shape: [entry, ...]}: the config entries that time each zoo shape, a layer's own ``entries`` or else
    ``zoo.entries`` (a shape two layers share: both lists, in config order); their peers come with them."""
    out: dict[str, list[str]] = {}
    for shape, layer in _zoo_layer_shapes(cfg):
        have = out.setdefault(shape, [])
        have += [e for e in layer.get("entries", cfg["zoo"]["entries"]) if e not in have]
    return out


def check_tolerance(name: str, vcfg: dict, variant) -> None:
    """Exactly the tolerances the entry is judged by (harness/metrics.py gated_metrics; values: the schema's
    positive numbers): a missing one would switch its gating off."""
    wanted = gated_metrics(variant)
    given = vcfg["tolerance"]
    for key in wanted:
        if key not in given:
            raise ConfigError(f"variants.{name}.tolerance.{key}: missing; {name} results are gated on "
                              f"{', '.join(wanted)} (a metric without a tolerance would pass any error)")
    for key in given:
        if key not in wanted:
            raise ConfigError(f"variants.{name}.tolerance.{key}: not a metric {name} results are gated on "
                              f"(only {', '.join(wanted)}); remove it")


def _shape_lists(cfg: dict):
    """(key, shapes) of every shape list in the config."""
    for kind, shapes in cfg["sweeps"].items():
        yield f"sweeps.{kind}", shapes
    for name, vcfg in cfg["variants"].items():
        for kind, shapes in vcfg.get("shapes", {}).items():
            yield f"variants.{name}.shapes.{kind}", shapes
    for section, field in (("pairing", "aa_shapes"), ("sustained", "shapes")):
        if field in cfg["timing"].get(section, {}):
            yield f"timing.{section}.{field}", cfg["timing"][section][field]


def check_shape_names(cfg: dict) -> None:
    """Every shape in its one spelling (a shape is a file name and a key of every table)."""
    for key, shapes in _shape_lists(cfg):
        for i, shape in enumerate(shapes):
            try:
                parse_shape(shape)
            except ValueError as e:
                raise ConfigError(f"{key}.{i}: {e}") from None


# CPU emulation (harness/runner.py run_emulated), bytes per element, at its peak: A and B in fp32 and the
# quantized operands (<= 4 bytes each), float64 copies of A and B (or their dequantized forms) while a
# reference product is formed: 16 per element of A and B. Per output: the two float64 references (16),
# the emulated output and its float64 copy (<= 16), the metrics' float64 temporaries (16), an integer
# family's int64 exactness check (16): 64. An estimate, on the high side.
EMULATION_BYTES_PER_INPUT = 16
EMULATION_BYTES_PER_OUTPUT = 64
CPU_MEMORY_GIB = 16  # default of cpu_memory_gib: fixed, so that a config is valid on every host alike


def emulation_peak_bytes(M: int, N: int, K: int) -> int:
    return EMULATION_BYTES_PER_INPUT * (M * K + N * K) + EMULATION_BYTES_PER_OUTPUT * M * N


def check_cpu_memory(cfg: dict) -> None:
    """Every CPU shape's emulation within cpu_memory_gib (a CPU job holds one point at a time)."""
    limit = cfg.setdefault("cpu_memory_gib", CPU_MEMORY_GIB)
    for name, vcfg in cfg["variants"].items():
        own = vcfg.get("shapes", {}).get("cpu")
        for i, shape in enumerate(own or cfg["sweeps"]["cpu"]):
            need = emulation_peak_bytes(*parse_shape(shape))
            if need > limit * 2**30:
                key = f"variants.{name}.shapes.cpu.{i}" if own else f"sweeps.cpu.{i}"
                raise ConfigError(f"{key}: shape {shape}: its CPU emulation needs about {need / 2**30:.1f} GiB "
                                  f"(harness/plan.py emulation_peak_bytes), more than cpu_memory_gib {limit}; use a "
                                  "smaller shape (the CPU sweep checks numerics; the GPU sweep is for size)")


def check_compare_with(cfg: dict, root: Path | str | None = None) -> None:
    """Each compare_with entry an existing result set (a published folder with points/, or a collected one with
    tidy.parquet and compile_matrix.csv), relative to ``root`` (default: the working directory, the workflow's).
    A reference is read, never made: a missing one would otherwise plan its platform's whole run."""
    root = Path.cwd() if root is None else Path(root)
    for i, folder in enumerate(cfg["report"]["compare_with"]):
        where = root / folder
        if reference_files(where):
            continue
        got = "does not exist" if not where.exists() else "holds neither points/<family>/*.json nor tidy.parquet and compile_matrix.csv"
        raise ConfigError(f"report.compare_with.{i}: {folder} {got}. A reference is an existing result set: a published "
                          "folder (results/published/<platform>, made by publishing a family: snakemake "
                          "results/published/<platform>/points/<family>) or a finished run (results/<platform>, made by "
                          "snakemake results/<platform>/tidy.parquet with that platform in run_on); or remove the entry")


def reference_signature(folders: list[str], root: Path | str | None = None, also=lambda folder: []) -> dict[str, str]:
    """{file: sha256} of every file the report reads of the reference sets (their points or tables, and
    ``also(folder)``, e.g. their profile summaries): for the report rule's params, not its input. As input, a
    collected set's results/<platform>/tidy.parquet is the collect rule's output, so Snakemake would plan
    that platform's whole run to remake it; as params, a changed reference still reruns the report
    (Snakemake's params rerun trigger) and nothing else is planned."""
    import hashlib

    root = Path.cwd() if root is None else Path(root)
    return {str(Path(f).relative_to(root)): hashlib.sha256(Path(f).read_bytes()).hexdigest()
            for d in folders for f in [*reference_files(root / d), *also(root / d)]}


def published_points(folder: Path | str) -> list[str]:
    """Every committed point file of a published folder (points/<family>/, one per family refresh)."""
    root = Path(folder) / "points"
    return sorted(str(p) for p in root.glob("*/**/*.json")) if root.is_dir() else []


def reference_files(folder: Path | str) -> list[str]:
    """The files a report reads of a reference result set that exist now: its published points, else its
    collected tables; [] when it has neither."""
    folder = Path(folder)
    points = published_points(folder)
    if points:
        return points
    tables = [folder / f for f in ("tidy.parquet", "compile_matrix.csv")]
    return [str(t) for t in tables] if all(t.is_file() for t in tables) else []


def check_tiles(cfg: dict, name: str, impl: str, class_names: list[str]) -> None:
    """A TileLang entry has tiles, a library baseline none; per-class tiles name every class; each tile is
    canonically spelled, listed once, one the variant's kernel takes, and fits each target it compiles for."""
    variant = VARIANTS[impl]
    tiles = cfg["variants"][name].get("tiles", {})
    if variant.kernel is None and tiles:
        raise ConfigError(f"variants.{name}.tiles: {name} is a library baseline and takes no tiles")
    if variant.kernel is not None and not tiles and variant.tile_space is None:
        raise ConfigError(f"variants.{name}.tiles: a TileLang variant whose kernel has no tile space "
                          "(kernels/tile_space.py) needs at least one tile")
    for target, names in tiles.items():
        key = f"variants.{name}.tiles.{target}"
        if target != "default" and target not in cfg["targets"]:
            raise ConfigError(f"{key}: not one of targets {cfg['targets']}")
        # the targets this list is compiled for: "default" covers those not listed; a declared unsupported
        # target compiles nothing (its record says why)
        archs = [t for t in (cfg["targets"] if target == "default" else [target])
                 if (target != "default" or t not in tiles) and t not in variant.unsupported]
        if isinstance(names, dict):  # per shape class: every class, and only classes
            missing, unknown = sorted(set(class_names) - set(names)), sorted(set(names) - set(class_names))
            if missing or unknown:
                raise ConfigError(f"{key}: tiles per shape class must name every class of shape_classes {class_names}"
                                  + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
        for where, ts in ([(f"{key}.{c}", ts) for c, ts in names.items()] if isinstance(names, dict) else [(key, names)]):
            for i, t in enumerate(ts):
                # twice in one list: two compile rows and, on a GPU, two run rows of one tile (collect refuses)
                if t in ts[:i]:
                    raise ConfigError(f"{where}.{i}: tile {t} is listed twice (also at {where}.{ts.index(t)}); "
                                      "list each tile once")
                try:
                    tile = parse_tile(t)
                except ValueError as e:
                    raise ConfigError(f"{where}.{i}: {e}") from None
                problem = tile_problem(variant, tile)
                for arch in archs if not problem else []:
                    try:
                        problem = smem_problem(f"tile {t} on {arch}", kernel_smem_bytes(variant.kernel, tile), arch)
                    except KeyError as e:
                        problem = e.args[0]
                    except ValueError as e:  # a tile the kernel's layout arithmetic refuses
                        problem = str(e)
                    if problem:
                        break
                if problem:
                    raise ConfigError(f"{where}: {problem}")


# The order in which a host's cores take the CPU jobs (Snakemake's rule priorities: inputs.smk, compile.smk), from
# the GPU's queue: the GPU's jobs come first (GPU_PRIORITY: run.smk, tune.smk); the GPU run jobs are queued greedily,
# next the one whose CPU jobs (input builds, and a TileLang variant's sweep compiles) not already queued have the
# fewest estimated seconds (Plan.gpu_queue: the library peers, which need inputs only, come first, cheapest first);
# each input build and sweep compile takes the place of the first queued run job that needs it (QUEUED tier, earlier
# places higher, longest first within a place); CPU jobs no planned GPU job needs (a CPU-only run's inputs) follow,
# then the compile checks of every target, which only the final tables need, each longest first, which packs the
# cores best and leaves short jobs to end a tier. So the GPU's next job is ready as soon as the cores can make it:
# an H100 host's run (1836053, default config) with every input before every compile, each tier longest first, left
# its GPU idle 30 s waiting for the first library job's inputs, then 54 s while the cores built the inputs of the
# W4A16 shapes before those of the next library jobs; its job times replayed under its DAG on 16 cores: the report
# at 560 s that way, 506 s in the GPU's queue order (GPU idle 85 s -> 31 s). Estimated seconds (one thread, every
# core busy: 5-15 s per TileLang kernel; an input job 40 s at 8192³ with its 8 formats) set the order only, never
# what a job does.
KERNEL_COMPILE_S = 8.0
INPUT_S_PER_GELEMENT = 30.0
CHECK_PRIORITY, UNQUEUED_PRIORITY, QUEUED_PRIORITY, QUEUED_TOP = 0, 15, 20, 45
_TIERS = (CHECK_PRIORITY, UNQUEUED_PRIORITY, QUEUED_PRIORITY, QUEUED_TOP)
# GPU jobs take one GPU each (resource gpu=1), so among them the priority orders the GPU's queue: a library whose
# prepare compiles per shape (Variant.prepare_compiles) goes when no other GPU job is ready, filling a wait for
# compiles, or at the end, when the host's cores are free and its compiles quicker
GPU_PRIORITY = 50


def run_priority(variant) -> int:
    """A run job's priority (``variant``: a kernels.registry.Variant)."""
    return GPU_PRIORITY - 1 if variant.prepare_compiles else GPU_PRIORITY


def longest_first(seconds: float, base: int) -> float:
    """A CPU job's priority: its tier ``base`` (UNQUEUED_PRIORITY or CHECK_PRIORITY) plus its estimated seconds,
    scaled to stay below the next tier up."""
    ceiling = next(t for t in _TIERS if t > base) - base
    return base + ceiling * seconds / (seconds + 100.0)


def queued_priority(place: int, places: int, seconds: float) -> float:
    """The priority of a CPU job the ``place``-th (from 0) of ``places`` queued GPU run jobs is the first to need:
    earlier places higher, all within the QUEUED tier, longest first within a place."""
    step = (QUEUED_TOP - QUEUED_PRIORITY) / places
    return QUEUED_TOP - step * (place + 1) + 0.5 * step * seconds / (seconds + 100.0)


PAIRING_DEFAULTS = {"target_halfwidth": 0.005, "same_within": 0.005, "min_rounds": 30, "max_rounds": 400, "aa_shapes": []}
SUSTAINED_DEFAULTS = {"shapes": [], "min_settle_s": 1.0, "max_settle_s": 5.0}


def check_timing(cfg: dict) -> None:
    """Paired timing's bounds in order and its defaults filled in. Sustained and A/A shapes apply where an
    entry times them: a config that overrides the sweeps keeps the default lists without an error."""
    timing = cfg["timing"]
    pairing = timing["pairing"] = PAIRING_DEFAULTS | timing.get("pairing", {})
    sustained = timing["sustained"] = SUSTAINED_DEFAULTS | timing.get("sustained", {})
    if pairing["min_rounds"] > pairing["max_rounds"]:
        raise ConfigError(f"timing.pairing.min_rounds: {pairing['min_rounds']} is more than max_rounds "
                          f"{pairing['max_rounds']}")
    if sustained["min_settle_s"] > sustained["max_settle_s"]:
        raise ConfigError(f"timing.sustained.min_settle_s: {sustained['min_settle_s']} is more than max_settle_s "
                          f"{sustained['max_settle_s']}")



def check_shape_classes(cfg: dict) -> list[str]:
    """Unique names, and a last class without bounds, so every shape has a class; returns the names."""
    classes = cfg.setdefault("shape_classes", [{"name": "any"}])
    names = [c["name"] for c in classes]
    if len(set(names)) != len(names):
        raise ConfigError(f"shape_classes: names must be unique, got {names}")
    if set(classes[-1]) != {"name"}:
        raise ConfigError(f"shape_classes: the last class ({names[-1]}) must have no bounds, so that every shape "
                          "falls in some class")
    for j, later in enumerate(classes):
        for i, earlier in enumerate(classes[:j]):
            if _covers(earlier, later):
                raise ConfigError(f"shape_classes.{j}: class {later['name']} never matches: every shape within its bounds "
                                  f"is within those of {earlier['name']} (shape_classes.{i}), listed before it, and the "
                                  f"first match wins; list {later['name']} before {earlier['name']}, or remove it")
    return names


def _covers(earlier: dict, later: dict) -> bool:
    """Whether every shape of class ``later`` is also in ``earlier``: each bound of ``earlier`` holds at the
    largest value ``later`` allows (M <= M*N, N <= M*N, M*N <= M_max*N_max, as M, N >= 1)."""
    inf = math.inf
    M = min(later.get("M_max", inf), later.get("MN_max", inf))
    N = min(later.get("N_max", inf), later.get("MN_max", inf))
    most = {"M_max": M, "N_max": N, "K_max": later.get("K_max", inf), "MN_max": min(later.get("MN_max", inf), M * N)}
    return all(most[b] <= earlier[b] for b in SHAPE_BOUNDS if b in earlier)


def check_shapes_fit_formats(cfg: dict) -> None:
    """Quantize a small stand-in per (format, K) now, so that a shape a format cannot take (K not a
    multiple of its group, odd K for int4 packing) is refused before any job runs."""
    import torch

    verdict = {}
    zoo_timers = zoo_layer_entries(cfg)
    for name, vcfg in cfg["variants"].items():
        variant = VARIANTS[vcfg.get("uses", name)]
        fmt = variant.input_format
        # the compile check builds every TileLang kernel at the cpu_compile shapes too
        kinds = ("cpu", "gpu", "cpu_compile") if variant.kernel is not None else ("cpu", "gpu")
        zoo = [s for s, entries in zoo_timers.items() if name in entries]
        for kind in (*kinds, "zoo") if zoo else kinds:
            own = zoo if kind == "zoo" else vcfg.get("shapes", {}).get(kind)
            for shape in own or cfg["sweeps"][kind]:
                K = parse_shape(shape)[2]
                if (fmt, K) not in verdict:
                    try:
                        FORMATS[fmt].quantize(torch.zeros(128, K), torch.zeros(128, K))
                        verdict[fmt, K] = None
                    except (ValueError, TypeError) as e:
                        verdict[fmt, K] = str(e)
                if verdict[fmt, K]:
                    where = "zoo.layers" if kind == "zoo" else f"variants.{name}.shapes.{kind}" if own else f"sweeps.{kind}"
                    raise ConfigError(f"{where}: shape {shape} does not fit {name} (format {fmt}): {verdict[fmt, K]}")


def resolve_auto(platforms: dict) -> str:
    """What ``auto`` means: this planning host's platform, "cpu" without a GPU, else the one catalogue
    entry whose ``match`` fits the GPU's name. Resolved once by the planning process and handed to
    every job it spawns (environment variable LPGEMM_AUTO_PLATFORM, which sbatch and the local
    executor pass on), so a job re-parsing the workflow on another node plans exactly the same DAG."""
    if os.environ.get(AUTO_ENV):
        return os.environ[AUTO_ENV]
    gpu = detect_gpu()
    if gpu is None:
        slug = "cpu"
    else:
        found = matching_platforms(gpu["gpu_name"], platforms)
        if len(found) != 1:
            why = "matches no entry" if not found else f"matches several ({', '.join(found)})"
            raise ConfigError(f"run_on: auto: this host's GPU {gpu['gpu_name']!r} {why} of platforms.*.match; add (or "
                              "narrow) its entry in config platforms, or name the platforms to run in run_on")
        slug = found[0]
    os.environ[AUTO_ENV] = slug
    return slug


def resolve_run_on(cfg: dict) -> list[str]:
    """The platforms to plan, in order: ``auto`` resolved, every other entry "cpu" or a catalogue slug."""
    out = []
    for i, p in enumerate(cfg["run_on"]):
        if p == "auto":
            p = resolve_auto(cfg["platforms"])
        elif p != "cpu" and p not in cfg["platforms"]:
            raise ConfigError(f"run_on.{i}: unknown platform {p!r}; known: auto, cpu, " + ", ".join(cfg["platforms"]))
        if p not in out:
            out.append(p)
    return out


def kind(platform: str) -> str:
    """"cpu" (emulation, CPU sweep) or "gpu" (timed, GPU sweep)."""
    return "cpu" if platform == "cpu" else "gpu"


def sweep_record(variant: str, arch: str, tile: str) -> str:
    return f"results/compile/{variant}/{arch}/sweep/{tile}.json"


def tune_record(platform: str, entry: str, shape: str) -> str:
    return f"results/{platform}/tuning/{entry}/{shape}.json"


def kept_tune_path(platform: str, entry: str, shape: str) -> str:
    """Where a tune job keeps each shape it finished until the whole job has: outside its outputs, which
    snakemake deletes when a job stops part-way, so that the job's next run times only the rest."""
    return f"results/logs/{platform}/tuning/kept/{entry}/{shape}.json"


class Plan:
    """What a validated config plans: the platforms to run, each entry's shapes, tiles and outputs.
    Constructing it resolves ``run_on`` and checks every planned platform's catalogue entry."""

    def __init__(self, config: dict):
        self.config = config
        self.run_on = resolve_run_on(config)
        self.targets = config["targets"]
        self.entries = list(config["variants"])
        self.dists = config["distributions"]
        self.families = sorted({self.impl(v).family for v in self.entries} - {"baseline"})
        for platform in self.run_on:
            self.run_arch(platform)  # a planned platform must be complete before anything runs
        self.selection = config.setdefault("tile_selection", {})
        self.selection.setdefault("model_picks", 1)
        self.selection.setdefault("tune_candidates", 4)
        self._choices: dict = {}
        self._models: dict = {}
        self._zoo_layers = zoo_layers(config)
        self._zoo_timers = self._timing_the_zoo()
        self._zoo_entries = [e for e in self.entries if self.zoo_shapes(e)]

    # ------------------------------------------------------------ the shape zoo
    def zoo_layers(self) -> dict[str, list[str]]:
        """{shape: ["<model> <layer>", ...]} of the zoo (config ``zoo``)."""
        return self._zoo_layers

    def zoo_entries(self) -> list[str]:
        """The entries that time zoo shapes beyond their sweeps: the config's zoo entries (``zoo.entries`` and the
        layers' own) and entries of their peers."""
        return self._zoo_entries

    def _timing_the_zoo(self) -> dict[str, set[str]]:
        """{shape: entries}: per zoo shape, the entries listed for it (``zoo_layer_entries``) that the plan runs,
        and for each of their peers one entry running that registered variant (the one ``peer_entry`` pairs
        with): one whose sweep has the shape already, else the first."""
        running: dict[str, list[str]] = {}  # registered variant -> the entries running it, in config order
        for e in self.entries:
            running.setdefault(self.impl(e).name, []).append(e)
        out = {}
        for shape, listed in zoo_layer_entries(self.config).items():
            own = {e for e in listed if e in self.entries}
            peers = {b for e in own for b in (self.impl(e).baseline, self.impl(e).second_baseline) if b in running}
            for peer in peers:
                own.add(next((e for e in running[peer] if shape in self.variant_shapes(e, "gpu")), running[peer][0]))
            out[shape] = own
        return out

    def zoo_shapes(self, entry: str) -> list[str]:
        """The zoo shapes an entry times beyond its own GPU sweep ([] if it does not time the zoo)."""
        sweep = set(self.variant_shapes(entry, "gpu"))
        return [s for s in self._zoo_layers if entry in self._zoo_timers[s] and s not in sweep]

    def zoo_dists(self, entry: str) -> list[str]:
        return [d for d in self.config.get("zoo", {}).get("distributions", []) if d in self.variant_dists(entry)] \
            if self.zoo_shapes(entry) else []

    def gpu_shapes(self, entry: str, dist: str | None = None) -> list[str]:
        """Every GPU shape an entry times (at ``dist``; None: at any of its distributions): its sweep and its zoo."""
        zoo = self.zoo_shapes(entry) if dist is None or dist in self.zoo_dists(entry) else []
        return self.variant_shapes(entry, "gpu") + zoo

    # ------------------------------------------------------------ tile selection (harness/selection.py)
    def selects(self, entry: str, target: str) -> bool:
        """Whether an entry's tiles on ``target`` are selected (tuned or modelled), not listed: its kernel has
        a tile space for the target and the config lists no tiles for that target by name."""
        v = self.impl(entry)
        listed = self.config["variants"][entry].get("tiles", {})
        return v.tile_space is not None and v.tile_space.covers(v, target) and target not in listed

    def reference_platform(self, arch: str) -> str | None:
        """The platform a plan selects ``arch``'s tiles for when no GPU platform of it is planned (the
        compile check): the first planned one of that arch, else the catalogue's first."""
        for p in [*self.run_on, *self.config["platforms"]]:
            if p != "cpu" and self.config["platforms"].get(p, {}).get("arch") == arch:
                return p
        return None

    def platform_model(self, platform: str):
        """The cost model of a platform, with the constants fitted to its measurements when the committed
        table has them (results/published/<platform>/tuning/calibration.json)."""
        from harness.selection import PlatformModel, load_calibration

        if platform not in self._models:
            self._models[platform] = PlatformModel.from_config(platform, self.config["platforms"][platform],
                                                               load_calibration(platform))
        return self._models[platform]

    def choice(self, entry: str, platform: str, shape: str):
        """The tiles an entry runs at a shape on a GPU platform, and where they come from (harness/selection.py)."""
        from harness.selection import Choice, model_picks, tuned

        key = (entry, platform, shape)
        if key not in self._choices:
            spec = self.config["platforms"][platform]
            v = self.impl(entry)
            rec, path, why = tuned(platform, entry, v.name, shape, spec["arch"], spec["match"])
            if rec is not None:
                self._choices[key] = Choice([rec["winner"]], "tuned", record=path)
            else:
                picks = model_picks(v, shape, self.platform_model(platform), self.selection["model_picks"])
                self._choices[key] = Choice(picks, "model", why)
        return self._choices[key]

    def tune_candidates(self, entry: str, platform: str, shape: str) -> list[tuple[str, float]]:
        """(tile, predicted µs) of the model's best ``tune_candidates`` tiles for one shape, one per configuration:
        where a tile space offers several ring depths of one tile (a kernel of resident CTAs), the model's best depth
        stands for them, so that the tune times different tiles rather than depths of one."""
        from dataclasses import replace

        from harness.selection import rank

        picked, seen = [], set()
        for t, us in rank(self.impl(entry), *parse_shape(shape), self.platform_model(platform)):
            if (config := replace(t, num_stages=0)) not in seen:
                seen.add(config)
                picked.append((t.name, round(us, 3)))
            if len(picked) == self.selection["tune_candidates"]:
                break
        return picked

    def tune_entries(self, platform: str) -> list[str]:
        """The entries a platform tunes: TileLang entries whose tiles on its arch are selected."""
        arch = self.run_arch(platform)
        return [e for e in self.entries if arch and self.is_tilelang(e) and self.selects(e, arch)]

    def tune_points(self, entry: str) -> list[tuple[str, str]]:
        """(shape, distribution) of every GPU shape a tune job of the entry times: the inputs of its first
        distribution that has that shape (tiles do not depend on the values)."""
        out = [(s, self.variant_dists(entry)[0]) for s in self.variant_shapes(entry, "gpu")]
        return out + [(s, self.zoo_dists(entry)[0]) for s in self.zoo_shapes(entry)]

    def tune_outputs(self, platform: str, entries=None) -> list[str]:
        tunable = self.tune_entries(platform)
        return [tune_record(platform, e, s) for e in (entries or tunable) if e in tunable for s, _ in self.tune_points(e)]

    def impl(self, entry: str):
        """The registered variant a config entry runs (entries may reuse one under another sweep)."""
        return VARIANTS[self.config["variants"][entry].get("uses", entry)]

    def is_tilelang(self, entry: str) -> bool:
        return self.impl(entry).kernel is not None

    def platform_spec(self, platform: str) -> dict:
        """A GPU platform's catalogue entry, checked for what planning it needs; every message names the key."""
        spec = self.config["platforms"].get(platform)
        if spec is None:
            raise ConfigError(f"platforms.{platform}: not in the catalogue (known: {', '.join(self.config['platforms'])}); "
                              f"results/{platform}/ cannot be planned")
        if spec["arch"] not in self.targets:
            raise ConfigError(f"platforms.{platform}.arch: {spec['arch']} is not one of targets {self.targets}; "
                              f"add it there to run on {platform}")
        if spec.get("cluster_sms", 0) > spec["sms"]:
            raise ConfigError(f"platforms.{platform}.cluster_sms: {spec['cluster_sms']} is more than its sms "
                              f"({spec['sms']}); clusters fill at most every SM")
        for entry in self.entries:
            precision = self.impl(entry).precision
            if precision not in spec["peak"]:
                raise ConfigError(f"platforms.{platform}.peak.{precision}: missing, and variants.{entry} is bounded by "
                                  f"it (null if {platform} has no tensor-core path)")
        return spec

    def run_arch(self, platform: str) -> str | None:
        return None if platform == "cpu" else self.platform_spec(platform)["arch"]

    def variant_shapes(self, entry: str, kind: str) -> list[str]:
        return self.config["variants"][entry].get("shapes", {}).get(kind) or self.config["sweeps"][kind]

    def variant_dists(self, entry: str) -> list[str]:
        return self.config["variants"][entry].get("distributions") or self.dists

    def _target_tiles(self, entry: str, target: str):
        tiles = self.config["variants"][entry].get("tiles", {})
        return tiles.get(target) or tiles.get("default", [])

    def tiles_for(self, entry: str, target: str) -> list[str]:
        """Every tile an entry has for a target, over all shape classes (in config order, once each): what
        its compile check builds. A selected entry builds its listed ``default`` tiles, so that the check does
        not move with the model's calibration; without any, its selected tiles at the compile-check shapes."""
        listed = self.config["variants"][entry].get("tiles", {})
        if self.selects(entry, target) and not listed.get("default"):
            return list(dict.fromkeys(t for s in self.config["sweeps"]["cpu_compile"]
                                      for t in self.tiles_for_shape(entry, target, s)))
        tiles = self._target_tiles(entry, target)
        return list(dict.fromkeys(t for ts in tiles.values() for t in ts)) if isinstance(tiles, dict) else tiles

    def tiles_for_shape(self, entry: str, target: str, shape: str, platform: str | None = None) -> list[str]:
        """The tiles an entry runs at one shape on a target: selected (``choice`` on ``platform``, default the
        target's reference platform), or listed: its shape class's, or the one list for all shapes."""
        if self.selects(entry, target):
            return self.choice(entry, platform or self.reference_platform(target), shape).tiles
        tiles = self._target_tiles(entry, target)
        if isinstance(tiles, dict):
            return tiles[shape_class(*parse_shape(shape), self.config["shape_classes"])]
        return tiles

    def check_compile_jobs(self, entry: str) -> list[tuple[str, str, list[str]]]:
        """(target, tile, shapes) per kernel of an entry's compile-check job: every target, every tile, at
        the sweeps.cpu_compile shapes (a cross-compile does not depend on the host), K raised to the tile's
        whole K blocks per CTA where it needs more (``tiles.compile_check_shape``: a split tile)."""
        def shapes(tile: str) -> list[str]:
            return list(dict.fromkeys(compile_check_shape(s, parse_tile(tile)) for s in self.config["sweeps"]["cpu_compile"]))
        return [(t, tile, shapes(tile)) for t in self.targets for tile in self.tiles_for(entry, t)]

    def gpu_platforms(self, target: str) -> list[str]:
        """The planned GPU platforms of an arch (its reference platform when none is planned)."""
        planned = [p for p in self.run_on if p != "cpu" and self.run_arch(p) == target]
        return planned or [p for p in [self.reference_platform(target)] if p]

    def shape_tiles(self, entry: str, target: str) -> dict[str, list[str]]:
        """{GPU shape: tiles} of an entry on a target, over its planned platforms of that arch."""
        return {s: list(dict.fromkeys(t for p in self.gpu_platforms(target) for t in self.tiles_for_shape(entry, target, s, p)))
                for s in self.gpu_shapes(entry)}

    def sweep_shapes(self, entry: str, target: str, tile: str) -> list[str]:
        """The GPU shapes a tile is compiled at and run on: those where the entry runs it (listed or selected)."""
        return [s for s, tiles in self.shape_tiles(entry, target).items() if tile in tiles]

    def sweep_tiles(self, entry: str, target: str) -> list[str]:
        return list(dict.fromkeys(t for tiles in self.shape_tiles(entry, target).values() for t in tiles))

    def input_formats(self, shape: str) -> list[str]:
        """Every input format some entry needs at this shape, on any host kind (one inputs job writes them all)."""
        return sorted({self.impl(v).input_format for v in self.entries
                       if shape in self.variant_shapes(v, "cpu") or shape in self.gpu_shapes(v)})

    def input_sets(self) -> dict[str, tuple[tuple[str, ...], list[str]]]:
        """{name: (formats, shapes)} for the build_inputs_<name> rules: the shapes of every sweep grouped by
        the formats they need. The name lists the families of those formats' variants (a number is added
        should two sets share it)."""
        shapes = [s for v in self.entries for s in self.variant_shapes(v, "cpu") + self.gpu_shapes(v)]
        groups: dict[tuple[str, ...], list[str]] = {}
        for shape in dict.fromkeys(shapes):
            groups.setdefault(tuple(self.input_formats(shape)), []).append(shape)
        sets = {}
        for formats, members in groups.items():
            name = "_".join(sorted({self.impl(v).family for v in self.entries if self.impl(v).input_format in formats}))
            unique, n = name, 2
            while unique in sets:
                unique, n = f"{name}_{n}", n + 1
            sets[unique] = (formats, members)
        return sets

    # ------------------------------------------------------------ what the scheduler runs first (module note above)
    def input_seconds(self, shape: str) -> float:
        """An input job's estimated seconds: its operands' elements (M·K + N·K) written once in fp32 and once per
        format it makes."""
        M, N, K = parse_shape(shape)
        return INPUT_S_PER_GELEMENT * (M * K + N * K) * (1 + len(self.input_formats(shape))) / 1e9

    def sweep_compile_seconds(self, entry: str, target: str, tile: str) -> float:
        """A sweep compile job's estimated seconds: one kernel per shape it builds the tile at."""
        return KERNEL_COMPILE_S * len(self.sweep_shapes(entry, target, tile))

    def check_compile_seconds(self, entry: str) -> float:
        """A compile check job's estimated seconds: one kernel per (target, tile, shape) it builds."""
        return KERNEL_COMPILE_S * sum(len(shapes) for _, _, shapes in self.check_compile_jobs(entry))

    def cpu_job_seconds(self, job: tuple) -> float:
        """The estimated seconds of an input build ("inputs", dist, shape) or sweep compile ("sweep", entry, arch,
        tile)."""
        return self.input_seconds(job[2]) if job[0] == "inputs" else self.sweep_compile_seconds(*job[1:])

    @functools.cached_property
    def gpu_queue(self) -> list[frozenset]:
        """The planned GPU run jobs in the order their CPU jobs are queued (module note above), each as the set of
        CPU jobs it needs: ("inputs", dist, shape) and ("sweep", entry, arch, tile). Greedy: next the job whose
        CPU jobs not yet queued have the fewest estimated seconds (ties: config order). Empty where no GPU
        platform is planned."""
        runs = []
        for platform in self.run_on:
            arch = self.run_arch(platform)
            if arch is None:
                continue
            for e in self.entries:
                compiles = {("sweep", e, arch, t) for t in self.sweep_tiles(e, arch)} if self.is_tilelang(e) else set()
                sets = [(d, self.variant_shapes(e, "gpu")) for d in self.variant_dists(e)]
                sets += [(d, self.zoo_shapes(e)) for d in self.zoo_dists(e) if self.zoo_shapes(e)]
                runs += [frozenset({("inputs", d, s) for s in shapes} | compiles) for d, shapes in sets]

        seconds = {job: self.cpu_job_seconds(job) for job in set().union(*runs)}
        queue, queued = [], set()
        while runs:
            best = min(range(len(runs)), key=lambda i: sum(seconds[j] for j in runs[i] - queued))
            queue.append(runs.pop(best))
            queued |= queue[-1]
        return queue

    @functools.cached_property
    def _queue_places(self) -> dict[tuple, int]:
        places = {}
        for place, needs in enumerate(self.gpu_queue):
            for job in needs:
                places.setdefault(job, place)
        return places

    def cpu_priority(self, job: tuple, seconds: float) -> float:
        """An input build's ("inputs", dist, shape) or sweep compile's ("sweep", entry, arch, tile) priority: by the
        place of the first queued GPU run job that needs it (``queued_priority``), else longest first below them."""
        place = self._queue_places.get(job)
        if place is None:
            return longest_first(seconds, UNQUEUED_PRIORITY)
        return queued_priority(place, len(self.gpu_queue), seconds)

    def run_outputs(self, platform: str, entries=None) -> list[str]:
        """Every run file of a platform (of ``entries``): each entry's sweep, and on a GPU platform its zoo."""
        sweep = [f"results/{platform}/{v}/{d}/{s}.json" for v in (entries or self.entries) for d in self.variant_dists(v)
                 for s in self.variant_shapes(v, kind(platform))]
        zoo = [f"results/{platform}/{v}/{d}/{s}.json" for v in (entries or self.entries) for d in self.zoo_dists(v)
               for s in self.zoo_shapes(v)] if kind(platform) == "gpu" else []
        return sweep + zoo

    def compile_outputs(self, platform: str, entries=None) -> list[str]:
        """The compile records of a platform's report (of ``entries``, default all): every target's check
        compile, and on a GPU platform its own arch's kernels at the shapes it runs."""
        tilelang = [v for v in (entries or self.entries) if self.is_tilelang(v)]
        check = [f"results/compile/{v}/{t}/{tile}.json" for v in tilelang for t in self.targets for tile in self.tiles_for(v, t)]
        arch = self.run_arch(platform)
        return check + ([sweep_record(v, arch, tile) for v in tilelang for tile in self.sweep_tiles(v, arch)] if arch else [])

    def family_entries(self, family: str) -> list[str]:
        """A family's points: its own config entries and every entry of a peer (matched or second baseline)
        of one of them that shares a GPU shape with them; one family refresh measures exactly these."""
        own = [e for e in self.entries if self.impl(e).family == family]
        if not own:
            raise ConfigError(f"variants: no entry of family {family!r} (families: {', '.join(self.families)})")
        peers = {b for e in own for b in (self.impl(e).baseline, self.impl(e).second_baseline) if b}
        shapes = {s for e in own for s in self.gpu_shapes(e)}
        return own + [e for e in self.entries if e not in own and self.impl(e).name in peers
                      and shapes & set(self.gpu_shapes(e))]

    def peer_entry(self, entry: str, role: str, dist: str, shape: str) -> str | None:
        """The config entry that times an entry's peer (``role``: "baseline", the matched peer, or
        "second_baseline") at one GPU point, or None: the first entry running that registered variant at
        that distribution and shape. Its run record says whether the peer passed its checks there."""
        peer = getattr(self.impl(entry), role)
        return next((e for e in self.entries if peer and self.impl(e).name == peer and dist in self.variant_dists(e)
                     and shape in self.gpu_shapes(e, dist)), None)

    def peer_points(self, entry: str, platform: str, dist: str) -> dict[str, dict[str, dict]]:
        """Per GPU shape of an entry, its peers by role (those some entry times there): the peer's entry,
        registered variant, run record and input file; what a paired run job reads (harness/runner.py)."""
        out: dict[str, dict[str, dict]] = {}
        if kind(platform) != "gpu" or self.impl(entry).family == "baseline" or dist not in self.variant_dists(entry):
            return out
        for shape in self.gpu_shapes(entry, dist):
            for role in ("baseline", "second_baseline"):
                if (peer := self.peer_entry(entry, role, dist, shape)) is not None:
                    v = self.impl(peer)
                    out.setdefault(shape, {})[role] = {
                        "entry": peer, "variant": v.name, "record": f"results/{platform}/{peer}/{dist}/{shape}.json",
                        "format_file": f"results/inputs/{dist}/{shape}/formats/{v.input_format}.pt"}
        return out

    def check_profile_point(self, platform: str, entry: str, dist: str, shape: str, tile: str) -> None:
        """A profile is of a point the entry times on that platform: its shape, distribution and tile there."""
        where = f"results/{platform}/profile/{entry}/{dist}/{shape}/{tile}"
        if entry not in self.entries:
            raise UnplannedTarget(f"{where}: no config entry {entry!r}; entries: {', '.join(self.entries)}")
        arch = self.run_arch(platform)
        tiles = self.sweep_tiles(entry, arch) if self.is_tilelang(entry) else [LIBRARY]
        for what, value, known in (("shape", shape, self.gpu_shapes(entry, dist)),
                                   ("distribution", dist, self.variant_dists(entry)), (f"tile on {arch}", tile, tiles)):
            if value not in known:
                raise UnplannedTarget(f"{where}: {entry} times no {what} {value!r}; it times: {', '.join(known)}")
