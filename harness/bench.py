"""GPU timing: kernel time per repetition with the L2 cache flushed before each one.

TileLang's profiler (``do_bench``) reports either event time around each Python call (dominated by
the ~45 µs host dispatch for small kernels) or a CUPTI *mean*; a distribution of device time per
repetition needs the CUPTI events themselves, so this module reads them through torch.profiler.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than the H200's 50 MB L2


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_ms: list[float], method: str) -> dict:
    return {
        "time_ms_median": statistics.median(samples_ms),
        "time_ms_p20": _quantile(samples_ms, 0.2),
        "time_ms_p80": _quantile(samples_ms, 0.8),
        "time_ms_min": min(samples_ms),
        "reps": len(samples_ms),
        "timing_method": method,
    }


def _cuda_kernel_events(prof) -> list:
    evs = [e for e in prof.events() if getattr(getattr(e, "device_type", None), "name", "") == "CUDA"]
    evs = [e for e in evs if not getattr(e, "is_user_annotation", False)]
    return sorted(evs, key=lambda e: e.time_range.start)


def split_by_flush(kernels: list[tuple[str, float]], flush_names: set[str]) -> list[tuple[tuple[str, ...], float]]:
    """Per-repetition (kernel names, kernel time in ms) from a time-ordered trace of (kernel name,
    duration in µs): each flush kernel opens a repetition, whose time is the sum of the kernels that
    follow it up to the next flush."""
    reps: list[tuple[tuple[str, ...], float]] = []
    names: list[str] | None = None
    total = 0.0
    for name, dur_us in kernels:
        if name in flush_names:
            if names is not None:
                reps.append((tuple(names), total))
            names, total = [], 0.0
        elif names is not None:
            names.append(name)
            total += dur_us / 1e3
    if names is not None:
        reps.append((tuple(names), total))
    return reps


class ForeignKernel(Exception):
    """The timed window of a variant held a kernel that is not the variant's own."""


def window_kernels(reps: list[tuple[tuple[str, ...], float]], own: set[str] | None = None) -> dict:
    """What was summed per repetition: the kernel names (in launch order) and how many.

    Every repetition must launch the same kernels. With ``own`` (the names of the variant's compiled
    kernels) any other kernel in the window is refused: its time would be charged to the variant.
    """
    sequences = {names for names, _ in reps}
    if len(sequences) != 1:
        raise ForeignKernel(f"repetitions launched different kernels: {sorted(sequences)[:3]}")
    (names,) = sequences
    if not names:
        raise ForeignKernel("no kernel ran in the timed window")
    if own is not None and (foreign := sorted(set(names) - own)):
        raise ForeignKernel(f"timed window holds kernels other than the variant's own {sorted(own)}: {foreign}")
    return {"timed_kernels": ";".join(names), "kernels_per_rep": len(names)}


def time_cuda(fn: Callable[[], object], reps: int = 30, warmup: int = 5, own_kernels: set[str] | None = None) -> dict:
    """Median, p20 and p80 of the summed kernel time of ``fn`` over ``reps`` repetitions (CUPTI), and
    the names of the kernels summed (see ``window_kernels``; ``own_kernels`` refuses any other).

    Each repetition is preceded by a pass over a 256 MB buffer that evicts L2; its kernel is identified
    by name and splits the trace into repetitions. There is no fallback to event timing: events would
    time the host dispatch and every kernel between them, which is not what the row claims.
    """
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(warmup):
        flush.bitwise_not_()
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as probe:
        flush.bitwise_not_()
        torch.cuda.synchronize()
    flush_names = {e.name for e in _cuda_kernel_events(probe)}

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    split = split_by_flush([(e.name, e.time_range.elapsed_us()) for e in _cuda_kernel_events(prof)], flush_names)
    if len(split) != reps:
        raise RuntimeError(f"the CUPTI trace split into {len(split)} repetitions, expected {reps}")
    window = window_kernels(split, own_kernels)
    return summarize([t for _, t in split], "cupti_kernel_time") | window
