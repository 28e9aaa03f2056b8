# Helpers shared by every stage: config validation, platform detection, output enumeration.
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
sys.path.insert(0, str(REPO))

from kernels.device import detect_gpu  # noqa: E402
from kernels.registry import FORMATS, VARIANTS, load_all  # noqa: E402
from kernels.tiles import LIBRARY, parse_shape, parse_tile  # noqa: E402

load_all()


def validate_config(cfg):
    """Schema first, then what a schema cannot know; every message names the offending key."""
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
HOST_KIND = "cpu" if PLATFORM == "cpu" else "gpu"
TARGETS = config["targets"]
if RUN_ARCH is not None and RUN_ARCH not in TARGETS:
    raise WorkflowError(f"this host's GPU is {RUN_ARCH}, which is not in config targets {TARGETS}")
RUN_VARIANTS = list(config["variants"])
DISTS = config["distributions"]

FIGURES = ["throughput", "speedup", "roofline", "accuracy", "compile_matrix", "comparison"]

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


def compile_shapes(variant):
    # a GPU host needs a kernel per shape it runs; a CPU host only proves each build
    return config["sweeps"]["cpu_compile"] if RUN_ARCH is None else variant_shapes(variant)


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


def _module_file(obj):
    while hasattr(obj, "func"):  # functools.partial
        obj = obj.func
    return str(Path(sys.modules[obj.__module__].__file__).relative_to(REPO))


# Snakemake reruns a job when its script changes, not when code it imports does: the kernels/
# modules a job's result depends on are declared as inputs, so editing a kernel reruns its jobs.
SHARED_CODE = ["kernels/registry.py", "kernels/tiles.py", "kernels/tn_gemm.py"]


def variant_code(variant, stage):
    v = impl(variant)
    own = {_module_file(f) for f in (v.launch, v.emulate, v.kernel) if f is not None}
    fmt = FORMATS[v.input_format]
    stage_code = {"compile": ["kernels/compile.py"],
                  "run": ["kernels/compile.py", "kernels/runner.py", "kernels/bench.py", "kernels/metrics.py",
                          "kernels/inputs.py", "kernels/device.py", _module_file(fmt.dequantize)]}[stage]
    return sorted(set(SHARED_CODE) | own | set(stage_code))


def format_code(shape):
    return sorted({"kernels/inputs.py", *SHARED_CODE} | {_module_file(FORMATS[f].quantize) for f in input_formats(shape)})


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
