"""What the L2 flush charges a kernel: the same call timed after the pipeline's clean flush, after the
former write flush, and with no flush at all (calls replayed back to back from a CUDA graph).

    python -m harness.flushcheck --shapes 1x8192x8192,8192x8192x8192 --variant cublas_bf16 \\
        --variant dequant_w4_int4_sym_g128 m8n64k512_s2_t128_wrow --variant tinygemm_w4_g128

A flush is right when a memory-bound call whose operands do not fit in L2 reads the same after it as
with no flush, and a compute-bound one does not move beyond noise. Where the operands do fit (4-bit
weights of 8192x8192: 34 MB in a 50 MB L2) the graph replay keeps them resident and reads faster: a
floor, not the reference. Measured numbers: harness/bench.py's docstring. Inputs, formats and checks are
the pipeline's (``harness.runner.run_gpu`` checks each call before it is timed here).
"""
from __future__ import annotations

import argparse
import statistics
import sys

from harness.plan import load_config
from harness.tryout import REPO, _tolerances
from kernels.registry import get_format, get_variant
from kernels.tiles import LIBRARY, parse_shape, parse_tile


def time_graph(fn, calls: int, kernels_per_call: int) -> float:
    """Median kernel time of one call when ``calls`` calls replay back to back from a CUDA graph: no
    flush and no host dispatch between them (CUPTI, as every other timing)."""
    import torch

    from harness.bench import _trace

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # allocations and lazy initialisation outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    trace = _trace(prof)
    if len(trace) != calls * kernels_per_call:
        raise RuntimeError(f"the graph replay launched {len(trace)} kernels, expected {calls} x {kernels_per_call}")
    per_call = [sum(d for _, d in trace[i:i + kernels_per_call]) / 1e3 for i in range(0, len(trace), kernels_per_call)]
    return statistics.median(per_call)


def check(name: str, tile: str | None, shape: str, config: dict, reps: int, arch: str) -> dict:
    import torch

    from harness import bench
    from harness import compile as kcompile
    from harness.inputs import make_operands
    from harness.runner import kernel_names, prepared, run_gpu

    v = get_variant(name)
    M, N, K = parse_shape(shape)
    A, B = make_operands("normal", M, N, K, config["seed"])
    ops = get_format(v.input_format).quantize(A, B)
    tiles = [parse_tile(tile)] if tile else []
    (row,) = run_gpu(v, A, B, ops, tiles, arch, _tolerances(config, [name])[name], reps=reps, warmup=5)
    out = {"variant": name, "tile": tile or LIBRARY, "shape": shape, "status": row["status"], "reason": row.get("reason", "")}
    if row["status"] != "ok":
        return out
    kernel = kcompile.build(v, M, N, K, parse_tile(tile), arch) if tile else None
    own = kernel_names(kernel.get_kernel_source()) if kernel is not None else None
    dev_ops = prepared(v, {k: t.cuda() for k, t in ops.items()})

    def call():
        return v.launch(kernel, dev_ops)

    for mode in bench.L2Flush.MODES:
        t = bench.time_cuda(call, reps=reps, own_kernels=own, flush=bench.L2Flush(mode))
        out[f"{mode}_flush_us"] = t["time_ms_median"] * 1e3
        out["kernels_per_call"] = t["kernels_per_rep"]
    try:
        out["no_flush_us"] = time_graph(call, reps, out["kernels_per_call"]) * 1e3
        out["clean_vs_none"] = out["clean_flush_us"] / out["no_flush_us"] - 1
        out["dirty_vs_none"] = out["dirty_flush_us"] / out["no_flush_us"] - 1
    except Exception as e:  # a call that cannot be captured still has its two flushed timings
        out["no_flush_us"] = None
        out["reason"] = f"no CUDA graph: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.flushcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", required=True, help="comma-separated MxNxK")
    p.add_argument("--variant", nargs="+", action="append", required=True, metavar=("NAME", "TILE"),
                   help="a library variant, or a TileLang variant and one tile (repeatable)")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--config", default=str(REPO / "config.yaml"))
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    config = load_config(args.config)
    for shape in args.shapes.split(","):
        for name, *tile in args.variant:
            r = check(name, tile[0] if tile else None, shape, config, args.reps, args.arch)
            cols = " ".join(f"{k}={r[k]:.2f}" if isinstance(r.get(k), float) else f"{k}={r.get(k)}"
                            for k in ("dirty_flush_us", "clean_flush_us", "no_flush_us", "clean_vs_none", "dirty_vs_none"))
            print(f"{shape:>16} {name:<26} {r['tile']:<28} {r['status']:<6} {cols} {r.get('reason') or ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
