"""One measurement point: a variant on one input set, correctness first, then timing.

On a GPU host every configured tile of a TileLang variant (or the library call of a baseline) is
compiled or loaded from cache, checked against float64 references and, if within tolerance, timed.
On a CPU-only host the variant's arithmetic is emulated in torch for its error metrics; nothing is
timed. On both, a shape the variant's ``shape_limit`` refuses is recorded as unsupported, not run.
"""
from __future__ import annotations

import math
import re
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness import bench, power
from harness import compile as kcompile
from harness.metrics import TOLERANCE_KEYS, error_metrics
from harness.stats import StoppingRule
from kernels.registry import Operands, Unsupported, Variant, get_format
from kernels.tiles import EMULATED, LIBRARY, Tile


def judge(metrics: dict, tolerance: dict) -> list[str]:
    """Reasons a result fails: non-finite output, inexact integer output, or a metric over tolerance."""
    reasons = []
    if not (metrics.get("total_finite", True) and metrics.get("kernel_finite", True)):
        reasons.append("output has NaN/Inf")
    if metrics.get("exact") is False:
        reasons.append("integer output differs from the exact reference")
    for key, ok in metrics.items():
        if key.startswith("check_") and not ok:
            reasons.append(f"self-check {key.removeprefix('check_')} failed")
    for key in TOLERANCE_KEYS:
        limit = tolerance.get(key)
        val = metrics.get(key)
        if limit is not None and val is not None and not (val <= limit):  # NaN fails too
            reasons.append(f"{key} {val:.3g} > {limit:.3g}")
    return reasons


class References:
    """float64 products of the unquantized and of the dequantized operands, computed once per point."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor, ops: Operands, fmt_name: str, device: str):
        self.total = A.to(device).double() @ B.to(device).double().T
        a_hat, b_hat = get_format(fmt_name).dequantize(ops)
        self.kernel = a_hat.double() @ b_hat.double().T


def measure_output(variant: Variant, out: torch.Tensor, ops: Operands, refs: References) -> dict:
    real = variant.to_real(out, ops) if variant.to_real else out
    m = error_metrics(real, refs.total, "total") | error_metrics(real, refs.kernel, "kernel")
    if variant.exact_reference is not None:
        m["exact"] = bool(torch.equal(out.to(torch.int64), variant.exact_reference(ops).to(out.device)))
    return m


def run_emulated(variant: Variant, A: torch.Tensor, B: torch.Tensor, ops: Operands, tolerance: dict) -> list[dict]:
    """One ``emulated`` row: the variant's arithmetic on the CPU, judged like a GPU result.

    A shape the variant declares it cannot run (``Variant.shape_limit``, e.g. the block-scaled kernels'
    K % 128 rule, a library's alignment rule) is recorded as unsupported with the reason, as ``run_gpu``
    records every candidate, and is not emulated: numerics of a GEMM that cannot run are no result.
    """
    M, K = A.shape
    N = B.shape[0]
    if variant.shape_limit is not None and (limit := variant.shape_limit(M, N, K)):
        return [{"tile": EMULATED, "status": "unsupported", "reason": limit}]
    refs = References(A, B, ops, variant.input_format, "cpu")
    m = measure_output(variant, variant.emulate(ops), ops, refs)
    reasons = judge(m, tolerance)
    return [{"tile": EMULATED, "status": "failed" if reasons else "ok", "reason": "; ".join(reasons), **m}]


def _flops(M: int, N: int, K: int) -> float:
    return 2.0 * M * N * K


def kernel_names(source: str) -> set[str]:
    """The ``__global__`` functions a compiled TileLang kernel defines: what its timed window may hold."""
    return set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", source))


def classify_run_error(variant: Variant, exc: BaseException) -> tuple[str, str]:
    """(status, reason) of an exception raised while running one tile: unsupported only for a known
    refusal (``Unsupported``, or a library message matching one of the variant's ``run_refusals``),
    failed for everything else."""
    msg = " ".join(str(exc).split())
    if isinstance(exc, Unsupported):
        return "unsupported", msg
    for pattern, meaning in variant.run_refusals:
        if re.search(pattern, msg):
            return "unsupported", f"{meaning}: {type(exc).__name__}: {msg}"[:500]
    return "failed", kcompile.error_summary(exc)


def prepared(variant: Variant, ops: Operands) -> Operands:
    """The operands plus the variant's one-time helper tensors (``Variant.prepare``), made untimed."""
    return ops | variant.prepare(ops) if variant.prepare else dict(ops)


@dataclass
class Peer:
    """A peer (``role``: "baseline", the matched peer, or "second_baseline") ready to be timed beside a
    variant at one point: its operands (of its own format, from the same inputs), and the tile its own
    run found fastest within tolerance (None for a library call). ``skip``: why it cannot be paired."""
    role: str
    variant: Variant
    ops: Operands | None = None
    tile: Tile | None = None
    skip: str = ""


@dataclass
class Pairing:
    """How a point's fastest tile is timed against its peers (harness/bench.py ``time_paired``): the
    stopping rule, the A/A check, and the settle time of the sustained state (None: cold only).
    ``peers`` gives them when a tile has passed; ``samples`` receives each state's per-round times."""
    peers: Callable[[], list[Peer]]
    rule: StoppingRule
    warmup: int
    arch: str
    aa_check: bool = True
    sustained: tuple[float, float] | None = None
    nvml: power.Nvml | None = None
    nvml_error: str = ""
    samples: dict = field(default_factory=dict)


# the contender names of a paired window: the variant, its peers by role, and the variant again (A/A)
VARIANT, AA = "variant", "aa"
# per comparison (the contender paired with the variant): the columns of its median, of its interval
# (<stem>_lo, <stem>_hi) and of its verdict
COMPARISONS = {"baseline": ("pair_speedup", "pair_speedup", "pair_verdict"),
               "second_baseline": ("pair_speedup_vs_second", "pair_speedup_vs_second", "pair_verdict_vs_second"),
               AA: ("pair_aa_ratio", "pair_aa", "pair_aa_verdict")}


def peer_call(peer: Peer, M: int, N: int, K: int, arch: str) -> tuple[Callable[[], object], set[str] | None]:
    """The peer's timed call on its own operands, and the kernel names its window may hold (a TileLang
    peer: its own kernels; a library call: any, recorded)."""
    kernel = kcompile.build(peer.variant, M, N, K, peer.tile, arch) if peer.tile is not None else None
    own = kernel_names(kernel.get_kernel_source()) if kernel is not None else None
    dev_ops = prepared(peer.variant, {k: v.cuda() for k, v in peer.ops.items()})
    launch = peer.variant.launch
    return (lambda: launch(kernel, dev_ops)), own


def pair_columns(result: dict, prefix: str, names: dict[str, str]) -> dict:
    """The tidy columns of one paired window (``prefix``: "" cold, "sustained_"): each comparison's
    median, interval, verdict, the A/A half-width, the rounds, the stop reason and the power state."""
    cols = {f"{prefix}pair_rounds": result["rounds"], f"{prefix}pair_stop": result["stop"]}
    for role, (median, interval, verdict) in COMPARISONS.items():
        if (r := result["ratios"].get(role)) is not None:
            cols |= {f"{prefix}{median}": r.median, f"{prefix}{interval}_lo": r.lo, f"{prefix}{interval}_hi": r.hi,
                     f"{prefix}{verdict}": r.verdict}
    if "baseline" in result["ratios"]:
        cols[f"{prefix}pair_peer"] = names["baseline"]
        cols[f"{prefix}pair_halfwidth"] = result["ratios"]["baseline"].halfwidth
    if "second_baseline" in result["ratios"]:
        cols[f"{prefix}pair_second"] = names["second_baseline"]
    if AA in result["ratios"]:
        cols[f"{prefix}pair_aa_halfwidth"] = result["ratios"][AA].halfwidth
    cols |= {f"{prefix}pair_{role}_ms": statistics.median(t) for role, t in result["times_ms"].items()}
    cols |= {f"{prefix}{k}": v for k, v in result["power"].items()}
    if prefix:
        cols |= {f"{prefix}settle_s": result["settle_s"], f"{prefix}settled": result["settled"]}
    return cols


def pair_point(variant_call: Callable[[], object], own: set[str] | None, pairing: Pairing, M: int, N: int, K: int) -> dict:
    """Time the variant's fastest tile against its peers, strictly alternated, in each power state; the
    columns of ``pair_columns`` plus ``pair_skipped`` (peers that could not be paired, and why)."""
    calls, owns, names, skipped = {VARIANT: variant_call}, {VARIANT: own}, {}, []
    for peer in pairing.peers():
        if peer.skip:
            skipped.append(f"{peer.role} {peer.variant.name}: {peer.skip}")
            continue
        try:
            calls[peer.role], owns[peer.role] = peer_call(peer, M, N, K, pairing.arch)
            names[peer.role] = peer.variant.name
        except Exception as e:  # a peer that cannot be built here leaves the others paired
            traceback.print_exc()
            skipped.append(f"{peer.role} {peer.variant.name}: {kcompile.error_summary(e)}")
    if pairing.aa_check:
        calls[AA], owns[AA] = variant_call, own
    comparisons = {role: (role, VARIANT) for role in calls if role != VARIANT}
    cols: dict = {"pair_skipped": "; ".join(skipped)}
    if not comparisons:
        return cols
    states = [("cold", "", None)] + ([("sustained", "sustained_", pairing.sustained)] if pairing.sustained else [])
    for state, prefix, settle in states:
        result = bench.time_paired(calls, owns, comparisons, pairing.rule, pairing.warmup, pairing.nvml,
                                   pairing.nvml_error, settle)
        pairing.samples[state] = {"contenders": {VARIANT: "variant", **names, **({AA: "variant (A/A)"} if AA in calls else {})},
                                  # CUPTI's resolution is 1 ns: no digit beyond it
                                  "times_ms": {k: [round(t, 6) for t in v] for k, v in result["times_ms"].items()},
                                  "windows": result["windows"]}
        cols |= pair_columns(result, prefix, names)
    return cols


def run_gpu(
    variant: Variant, A: torch.Tensor, B: torch.Tensor, ops: Operands, tiles: list[Tile], arch: str,
    tolerance: dict, reps: int, warmup: int, compiled: dict[str, tuple[str, str]] | None = None,
    pairing: Pairing | None = None, spent: dict | None = None,
) -> list[dict]:
    """Every candidate (each tile, or the library call) checked, then timed. ``compiled``: per tile name, the
    (status, reason) of its compile record at this shape; a kernel whose compile is not ok (e.g. its SASS
    lacks the declared instructions) gets that status and is neither checked nor timed. With ``pairing``,
    the fastest candidate is then timed against its peers (``pair_point``), its row gaining the columns.
    ``spent``: where given, the seconds of the standalone timing (the ``bench.time_cuda`` calls) are added to
    its ``standalone_s`` and those of the paired timing (``pair_point``, its peers' loading and building
    included) to its ``paired_s``, as they happen (workflow/scripts/run_variant.py: a record's ``cost``)."""
    spent = {} if spent is None else spent
    for key in ("standalone_s", "paired_s"):
        spent.setdefault(key, 0.0)
    M, K = A.shape
    N = B.shape[0]
    dev_ops = {k: v.cuda() for k, v in ops.items()}
    refs = References(A, B, dev_ops, variant.input_format, "cuda")
    rows = []
    cc = torch.cuda.get_device_capability()
    candidates: list[tuple[str, Tile | None, str]] = []
    limit = variant.shape_limit(M, N, K) if variant.shape_limit else None
    if variant.kernel is None:
        ok = cc[0] * 10 + cc[1] >= variant.min_cc
        candidates.append((LIBRARY, None, limit or ("" if ok else f"needs compute capability >= {variant.min_cc / 10:.1f}")))
    else:
        candidates += [(t.name, t, limit or "") for t in tiles]
    compiled = compiled or {}
    launch = variant.launch
    timed: dict[str, tuple[Callable[[], object], set[str] | None]] = {}
    for tile_name, tile, skip in candidates:
        row: dict = {"tile": tile_name}
        if skip:
            rows.append(row | {"status": "unsupported", "reason": skip})
            continue
        status, why = compiled.get(tile_name, ("ok", ""))
        if status != "ok":
            rows.append(row | {"status": status, "reason": f"compile step: {why}"})
            continue
        try:
            kernel = kcompile.build(variant, M, N, K, tile, arch) if tile is not None else None
            own = kernel_names(kernel.get_kernel_source()) if kernel is not None else None
            run_ops = prepared(variant, dev_ops)
            torch.cuda.synchronize()

            def call(o: Operands = run_ops, k=kernel) -> torch.Tensor:
                return launch(k, o)

            out = call()
            torch.cuda.synchronize()
            m = measure_output(variant, out, dev_ops, refs)
            if variant.self_checks is not None:
                checks = variant.self_checks(lambda o, k=kernel: launch(k, prepared(variant, o)), M, N, K, "cuda")
                m |= {f"check_{name}": bool(ok) for name, ok in checks.items()}
            reasons = judge(m, tolerance)
            row |= m
            if reasons:  # correctness first: a wrong kernel is not timed
                rows.append(row | {"status": "failed", "reason": "; ".join(reasons)})
                continue
            # a TileLang variant's window may hold only its own kernels; a library call's are recorded
            began = time.perf_counter()
            try:
                t = bench.time_cuda(call, reps=reps, warmup=warmup, own_kernels=own)
            finally:
                spent["standalone_s"] += time.perf_counter() - began
            row |= t
            row["throughput"] = _flops(M, N, K) / (t["time_ms_median"] * 1e-3) / 1e12
            rows.append(row | {"status": "ok", "reason": ""})
            timed[tile_name] = (call, own)
        except Exception as e:  # one bad tile must not lose the others
            status, reason = classify_run_error(variant, e)
            print(f"{variant.name} {M}x{N}x{K} {tile_name}: {status}: {reason}", flush=True)
            traceback.print_exc()  # the whole traceback goes to the rule's log
            rows.append(row | {"status": status, "reason": reason})
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
    ok = [r for r in rows if r["status"] == "ok" and r["tile"] in timed]
    if pairing is not None and ok:
        best = min(ok, key=lambda r: r["time_ms_median"])
        began = time.perf_counter()
        try:
            best |= pair_point(*timed[best["tile"]], pairing, M, N, K)
        except Exception as e:  # the standalone timings stay; the row says why it has no paired ratio
            traceback.print_exc()
            best["pair_error"] = kcompile.error_summary(e)
        finally:
            spent["paired_s"] += time.perf_counter() - began
    for r in rows:
        for k, v in list(r.items()):
            if isinstance(v, float) and math.isnan(v):
                r[k] = None
    return rows
