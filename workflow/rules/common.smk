# Helpers shared by every stage: config validation, platform detection, output enumeration.
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
sys.path.insert(0, str(REPO))

from kernels.deps import compile_jobs, import_closure  # noqa: E402
from kernels.device import detect_gpu  # noqa: E402
from kernels.registry import FAMILY_MODULES, FORMATS, VARIANTS, load_all  # noqa: E402
from kernels.tiles import LIBRARY, parse_shape, parse_tile  # noqa: E402

load_all()


def validate_config(cfg):
    """Schema first, then what a schema cannot know; every message names the offending key."""
    from kernels.registry import unchecked_targets

    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.path))
    if errors:
        lines = [f"  {'.'.join(str(p) for p in e.path) or '(top level)'}: {e.message}" for e in errors]
        raise WorkflowError("invalid config:\n" + "\n".join(lines))
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
            if target != "default" and target not in cfg["targets"]:
                raise WorkflowError(f"invalid config:\n  variants.{name}.tiles.{target}: not one of targets {cfg['targets']}")
            for t in names:
                try:
                    parse_tile(t)
                except ValueError as e:
                    raise WorkflowError(f"invalid config:\n  variants.{name}.tiles.{target}: {e}") from None
        # a target nothing checks would compile "ok" whatever instructions it got (issue 9)
        for target in unchecked_targets(VARIANTS[impl], cfg["targets"]):
            factory = getattr(VARIANTS[impl].kernel, "func", VARIANTS[impl].kernel)
            raise WorkflowError(f"invalid config:\n  variants.{name}: target {target} has no instruction check "
                                f"({factory.__module__.replace('.', '/')}.py Variant.instructions) and no declared "
                                "unsupported reason")
    check_shapes_fit_formats(cfg)
    cfg.setdefault("tilelang_cache", ".cache/tilelang")


def check_shapes_fit_formats(cfg):
    """Quantize a small stand-in per (format, K) now, so that a shape a format cannot take (K not a
    multiple of its group, odd K for int4 packing) is refused before any job runs."""
    import torch

    verdict = {}
    for name, vcfg in cfg["variants"].items():
        fmt = VARIANTS[vcfg.get("uses", name)].input_format
        for kind in ("cpu", "gpu"):
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


def resolve_platform(wanted):
    """(platform, arch of its GPU or None): detected, never guessed; asking for an absent GPU is an error."""
    gpu = detect_gpu()
    if wanted == "cpu" or (wanted == "auto" and gpu is None):
        return "cpu", None
    if wanted == "auto":
        return gpu["platform"], gpu["arch"]
    if gpu is None or gpu["platform"] != wanted:
        found = "no GPU" if gpu is None else f"{gpu['gpu_name']} ({gpu['platform']})"
        raise WorkflowError(f"config platform {wanted!r} requested but this host has {found}; use platform: auto")
    return gpu["platform"], gpu["arch"]


validate_config(config)
PLATFORM, RUN_ARCH = resolve_platform(config["platform"])


def physical_limits(platform):
    """The platform's datasheet limits (config platforms.<slug>); a GPU platform must have them, with
    a peak for the precision of every variant that runs."""
    if platform == "cpu":
        return None
    limits = config["platforms"].get(platform)
    if limits is None:
        raise WorkflowError(f"invalid config:\n  platforms.{platform}: no datasheet limits for this GPU; add its "
                            "dense peak per precision and its HBM bandwidth (see config.yaml)")
    for entry in config["variants"]:
        precision = VARIANTS[config["variants"][entry].get("uses", entry)].precision
        if precision not in limits["peak"]:
            raise WorkflowError(f"invalid config:\n  platforms.{platform}.peak.{precision}: missing, and "
                                f"variants.{entry} is bounded by it")
    return limits


PHYSICAL = physical_limits(PLATFORM)
HOST_KIND = "cpu" if PLATFORM == "cpu" else "gpu"
TARGETS = config["targets"]
if RUN_ARCH is not None and RUN_ARCH not in TARGETS:
    raise WorkflowError(f"this host's GPU is {RUN_ARCH}, which is not in config targets {TARGETS}")
RUN_VARIANTS = list(config["variants"])
DISTS = config["distributions"]

FIGURES = ["headline", "throughput", "speedup", "roofline", "accuracy", "compile_matrix", "comparison"]

wildcard_constraints:
    platform="[a-z0-9]+",
    target="sm_[0-9]+a?",
    dist="[a-z0-9_]+",
    shape="[0-9]+x[0-9]+x[0-9]+",
    tile="[a-z0-9_]+",


def impl(entry):
    """The registered variant a config entry runs (entries may reuse one under another sweep)."""
    return VARIANTS[config["variants"][entry].get("uses", entry)]


def is_tilelang(variant):
    return impl(variant).kernel is not None


def variant_shapes(variant):
    return config["variants"][variant].get("shapes", {}).get(HOST_KIND) or config["sweeps"][HOST_KIND]


def variant_compile_jobs(variant):
    """(target, tile, shapes) per kernel of a variant's compile job: this GPU's arch at every shape it
    runs, every other target (all of them on a CPU host) at the compile-check shapes only."""
    return compile_jobs({t: tiles_for(variant, t) for t in TARGETS}, RUN_ARCH, variant_shapes(variant),
                        config["sweeps"]["cpu_compile"])


def tiles_for(variant, target):
    tiles = config["variants"][variant].get("tiles", {})
    return tiles.get(target) or tiles.get("default", [])


def input_formats(shape):
    """Every input format some variant needs at this shape (one inputs job writes them all)."""
    return sorted({impl(v).input_format for v in RUN_VARIANTS if shape in variant_shapes(v)})


def input_sets():
    """Every (distribution, shape) some variant runs on."""
    return sorted({(d, s) for v in RUN_VARIANTS for d in variant_dists(v) for s in variant_shapes(v)})


def all_shapes():
    return sorted({s for v in RUN_VARIANTS for s in variant_shapes(v)}, key=lambda s: parse_shape(s))


def compile_outputs():
    return [f"results/{PLATFORM}/compile/{v}/{t}/{tile}.json"
            for v in RUN_VARIANTS if is_tilelang(v) for t in TARGETS for tile in tiles_for(v, t)]


def _module_of(obj):
    while hasattr(obj, "func"):  # functools.partial
        obj = obj.func
    return obj.__module__


# Snakemake reruns a job when its script changes, not when code it imports does: a job's code inputs
# are the import closure (kernels/deps.py) of the modules it uses and of its script's imports, so
# editing any module a job reaches, directly or not, reruns that job.
STAGE_CODE = {"compile": (["kernels.compile"], ["workflow/scripts/compile_kernel.py"]),
              "run": (["kernels.compile", "kernels.runner", "kernels.bench", "kernels.metrics", "kernels.inputs",
                       "kernels.device"], ["workflow/scripts/compile_kernel.py", "workflow/scripts/run_variant.py"]),
              "inputs": (["kernels.inputs"], ["workflow/scripts/build_inputs.py"])}


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


def format_code(shape):
    """Code inputs of the inputs job of a shape: the formats it writes."""
    modules, scripts = STAGE_CODE["inputs"]
    own = set().union(*(_format_modules(f) for f in input_formats(shape)))
    return import_closure(sorted(own | set(modules)), REPO, scripts)


def run_outputs():
    return [f"results/{PLATFORM}/{v}/{d}/{s}.json" for v in RUN_VARIANTS for d in variant_dists(v) for s in variant_shapes(v)]


def variant_dists(variant):
    return config["variants"][variant].get("distributions") or DISTS


def run_inputs(variant):
    """All shapes of one (variant, distribution): inputs, the code they depend on, compiled kernels."""
    def inputs(wc):
        shapes = variant_shapes(variant)
        files = {"fp32": [f"results/inputs/{wc.dist}/{s}/fp32.pt" for s in shapes],
                 "formats": [f"results/inputs/{wc.dist}/{s}/formats" for s in shapes],
                 "manifest": [f"results/inputs/{wc.dist}/{s}/manifest.json" for s in shapes],
                 "code": variant_code(variant, "run")}
        if RUN_ARCH is not None and is_tilelang(variant):
            files["compiled"] = [f"results/{wc.platform}/compile/{variant}/{RUN_ARCH}/{t}.json"
                                 for t in tiles_for(variant, RUN_ARCH)]
        return files
    return inputs


def report_outputs(folder):
    return {name: report(f"{folder}/figures/{name}.png", caption=f"../report/{name}.rst", category="lpgemm")
            for name in FIGURES}


def report_params(result_dir, label, references):
    return {"result_dir": result_dir, "label": label, "references": references,
            "regression_threshold": config["report"]["regression_threshold"],
            "captions": {n: (REPO / "workflow/report" / f"{n}.rst").read_text().strip() for n in FIGURES}}
