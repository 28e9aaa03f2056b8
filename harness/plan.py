"""The validated config and what it plans, as plain Python (no Snakemake).

``workflow/rules/common.smk`` validates ``config`` and plans the DAG with this module, turning a
``ConfigError`` into Snakemake's ``WorkflowError``; tests and ``harness.tryout`` call it directly. Every
error names the offending config key. Everything planned is a function of the config; only ``run_on``'s
``auto`` looks at the planning host.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import yaml

from harness.device import detect_gpu, matching_platforms
from kernels.registry import FORMATS, VARIANTS, load_all, tile_problem, unchecked_targets
from kernels.tiles import LIBRARY, parse_shape, parse_tile, shape_class

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


def load_config(path: Path | str = REPO / "config.yaml", overrides: dict | None = None) -> dict:
    """A config file, validated as the pipeline validates it (``validate``)."""
    return validate(yaml.safe_load(Path(path).read_text()), overrides)


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


def _schema_message(error) -> str:
    if error.validator == "type" and isinstance(error.instance, float):
        if error.validator_value == "integer" and error.instance.is_integer():
            return f"{error.instance!r} is not an integer (write {int(error.instance)})"
        if not math.isfinite(error.instance):
            return f"{error.instance!r} is not a finite number"
    return error.message


def validate(cfg: dict, overrides: dict | None = None, check_shapes: bool = True) -> dict:
    """Schema first, then what a schema cannot know; every message names the offending key. Completes
    ``cfg`` in place (nulled variants dropped, defaults set) and returns it. ``overrides``: what the
    command line merged into it; ``check_shapes``: quantize a stand-in per (format, K), the costly check
    (a job re-parsing the workflow on a node reads the config its planner already checked)."""
    load_all()
    check_overrides(overrides or {})
    drop_nulled_variants(cfg)
    schema = yaml.safe_load(SCHEMA.read_text())
    validator = _strict_types()(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.path))
    if errors:
        raise ConfigError(*(f"{'.'.join(str(p) for p in e.path) or '(top level)'}: {_schema_message(e)}" for e in errors))
    class_names = check_shape_classes(cfg)
    for name, vcfg in cfg["variants"].items():
        impl = vcfg.get("uses", name)
        if impl not in VARIANTS:
            key = f"variants.{name}.uses" if "uses" in vcfg else f"variants.{name}"
            raise ConfigError(f"{key}: unknown variant {impl!r}; known: {', '.join(sorted(VARIANTS))}")
        check_tiles(cfg, name, impl, class_names)
        # a target nothing checks would compile "ok" whatever instructions it got (issue 9)
        for target in unchecked_targets(VARIANTS[impl], cfg["targets"]):
            factory = getattr(VARIANTS[impl].kernel, "func", VARIANTS[impl].kernel)
            source_file = factory.__module__.replace(".", "/")
            raise ConfigError(f"variants.{name}: target {target} has no instruction check ({source_file}.py "
                              "Variant.sass and Variant.instructions) and no declared unsupported reason")
    check_targets(cfg)
    check_timing(cfg)
    if check_shapes:
        check_shapes_fit_formats(cfg)
    cfg.setdefault("tilelang_cache", ".cache/tilelang")
    return cfg


def check_tiles(cfg: dict, name: str, impl: str, class_names: list[str]) -> None:
    """A TileLang entry has tiles, a library baseline none; per-class tiles name every class; each tile is
    one the variant's kernel takes."""
    tiles = cfg["variants"][name].get("tiles", {})
    if VARIANTS[impl].kernel is None and tiles:
        raise ConfigError(f"variants.{name}.tiles: {name} is a library baseline and takes no tiles")
    if VARIANTS[impl].kernel is not None and not tiles:
        raise ConfigError(f"variants.{name}.tiles: a TileLang variant needs at least one tile")
    for target, names in tiles.items():
        key = f"variants.{name}.tiles.{target}"
        if target != "default" and target not in cfg["targets"]:
            raise ConfigError(f"{key}: not one of targets {cfg['targets']}")
        if isinstance(names, dict):  # per shape class: every class, and only classes
            missing, unknown = sorted(set(class_names) - set(names)), sorted(set(names) - set(class_names))
            if missing or unknown:
                raise ConfigError(f"{key}: tiles per shape class must name every class of shape_classes {class_names}"
                                  + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
        for cls, t in ([(c, t) for c, ts in names.items() for t in ts] if isinstance(names, dict) else
                       [(None, t) for t in names]):
            try:
                problem = tile_problem(VARIANTS[impl], parse_tile(t))
            except ValueError as e:
                problem = str(e)
            if problem:
                raise ConfigError(f"{key}.{cls}: {problem}" if cls else f"{key}: {problem}")


PAIRING_DEFAULTS = {"target_halfwidth": 0.005, "min_rounds": 30, "max_rounds": 400, "aa_shapes": []}
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
    return names


def check_shapes_fit_formats(cfg: dict) -> None:
    """Quantize a small stand-in per (format, K) now, so that a shape a format cannot take (K not a
    multiple of its group, odd K for int4 packing) is refused before any job runs."""
    import torch

    verdict = {}
    for name, vcfg in cfg["variants"].items():
        variant = VARIANTS[vcfg.get("uses", name)]
        fmt = variant.input_format
        # the compile check builds every TileLang kernel at the cpu_compile shapes too
        kinds = ("cpu", "gpu", "cpu_compile") if variant.kernel is not None else ("cpu", "gpu")
        for kind in kinds:
            own = vcfg.get("shapes", {}).get(kind)
            for shape in own or cfg["sweeps"][kind]:
                K = parse_shape(shape)[2]
                if (fmt, K) not in verdict:
                    try:
                        FORMATS[fmt].quantize(torch.zeros(128, K), torch.zeros(128, K))
                        verdict[fmt, K] = None
                    except (ValueError, TypeError) as e:
                        verdict[fmt, K] = str(e)
                if verdict[fmt, K]:
                    where = f"variants.{name}.shapes.{kind}" if own else f"sweeps.{kind}"
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
        """Every tile an entry has for a target, over all shape classes (in config order, once each)."""
        tiles = self._target_tiles(entry, target)
        return list(dict.fromkeys(t for ts in tiles.values() for t in ts)) if isinstance(tiles, dict) else tiles

    def tiles_for_shape(self, entry: str, target: str, shape: str) -> list[str]:
        """The tiles an entry runs at one shape on a target: its shape class's, or the one list for all shapes."""
        tiles = self._target_tiles(entry, target)
        if isinstance(tiles, dict):
            return tiles[shape_class(*parse_shape(shape), self.config["shape_classes"])]
        return tiles

    def check_compile_jobs(self, entry: str) -> list[tuple[str, str, list[str]]]:
        """(target, tile, shapes) per kernel of an entry's compile-check job: every target, every tile, at
        the sweeps.cpu_compile shapes (a cross-compile does not depend on the host)."""
        return [(t, tile, self.config["sweeps"]["cpu_compile"]) for t in self.targets for tile in self.tiles_for(entry, t)]

    def sweep_shapes(self, entry: str, target: str, tile: str) -> list[str]:
        """The GPU shapes a tile is compiled at and run on: those of the entry whose class lists it."""
        return [s for s in self.variant_shapes(entry, "gpu") if tile in self.tiles_for_shape(entry, target, s)]

    def sweep_tiles(self, entry: str, target: str) -> list[str]:
        return [t for t in self.tiles_for(entry, target) if self.sweep_shapes(entry, target, t)]

    def input_formats(self, shape: str) -> list[str]:
        """Every input format some entry needs at this shape, on any host kind (one inputs job writes them all)."""
        return sorted({self.impl(v).input_format for v in self.entries for k in ("cpu", "gpu")
                       if shape in self.variant_shapes(v, k)})

    def input_sets(self) -> dict[str, tuple[tuple[str, ...], list[str]]]:
        """{name: (formats, shapes)} for the build_inputs_<name> rules: the shapes of every sweep grouped by
        the formats they need. The name lists the families of those formats' variants (a number is added
        should two sets share it)."""
        shapes = [s for v in self.entries for k in ("cpu", "gpu") for s in self.variant_shapes(v, k)]
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

    def run_outputs(self, platform: str, entries=None) -> list[str]:
        return [f"results/{platform}/{v}/{d}/{s}.json" for v in (entries or self.entries) for d in self.variant_dists(v)
                for s in self.variant_shapes(v, kind(platform))]

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
        shapes = {s for e in own for s in self.variant_shapes(e, "gpu")}
        return own + [e for e in self.entries if e not in own and self.impl(e).name in peers
                      and shapes & set(self.variant_shapes(e, "gpu"))]

    def peer_entry(self, entry: str, role: str, dist: str, shape: str) -> str | None:
        """The config entry that times an entry's peer (``role``: "baseline", the matched peer, or
        "second_baseline") at one GPU point, or None: the first entry running that registered variant at
        that distribution and shape. Its run record says whether the peer passed its checks there."""
        peer = getattr(self.impl(entry), role)
        return next((e for e in self.entries if peer and self.impl(e).name == peer and dist in self.variant_dists(e)
                     and shape in self.variant_shapes(e, "gpu")), None)

    def peer_points(self, entry: str, platform: str, dist: str) -> dict[str, dict[str, dict]]:
        """Per GPU shape of an entry, its peers by role (those some entry times there): the peer's entry,
        registered variant, run record and input file; what a paired run job reads (harness/runner.py)."""
        out: dict[str, dict[str, dict]] = {}
        if kind(platform) != "gpu" or self.impl(entry).family == "baseline" or dist not in self.variant_dists(entry):
            return out
        for shape in self.variant_shapes(entry, "gpu"):
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
        tiles = self.tiles_for(entry, arch) if self.is_tilelang(entry) else [LIBRARY]
        for what, value, known in (("shape", shape, self.variant_shapes(entry, "gpu")),
                                   ("distribution", dist, self.variant_dists(entry)), (f"tile on {arch}", tile, tiles)):
            if value not in known:
                raise UnplannedTarget(f"{where}: {entry} times no {what} {value!r}; it times: {', '.join(known)}")
