# Run one variant on one input set: GPU (correctness, then timing) or CPU emulation (numerics only).
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import gpu_lock, setup, write_json  # noqa: E402

setup(snakemake)
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from kernels.device import check_landed, environment_tags  # noqa: E402
from kernels.inputs import load_operands  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.runner import run_emulated, run_gpu  # noqa: E402
from kernels.tiles import parse_shape, parse_tile  # noqa: E402

wc, p = snakemake.wildcards, snakemake.params
variant = get_variant(p.variant)
if p.arch is not None:  # a GPU platform: first make sure this node has its GPU
    check_landed(wc.platform, p.platform_spec)
tiles = [parse_tile(t) for t in p.tiles]
for shape, fp32, formats, manifest_file, out in zip(p.shapes, snakemake.input.fp32, snakemake.input.formats,
                                                    snakemake.input.manifest, snakemake.output, strict=True):
    manifest = json.loads(Path(manifest_file).read_text())
    raw = load_operands(Path(fp32), manifest["fp32"])
    fmt = manifest["formats"][variant.input_format]
    ops = load_operands(Path(formats) / f"{variant.input_format}.pt", fmt)
    if p.arch is None:
        rows = run_emulated(variant, raw["A"], raw["B"], ops, p.tolerance)
    else:
        with gpu_lock():
            rows = run_gpu(variant, raw["A"], raw["B"], ops, tiles, p.arch, p.tolerance,
                           reps=p.timing["reps"], warmup=p.timing["warmup"])
    M, N, K = parse_shape(shape)
    point = {"platform": wc.platform, "target": p.arch or "cpu", "variant": variant.name, "entry": p.entry, "family": variant.family,
             "dist": wc.dist, "shape": shape, "M": M, "N": N, "K": K, "input_format": variant.input_format,
             "ops_unit": variant.ops_unit, "precision": variant.precision,
             "baseline": variant.baseline, "second_baseline": variant.second_baseline,
             "input_sha256": {k: v["sha256"] for k, v in fmt.items()}}
    for r in rows:
        print(shape, r.get("tile"), r.get("status"), r.get("reason"), r.get("throughput"), flush=True)
    write_json(out, {"point": point, "env": environment_tags(), "tolerance": p.tolerance, "rows": rows})
    del raw, ops
