# Helpers shared by every stage: config validation, platforms, output enumeration. Everything a job
# needs is a function of the config and its wildcards; only run_on's `auto` looks at the planning host.
import json
import math
import os
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
# plan with this checkout's kernels and harness, even where another checkout of lpgemm is installed
sys.path.insert(0, str(REPO))

from harness.deps import import_closure  # noqa: E402
from harness.device import detect_gpu, matching_platforms  # noqa: E402
from harness.tables import profile_summary_files  # noqa: E402
from kernels.registry import FAMILY_MODULES, FORMATS, VARIANTS, load_all  # noqa: E402
from kernels.tiles import LIBRARY, parse_shape, parse_tile, shape_class  # noqa: E402

load_all()


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


def check_overrides(overrides, where=()):
    """An override (--configfile, --config) merges into config.yaml key by key, so an empty mapping in it
    changes nothing: refuse it instead of silently running the default."""
    for key, value in overrides.items():
        path = (*where, str(key))
        if isinstance(value, dict):
            if not value:
                raise WorkflowError(f"invalid config:\n  {'.'.join(path)}: an empty mapping in an override "
                                    "(--configfile/--config) merges into config.yaml and changes nothing; to drop "
                                    "a variant, set it to null (variants: {fp8_e5m2: null})")
            check_overrides(value, path)


def drop_nulled_variants(cfg):
    """`variants: {name: null}` in an override removes that entry (a merge cannot delete keys)."""
    if isinstance(cfg.get("variants"), dict):
        cfg["variants"] = {k: v for k, v in cfg["variants"].items() if v is not None}


def nvcc_archs():
    """(path, real archs sm_XX) of the nvcc on PATH; None without one (the schema's list then rules)."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return (nvcc, set(out.split())) if out.split() else None


def check_targets(cfg):
    found = nvcc_archs()
    if found is None:
        return
    nvcc, archs = found
    for i, target in enumerate(cfg["targets"]):
        if target.removesuffix("a") not in archs:
            raise WorkflowError(f"invalid config:\n  targets.{i}: {target} is not an arch of {nvcc} "
                                f"(--list-gpu-code: {', '.join(sorted(archs))})")


def _schema_message(error):
    if error.validator == "type" and isinstance(error.instance, float):
        if error.validator_value == "integer" and error.instance.is_integer():
            return f"{error.instance!r} is not an integer (write {int(error.instance)})"
        if not math.isfinite(error.instance):
            return f"{error.instance!r} is not a finite number"
    return error.message


def validate_config(cfg):
    """Schema first, then what a schema cannot know; every message names the offending key."""
    from kernels.registry import tile_problem, unchecked_targets

    check_overrides(workflow.config_settings.overwrite_config or {})
    drop_nulled_variants(cfg)
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    validator = _strict_types()(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.path))
    if errors:
        lines = [f"  {'.'.join(str(p) for p in e.path) or '(top level)'}: {_schema_message(e)}" for e in errors]
        raise WorkflowError("invalid config:\n" + "\n".join(lines))
    class_names = check_shape_classes(cfg)
    for name, vcfg in cfg["variants"].items():
        impl = vcfg.get("uses", name)
        if impl not in VARIANTS:
            key = f"variants.{name}.uses" if "uses" in vcfg else f"variants.{name}"
            raise WorkflowError(f"invalid config:\n  {key}: unknown variant {impl!r}; known: {', '.join(sorted(VARIANTS))}")
        tiles = vcfg.get("tiles", {})
        if VARIANTS[impl].kernel is None and tiles:
            raise WorkflowError(f"invalid config:\n  variants.{name}.tiles: {name} is a library baseline and takes no tiles")
        if VARIANTS[impl].kernel is not None and not tiles:
            raise WorkflowError(f"invalid config:\n  variants.{name}.tiles: a TileLang variant needs at least one tile")
        for target, names in tiles.items():
            key = f"variants.{name}.tiles.{target}"
            if target != "default" and target not in cfg["targets"]:
                raise WorkflowError(f"invalid config:\n  {key}: not one of targets {cfg['targets']}")
            if isinstance(names, dict):  # per shape class: every class, and only classes
                missing, unknown = sorted(set(class_names) - set(names)), sorted(set(names) - set(class_names))
                if missing or unknown:
                    raise WorkflowError(f"invalid config:\n  {key}: tiles per shape class must name every class of "
                                        f"shape_classes {class_names}" + (f"; missing {missing}" if missing else "")
                                        + (f"; unknown {unknown}" if unknown else ""))
            for cls, t in ([(c, t) for c, ts in names.items() for t in ts] if isinstance(names, dict) else
                           [(None, t) for t in names]):
                where = f"{key}.{cls}" if cls else key
                try:
                    problem = tile_problem(VARIANTS[impl], parse_tile(t))
                except ValueError as e:
                    problem = str(e)
                if problem:
                    raise WorkflowError(f"invalid config:\n  {where}: {problem}")
        # a target nothing checks would compile "ok" whatever instructions it got (issue 9)
        for target in unchecked_targets(VARIANTS[impl], cfg["targets"]):
            factory = getattr(VARIANTS[impl].kernel, "func", VARIANTS[impl].kernel)
            source_file = factory.__module__.replace(".", "/")
            raise WorkflowError(f"invalid config:\n  variants.{name}: target {target} has no instruction check "
                                f"({source_file}.py Variant.sass and Variant.instructions) and no declared unsupported reason")
    check_targets(cfg)
    # the costly check (it quantizes): a job re-parsing this file on a node reads the config its
    # planner already checked
    if getattr(workflow, "is_main_process", True):
        check_shapes_fit_formats(cfg)
    cfg.setdefault("tilelang_cache", ".cache/tilelang")


def check_shape_classes(cfg):
    """Unique names, and a last class without bounds, so every shape has a class; returns the names."""
    classes = cfg.setdefault("shape_classes", [{"name": "any"}])
    names = [c["name"] for c in classes]
    if len(set(names)) != len(names):
        raise WorkflowError(f"invalid config:\n  shape_classes: names must be unique, got {names}")
    if set(classes[-1]) != {"name"}:
        raise WorkflowError(f"invalid config:\n  shape_classes: the last class ({names[-1]}) must have no bounds, "
                            "so that every shape falls in some class")
    return names


def check_shapes_fit_formats(cfg):
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
                    raise WorkflowError(f"invalid config:\n  {where}: shape {shape} does not fit {name} "
                                        f"(format {fmt}): {verdict[fmt, K]}")


AUTO_ENV = "LPGEMM_AUTO_PLATFORM"


def resolve_auto(platforms):
    """What ``auto`` means: this planning host's platform, "cpu" without a GPU, else the one catalogue
    entry whose ``match`` fits the GPU's name. Resolved once by the planning process and handed to
    every job it spawns (environment variable LPGEMM_AUTO_PLATFORM, which sbatch and the local
    executor pass on), so a job re-parsing this file on another node plans exactly the same DAG."""
    if os.environ.get(AUTO_ENV):
        return os.environ[AUTO_ENV]
    gpu = detect_gpu()
    if gpu is None:
        slug = "cpu"
    else:
        found = matching_platforms(gpu["gpu_name"], platforms)
        if len(found) != 1:
            why = "matches no entry" if not found else f"matches several ({', '.join(found)})"
            raise WorkflowError(f"invalid config:\n  run_on: auto: this host's GPU {gpu['gpu_name']!r} {why} of "
                                "platforms.*.match; add (or narrow) its entry in config platforms, or name the "
                                "platforms to run in run_on")
        slug = found[0]
    os.environ[AUTO_ENV] = slug
    return slug


def resolve_run_on(cfg):
    """The platforms to plan, in order: ``auto`` resolved, every other entry "cpu" or a catalogue slug."""
    out = []
    for i, p in enumerate(cfg["run_on"]):
        if p == "auto":
            p = resolve_auto(cfg["platforms"])
        elif p != "cpu" and p not in cfg["platforms"]:
            raise WorkflowError(f"invalid config:\n  run_on.{i}: unknown platform {p!r}; known: auto, cpu, "
                                + ", ".join(cfg["platforms"]))
        if p not in out:
            out.append(p)
    return out


validate_config(config)
RUN_ON = resolve_run_on(config)
TARGETS = config["targets"]
RUN_VARIANTS = list(config["variants"])
DISTS = config["distributions"]
# the GPU rules' {platform}: a catalogue slug; the CPU emulation rules' {platform}: "cpu"
GPU_PLATFORM = "|".join(sorted(config["platforms"]))


def kind(platform):
    """"cpu" (emulation, CPU sweep) or "gpu" (timed, GPU sweep)."""
    return "cpu" if platform == "cpu" else "gpu"


def platform_spec(platform):
    """A GPU platform's catalogue entry, checked for what planning it needs; every message names the key."""
    spec = config["platforms"].get(platform)
    if spec is None:
        raise WorkflowError(f"invalid config:\n  platforms.{platform}: not in the catalogue (known: "
                            f"{', '.join(config['platforms'])}); results/{platform}/ cannot be planned")
    if spec["arch"] not in TARGETS:
        raise WorkflowError(f"invalid config:\n  platforms.{platform}.arch: {spec['arch']} is not one of targets "
                            f"{TARGETS}; add it there to run on {platform}")
    for entry in RUN_VARIANTS:
        precision = impl(entry).precision
        if precision not in spec["peak"]:
            raise WorkflowError(f"invalid config:\n  platforms.{platform}.peak.{precision}: missing, and "
                                f"variants.{entry} is bounded by it (null if {platform} has no tensor-core path)")
    return spec


def run_arch(platform):
    return None if platform == "cpu" else platform_spec(platform)["arch"]


def physical_limits(platform):
    """The platform's datasheet limits (config platforms.<slug>), None for CPU emulation."""
    if platform == "cpu":
        return None
    platform_spec(platform)
    return datasheet(platform)


def gpu_resources(platform):
    """A GPU job's resources: one GPU (the local profile's gpu=1 keeps them one at a time) and its
    platform's cluster request (profiles/slurm turns these into sbatch flags)."""
    c = platform_spec(platform)["cluster"]
    return {"gpu": 1, "slurm_partition": c["partition"], "gpu_model": c.get("gpu_model"),
            "constraint": c.get("constraint"), "runtime": c["runtime"], "mem_mb": c["mem_mb"],
            "cpus_per_task": c.get("cpus_per_task", 1)}


GPU_RESOURCES = ("gpu", "slurm_partition", "gpu_model", "constraint", "runtime", "mem_mb", "cpus_per_task")


def gpu_resource(name):
    return lambda wc: gpu_resources(wc.platform)[name]


FIGURES = ["headline", "throughput", "speedup", "roofline", "weight_bandwidth", "accuracy", "compile_matrix", "comparison"]

wildcard_constraints:
    platform="[a-z0-9]+",
    family="[a-z0-9]+",
    target="sm_[0-9]+a?",
    dist="[a-z0-9_]+",
    # canonical positive integers only: 0x64x128 or 064x64x128 match no rule
    shape="[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*",
    tile="[a-z0-9_]+",


def impl(entry):
    """The registered variant a config entry runs (entries may reuse one under another sweep)."""
    return VARIANTS[config["variants"][entry].get("uses", entry)]


def is_tilelang(variant):
    return impl(variant).kernel is not None


def variant_shapes(variant, kind):
    return config["variants"][variant].get("shapes", {}).get(kind) or config["sweeps"][kind]


def check_compile_jobs(variant):
    """(target, tile, shapes) per kernel of a variant's compile-check job: every target, every tile, at
    the sweeps.cpu_compile shapes (a cross-compile does not depend on the host)."""
    return [(t, tile, config["sweeps"]["cpu_compile"]) for t in TARGETS for tile in tiles_for(variant, t)]


def _target_tiles(variant, target):
    tiles = config["variants"][variant].get("tiles", {})
    return tiles.get(target) or tiles.get("default", [])


def tiles_for(variant, target):
    """Every tile a variant has for a target, over all shape classes (in config order, once each)."""
    tiles = _target_tiles(variant, target)
    return list(dict.fromkeys(t for ts in tiles.values() for t in ts)) if isinstance(tiles, dict) else tiles


def tiles_for_shape(variant, target, shape):
    """The tiles a variant runs at one shape on a target: its shape class's, or the one list for all shapes."""
    tiles = _target_tiles(variant, target)
    return tiles[shape_class(*parse_shape(shape), config["shape_classes"])] if isinstance(tiles, dict) else tiles


def sweep_shapes(variant, target, tile):
    """The GPU shapes a tile is compiled at and run on: those of the variant whose class lists it."""
    return [s for s in variant_shapes(variant, "gpu") if tile in tiles_for_shape(variant, target, s)]


def sweep_tiles(variant, target):
    return [t for t in tiles_for(variant, target) if sweep_shapes(variant, target, t)]


def input_formats(shape):
    """Every input format some variant needs at this shape, on any host kind (one inputs job writes them all)."""
    return sorted({impl(v).input_format for v in RUN_VARIANTS for k in ("cpu", "gpu") if shape in variant_shapes(v, k)})


def compile_outputs(platform, entries=None):
    """The compile records of a platform's report (of ``entries``, default all): every target's check
    compile, and on a GPU platform its own arch's kernels at the shapes it runs."""
    tilelang = [v for v in (entries or RUN_VARIANTS) if is_tilelang(v)]
    check = [f"results/compile/{v}/{t}/{tile}.json" for v in tilelang for t in TARGETS for tile in tiles_for(v, t)]
    arch = run_arch(platform)
    return check + ([sweep_record(v, arch, tile) for v in tilelang for tile in sweep_tiles(v, arch)] if arch else [])


def sweep_record(variant, arch, tile):
    return f"results/compile/{variant}/{arch}/sweep/{tile}.json"


def _module_of(obj):
    while hasattr(obj, "func"):  # functools.partial
        obj = obj.func
    return obj.__module__


# Snakemake reruns a job when its script changes, not when code it imports does: a job's code inputs
# are the import closure (harness/deps.py) of the modules it uses and of its script's imports, so
# editing any module a job reaches, directly or not, reruns that job.
STAGE_CODE = {"compile": (["harness.compile"], ["workflow/scripts/compile_kernel.py"]),
              "run": (["harness.compile", "harness.runner", "harness.bench", "harness.metrics", "harness.inputs",
                       "harness.device"], ["workflow/scripts/compile_kernel.py", "workflow/scripts/run_variant.py"]),
              "inputs": (["harness.inputs"], ["workflow/scripts/build_inputs.py"])}


def _format_modules(fmt):
    return {_module_of(f) for f in (FORMATS[fmt].quantize, FORMATS[fmt].dequantize)}


def variant_code(variant, stage):
    """Code inputs of a variant's compile or run job."""
    v = impl(variant)
    own = {_module_of(f) for f in (v.launch, v.emulate, v.kernel) if f is not None} | _format_modules(v.input_format)
    modules, scripts = STAGE_CODE[stage]
    return import_closure(sorted(own | set(modules)), REPO, scripts)


def script_code(script):
    """Code inputs of a collect or report job: its script's import closure and every family module
    (registry.load_all imports them by name, which the closure cannot see)."""
    return import_closure(list(FAMILY_MODULES), REPO, [f"workflow/scripts/{script}"])


def format_code(formats):
    """Code inputs of an inputs job: the modules of the formats it writes."""
    modules, scripts = STAGE_CODE["inputs"]
    own = set().union(*(_format_modules(f) for f in formats))
    return import_closure(sorted(own | set(modules)), REPO, scripts)


def input_sets():
    """{name: (formats, shapes)} for the build_inputs_<name> rules (inputs.smk): the shapes of every sweep
    grouped by the formats they need. The name lists the families of those formats' variants (a number
    is added should two sets share it)."""
    shapes = [s for v in RUN_VARIANTS for k in ("cpu", "gpu") for s in variant_shapes(v, k)]
    groups = {}
    for shape in dict.fromkeys(shapes):
        groups.setdefault(tuple(input_formats(shape)), []).append(shape)
    sets = {}
    for formats, members in groups.items():
        name = "_".join(sorted({impl(v).family for v in RUN_VARIANTS if impl(v).input_format in formats}))
        unique, n = name, 2
        while unique in sets:
            unique, n = f"{name}_{n}", n + 1
        sets[unique] = (formats, members)
    return sets


def run_outputs(platform, entries=None):
    return [f"results/{platform}/{v}/{d}/{s}.json" for v in (entries or RUN_VARIANTS) for d in variant_dists(v)
            for s in variant_shapes(v, kind(platform))]


def variant_dists(variant):
    return config["variants"][variant].get("distributions") or DISTS


def run_inputs(variant, kind):
    """All shapes of one (variant, distribution): inputs, the code they depend on, and on a GPU platform
    its own arch's kernels compiled at those shapes (nothing of any other target)."""
    def inputs(wc):
        shapes = variant_shapes(variant, kind)
        fmt = impl(variant).input_format
        files = {"fp32": [f"results/inputs/{wc.dist}/{s}/fp32.pt" for s in shapes],
                 "formats": [f"results/inputs/{wc.dist}/{s}/formats/{fmt}.pt" for s in shapes],
                 "manifest": [f"results/inputs/{wc.dist}/{s}/manifest.json" for s in shapes],
                 "code": variant_code(variant, "run")}
        arch = run_arch(wc.platform)
        if arch is not None and is_tilelang(variant):
            files["compiled"] = [sweep_record(variant, arch, t) for t in sweep_tiles(variant, arch)]
        return files
    return inputs


def run_params(variant, kind):
    return {"variant": impl(variant).name, "entry": variant, "shapes": variant_shapes(variant, kind),
            "tolerance": config["variants"][variant]["tolerance"], "timing": config["timing"],
            "platform_spec": (lambda wc: platform_spec(wc.platform)) if kind == "gpu" else None,
            "arch": (lambda wc: run_arch(wc.platform)) if kind == "gpu" else None,
            # shape -> the tiles of its class
            "tiles": (lambda wc: {s: tiles_for_shape(variant, run_arch(wc.platform), s) for s in variant_shapes(variant, kind)})
            if kind == "gpu" else {}}


def ceilings_input(wc):
    return [f"results/{wc.platform}/ceilings.json"] if kind(wc.platform) == "gpu" else []


def report_outputs(folder):
    return {name: report(f"{folder}/figures/{name}.png", caption=f"../report/{name}.rst", category="lpgemm")
            for name in FIGURES}


def result_set_files(folder):
    """What a report reads of a result set: a published folder's points, else its collect outputs."""
    return points_in(folder) or [f"{folder}/{f}" for f in ("tidy.parquet", "compile_matrix.csv")]


def datasheet(folder):
    """The datasheet limits of the platform a result folder is named after (None if it names none)."""
    spec = config["platforms"].get(Path(str(folder)).name)
    return {k: spec[k] for k in ("name", "peak", "hbm_TBps", "source")} if spec else None


def report_params(result_dir, label, references):
    """``result_dir``, ``label``: strings or functions of the wildcards; ``references``: (folder, label)."""
    return {"result_dir": result_dir, "label": label, "references": references,
            "limits": lambda wc: {str(d): datasheet(d) for d in
                                  [result_dir(wc) if callable(result_dir) else result_dir, *(d for d, _ in references)]},
            "regression_threshold": config["report"]["regression_threshold"],
            "captions": {n: (REPO / "workflow/report" / f"{n}.rst").read_text().strip() for n in FIGURES}}


for _p in RUN_ON:
    run_arch(_p)  # a planned platform must be complete before anything runs


INPUT_SETS = input_sets()
FAMILIES = sorted({impl(v).family for v in RUN_VARIANTS} - {"baseline"})


def family_entries(family):
    """A family's points: its own config entries and every entry of a peer (matched or second baseline)
    of one of them that shares a GPU shape with them; one family refresh measures exactly these."""
    own = [e for e in RUN_VARIANTS if impl(e).family == family]
    if not own:
        raise WorkflowError(f"invalid config:\n  variants: no entry of family {family!r} (families: {', '.join(FAMILIES)})")
    peers = {b for e in own for b in (impl(e).baseline, impl(e).second_baseline) if b}
    shapes = {s for e in own for s in variant_shapes(e, "gpu")}
    return own + [e for e in RUN_VARIANTS if e not in own and impl(e).name in peers
                  and shapes & set(variant_shapes(e, "gpu"))]


def points_in(folder):
    """Every committed point file of a published folder (points/<family>/, one per family refresh)."""
    root = Path(folder) / "points"
    return sorted(str(p) for p in root.glob("*/**/*.json")) if root.is_dir() else []


def published_points(platform):
    points = points_in(f"results/published/{platform}")
    if not points:
        raise WorkflowError(f"results/published/{platform}/points: no published points; publish a family first, "
                            f"e.g. snakemake results/published/{platform}/points/{FAMILIES[0]}")
    return points


def host_platform():
    """The catalogue slug of this planning host's GPU ("cpu" without one, None if no entry matches)."""
    gpu = detect_gpu()
    if gpu is None:
        return "cpu"
    found = matching_platforms(gpu["gpu_name"], config["platforms"])
    return found[0] if len(found) == 1 else None


def profile_inputs(wc):
    """A profile's inputs: the point's input files, and for a TileLang entry its compile record and
    artifacts at this shape. Refuses, before anything runs, a point the entry does not time on that
    platform, and a local run on a host without that GPU (a cluster job is checked where it lands)."""
    where = f"results/{wc.platform}/profile/{wc.entry}/{wc.dist}/{wc.shape}/{wc.tile}"
    if wc.entry not in RUN_VARIANTS:
        raise WorkflowError(f"{where}: no config entry {wc.entry!r}; entries: {', '.join(RUN_VARIANTS)}")
    arch = run_arch(wc.platform)
    tiles = tiles_for(wc.entry, arch) if is_tilelang(wc.entry) else [LIBRARY]
    for what, value, known in (("shape", wc.shape, variant_shapes(wc.entry, "gpu")), ("distribution", wc.dist,
                               variant_dists(wc.entry)), (f"tile on {arch}", wc.tile, tiles)):
        if value not in known:
            raise WorkflowError(f"{where}: {wc.entry} times no {what} {value!r}; it times: {', '.join(known)}")
    if workflow.local_exec and (here := host_platform()) != wc.platform:
        gpu = detect_gpu()
        raise WorkflowError(f"{where}: profiling runs on a {wc.platform} GPU (config platforms.{wc.platform}.match), "
                            f"and this host has {repr(gpu['gpu_name']) if gpu else 'no GPU'}; nothing was run. Run it on "
                            f"a {wc.platform} host, or through a cluster profile (--profile profiles/slurm)")
    files = {"fp32": f"results/inputs/{wc.dist}/{wc.shape}/fp32.pt",
             "formats": f"results/inputs/{wc.dist}/{wc.shape}/formats/{impl(wc.entry).input_format}.pt",
             "manifest": f"results/inputs/{wc.dist}/{wc.shape}/manifest.json",
             "code": variant_code(wc.entry, "run") + import_closure(["harness.profile"], REPO,
                                                                     ["workflow/scripts/profile_point.py"])}
    if is_tilelang(wc.entry):
        files["compiled"] = sweep_record(wc.entry, arch, wc.tile)
        files["artifacts"] = f"results/compile/{wc.entry}/{arch}/sweep/{wc.tile}"
    return files


def profile_summaries(folder):
    """The profile summaries present in a result folder (a report lists every one)."""
    return [str(p) for p in profile_summary_files(folder)]


def report_failures(limit=40):
    """After a run (onsuccess and onerror): every failed row of the planned platforms' results, with the
    log that holds its traceback, on the console; the failed jobs' logs are shown by Snakemake itself
    (show-failed-logs in the profiles)."""
    lines = []
    for platform in RUN_ON:
        for f in run_outputs(platform):
            if not os.path.exists(f):
                continue
            try:
                d = json.loads(Path(f).read_text())
                bad = [(r.get("tile"), r.get("reason")) for r in d["rows"] if r.get("status") == "failed"]
                log = d["point"].get("log", "")
            except (OSError, ValueError, KeyError, TypeError) as e:
                bad, log = [("?", f"unreadable result ({type(e).__name__}); recompute it: snakemake -f {f}")], ""
            lines += [f"  {f} [{tile}]: {reason}" + (f"\n      log: {log}" if log else "") for tile, reason in bad]
    if lines:
        print(f"lpgemm: {len(lines)} failed row(s):", *lines[:limit], file=sys.stderr, sep="\n")
        if len(lines) > limit:
            print(f"  ... and {len(lines) - limit} more (status == failed in results/<platform>/tidy.csv)",
                  file=sys.stderr)
