"""Try tiles before they go into config.yaml: one call compiles every (variant, shape, tile) in
parallel, then, on a GPU, checks each against the float64 references and times it beside the
variant's peers exactly as a pipeline run does (``harness.runner.run_gpu``), and prints one table.

    python -m harness.tryout --shapes 8192x8192x8192,16x8192x8192 \\
        --variant fp8_e4m3_ws m128n256k128_s3_t384_z16 m64n16k256_s10_t256_swapab
    python -m harness.tryout --plan tries.txt --json rows.json

A plan file gives each shape its own tiles, a line ``SHAPE VARIANT TILE [TILE ...]`` (``#`` starts a comment); its
shapes are timed in the file's order. Every compile of the call runs first, in parallel; then each shape's rows
are written to ``--json`` as soon as they are timed, and an interrupt (``timeout -s INT``) stops the timing
between two runs with every finished shape kept, so a call with a hard limit loses only the shape it was on.

``--compile-only`` (any host) stops after the compile records: status, SASS tensor-core opcode,
registers, spills. What this prints is for choosing tiles; published numbers come from the pipeline.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from harness import compile as kcompile
from harness.atomic import write_json
from harness.plan import load_config
from kernels.registry import get_format, get_variant, tile_problem
from kernels.tiles import parse_shape, parse_tile

REPO = Path(__file__).resolve().parents[1]


def compile_job(job: tuple[str, str, str, str]) -> dict:
    """One compile record (fills TileLang's cache, so the timed run loads it); runs in a worker."""
    name, shape, tile, arch = job
    with tempfile.TemporaryDirectory() as tmp:
        rec = kcompile.compile_record(get_variant(name), *parse_shape(shape), parse_tile(tile), arch, Path(tmp))
    return {k: rec.get(k) for k in ("variant", "tile", "status", "reason", "sass_mma", "registers",
                                    "sass_local_loads", "sass_local_stores", "smem_dynamic_bytes")} | {"shape": shape}


def _tolerances(config: dict, names) -> dict[str, dict]:
    """Each variant's tolerances in the config (none for a variant it does not run: every finite result passes)."""
    return {n: config["variants"].get(n, {}).get("tolerance", {}) for n in names}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness.tryout", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", help="comma-separated MxNxK")
    p.add_argument("--variant", nargs="+", action="append", metavar=("NAME", "TILE"),
                   help="a TileLang variant and its tiles (repeatable), tried at every --shapes shape")
    p.add_argument("--plan", help="a file of lines 'SHAPE VARIANT TILE [TILE ...]': each shape its own tiles "
                   "(instead of --shapes and --variant)")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--dist", default="normal")
    p.add_argument("--config", default=str(REPO / "config.yaml"),
                   help="the pipeline config whose seed and tolerances apply (validated as the pipeline does)")
    p.add_argument("--seed", type=int, help="input seed (default: the config's, so inputs equal the pipeline's)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--json", help="also write every row here")
    return p.parse_args(argv)


# What one call tries: (shape, {variant: [tile names]}) in the order they are timed
Requests = list[tuple[str, dict[str, list[str]]]]


def read_plan(path: str) -> Requests:
    """A plan file's requests, a shape's lines merged in the order they first appear; a line that is not
    'SHAPE VARIANT TILE [TILE ...]' is refused with its file and line number."""
    requests: dict[str, dict[str, list[str]]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) < 3:
            raise SystemExit(f"{path}:{number}: expected 'SHAPE VARIANT TILE [TILE ...]', got {line.strip()!r}")
        shape, name, *tiles = words
        try:
            parse_shape(shape)
        except ValueError as e:
            raise SystemExit(f"{path}:{number}: {e}") from None
        have = requests.setdefault(shape, {}).setdefault(name, [])
        have += [t for t in dict.fromkeys(tiles) if t not in have]
    if not requests:
        raise SystemExit(f"{path}: no 'SHAPE VARIANT TILE' line")
    return list(requests.items())


def requests_of(args: argparse.Namespace) -> Requests:
    """The call's requests, from --plan or from every --shapes shape with every --variant, each tile checked
    against its variant's kernel before anything compiles."""
    if args.plan and (args.shapes or args.variant):
        raise SystemExit("--plan replaces --shapes and --variant: give one or the other")
    if args.plan:
        requests = read_plan(args.plan)
    elif args.shapes and args.variant:
        shapes = args.shapes.split(",")
        for s in shapes:
            parse_shape(s)
        requests = [(s, {name: tiles for name, *tiles in args.variant}) for s in shapes]
    else:
        raise SystemExit("give --shapes and --variant, or --plan")
    for _, plan in requests:
        for name, tiles in plan.items():
            v = get_variant(name)
            if v.kernel is None or not tiles:
                raise SystemExit(f"--variant {name}: give a TileLang variant and at least one tile")
            for t in tiles:
                if problem := tile_problem(v, parse_tile(t)):
                    raise SystemExit(f"--variant {name}: {problem}")
    return requests


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    requests = requests_of(args)
    # the config a timed try takes its seed and tolerances from, refused before anything compiles
    config = None if args.compile_only else load_config(args.config)
    jobs = [(n, s, t, args.arch) for s, plan in requests for n, ts in plan.items() for t in ts]
    with ProcessPoolExecutor(max(1, min(args.jobs, len(jobs)))) as pool:
        compiled = list(pool.map(compile_job, jobs))
    if args.compile_only:
        _print(compiled, True)
        _write(args.json, compiled)
        return 0
    rows: list[dict] = []

    def timed(shape_rows: list[dict]) -> None:
        rows.extend(shape_rows)
        _write(args.json, rows)

    finished = _run(requests, compiled, args, config, timed)
    _print(rows, False)
    if not finished:
        print(f"interrupted: {len(rows)} rows of the shapes timed before it are kept", file=sys.stderr)
        return 130
    return 0


def _write(path: str | None, rows: list[dict]) -> None:
    """The rows so far, replaced atomically: an interrupt mid-write leaves the previous shapes' rows whole."""
    if path:
        write_json(path, rows)


def _run(requests: Requests, compiled: list[dict], args, config: dict, timed) -> bool:
    """Check and time each shape's tiles beside their variants' peers, handing each shape's rows to ``timed``;
    False if an interrupt stopped it (the shape it was on is dropped)."""
    import torch

    from harness.inputs import make_operands
    from harness.runner import run_gpu
    if not torch.cuda.is_available():
        raise SystemExit("no GPU here: --compile-only checks the builds on any host; timing needs the GPU")
    seed = config["seed"] if args.seed is None else args.seed
    status = {(r["variant"], r["shape"], r["tile"]): (r["status"], r["reason"] or "") for r in compiled}
    try:
        for shape, plan in requests:
            peers = {b for n in plan for b in (get_variant(n).baseline, get_variant(n).second_baseline) if b}
            names = [*sorted(peers), *plan]
            tolerance = _tolerances(config, names)
            M, N, K = parse_shape(shape)
            A, B = make_operands(args.dist, M, N, K, seed)
            here = []
            for name in names:
                v = get_variant(name)
                ops = get_format(v.input_format).quantize(A, B)
                tiles = [parse_tile(t) for t in plan.get(name, [])]
                done = {t: status[name, shape, t] for t in plan.get(name, [])}
                here += [r | {"variant": name, "shape": shape} for r in
                         run_gpu(v, A, B, ops, tiles, args.arch, tolerance[name], reps=args.reps, warmup=5,
                                 compiled=done)]
            fastest = {}  # variant -> its best time at this shape
            for r in here:
                if r["status"] == "ok":
                    fastest[r["variant"]] = min(fastest.get(r["variant"], r["time_ms_median"]), r["time_ms_median"])
            for r in here:
                base = get_variant(r["variant"]).baseline
                if r["status"] == "ok" and base in fastest:
                    r["speedup"] = fastest[base] / r["time_ms_median"]
            timed(here)
    except KeyboardInterrupt:
        return False
    return True


def _print(rows: list[dict], compile_only: bool) -> None:
    if compile_only:
        for r in rows:
            spills = (r.get("sass_local_loads") or 0) + (r.get("sass_local_stores") or 0)
            print(f"{r['shape']:>16} {r['variant']:<24} {r['tile']:<32} {r['status']:<11} "
                  f"{','.join(r.get('sass_mma') or {}) or '-':<34} regs={r.get('registers')} spills={spills} "
                  f"smem={r.get('smem_dynamic_bytes')} {r.get('reason') or ''}")
        return
    for r in rows:
        us = f"{r['time_ms_median'] * 1e3:9.1f} us" if r.get("time_ms_median") else " " * 12
        speed = f"{r['speedup']:.3f}x" if r.get("speedup") else ""
        print(f"{r['shape']:>16} {r['variant']:<24} {r['tile']:<32} {r['status']:<11} {us} "
              f"calc_diff={r.get('kernel_calc_diff')} {speed} {r.get('reason') or ''}")


if __name__ == "__main__":
    sys.exit(main())
