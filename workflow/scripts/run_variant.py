# Run one variant on one input set per shape: GPU (correctness, then timing) or CPU emulation (numerics
# only). A shape that cannot be run (a corrupt input, a crash) gets failed rows with the reason; the
# other shapes' results are still written.
from script_setup import gpu_lock, setup, write_json  # noqa: E402

setup(snakemake)
import json  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from harness.compile import error_summary  # noqa: E402
from harness.device import check_landed, environment_tags  # noqa: E402
from harness.inputs import CorruptInput, load_point  # noqa: E402
from harness.runner import run_emulated, run_gpu  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import EMULATED, LIBRARY, parse_shape, parse_tile  # noqa: E402

wc, p = snakemake.wildcards, snakemake.params
variant = get_variant(p.variant)
if p.arch is not None:  # a GPU platform: first make sure this node has its GPU
    check_landed(wc.platform, p.platform_spec)
# shape -> its tiles (its shape class's, when the config gives them per class)
tiles = {shape: [parse_tile(t) for t in names] for shape, names in p.tiles.items()}


def tile_names(shape):
    """The rows a shape has when it cannot be run at all."""
    if p.arch is None:
        return [EMULATED]
    return [t.name for t in tiles[shape]] if variant.kernel is not None else [LIBRARY]


def compile_outcomes() -> dict[str, dict[str, tuple[str, str]]]:
    """{shape: {tile: (status, reason)}} from this platform's compile records (GPU platforms only)."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for f in snakemake.input.get("compiled", []):
        d = json.loads(Path(f).read_text())
        for r in d["records"]:
            out.setdefault(r["shape"], {})[d["tile"]] = (r["status"], r.get("reason", ""))
    return out


COMPILED = compile_outcomes() if p.arch is not None else {}


def run_shape(shape, fp32, fmt_file, manifest_file):
    raw, ops, sha = load_point(fp32, fmt_file, manifest_file, variant.input_format)
    if p.arch is None:
        return run_emulated(variant, raw["A"], raw["B"], ops, p.tolerance), sha
    with gpu_lock():
        return run_gpu(variant, raw["A"], raw["B"], ops, tiles[shape], p.arch, p.tolerance,
                       reps=p.timing["reps"], warmup=p.timing["warmup"], compiled=COMPILED.get(shape)), sha


for shape, fp32, fmt_file, manifest_file, out in zip(p.shapes, snakemake.input.fp32, snakemake.input.formats,
                                                     snakemake.input.manifest, snakemake.output, strict=True):
    try:
        rows, sha = run_shape(shape, fp32, fmt_file, manifest_file)
    except Exception as e:  # this shape only: the others still run and keep their results
        traceback.print_exc()
        reason = str(e) if isinstance(e, CorruptInput) else error_summary(e)
        rows, sha = [{"tile": t, "status": "failed", "reason": reason} for t in tile_names(shape)], {}
    M, N, K = parse_shape(shape)
    point = {"platform": wc.platform, "target": p.arch or "cpu", "variant": variant.name, "entry": p.entry, "family": variant.family,
             "dist": wc.dist, "shape": shape, "M": M, "N": N, "K": K, "input_format": variant.input_format,
             "ops_unit": variant.ops_unit, "precision": variant.precision,
             "baseline": variant.baseline, "second_baseline": variant.second_baseline,
             "input_sha256": sha, "log": str(snakemake.log[0])}
    for r in rows:
        print(shape, r.get("tile"), r.get("status"), r.get("reason"), r.get("throughput"), flush=True)
    write_json(out, {"point": point, "env": environment_tags(), "tolerance": p.tolerance, "rows": rows})
