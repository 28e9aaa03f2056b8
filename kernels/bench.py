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


def split_by_flush(kernels: list[tuple[str, float]], flush_names: set[str]) -> list[float]:
    """Per-repetition kernel time (ms) from a time-ordered trace of (kernel name, duration in µs):
    each flush kernel opens a repetition, whose time is the sum of the kernels that follow it."""
    samples: list[float] = []
    current: float | None = None
    for name, dur_us in kernels:
        if name in flush_names:
            if current is not None:
                samples.append(current)
            current = 0.0
        elif current is not None:
            current += dur_us / 1e3
    if current is not None:
        samples.append(current)
    return samples


def time_cuda(fn: Callable[[], object], reps: int = 30, warmup: int = 5) -> dict:
    """Median, p20 and p80 of the summed kernel time of ``fn`` over ``reps`` repetitions (CUPTI).

    Each repetition is preceded by a pass over a 256 MB buffer that evicts L2; its kernel is identified
    by name and splits the trace into repetitions. Falls back to CUDA events (noting it) if the trace
    cannot be split.
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
    samples = split_by_flush([(e.name, e.time_range.elapsed_us()) for e in _cuda_kernel_events(prof)], flush_names)
    if len(samples) == reps and all(s > 0 for s in samples):
        return summarize(samples, "cupti_kernel_time")
    return time_cuda_events(fn, reps, flush)


def time_cuda_events(fn: Callable[[], object], reps: int, flush: torch.Tensor) -> dict:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        flush.bitwise_not_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], "cuda_event")
