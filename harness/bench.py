"""GPU timing: kernel time per call with a clean L2 before each one, alone (``time_cuda``) or strictly
alternated with peers (``time_paired``).

TileLang's profiler (``do_bench``) reports either event time around each Python call (dominated by
the ~45 µs host dispatch for small kernels) or a CUPTI *mean*; a distribution of device time per
call needs the CUPTI events themselves, so this module reads them through torch.profiler.

The flush is a read-only pass (``L2Flush``). A write pass over a large buffer (``bitwise_not_``, used
until December 2026) evicts the kernel's operands but leaves L2 full of dirty lines, and the timed
kernel pays for writing them back to HBM as it evicts them. A read pass leaves only clean lines, whose
eviction costs nothing. ``python -m harness.flushcheck`` on the H200 (2026-12-03, median µs; write
flush / this flush / no flush, calls replayed back to back from a CUDA graph):
  cuBLAS bf16     1x8192x8192   41.42 / 34.08 / 34.34      1x4096x14336   38.45 / 30.50 / 30.56
  W4A16 int4 g128 1x8192x8192   21.89 / 21.22 / 20.29      tinygemm       21.22 / 20.26 / 19.14
  fp8 ws 8192³    735.9 / 718.4 / 808.8 (no flush: back to back, the card heats and loses clock)
The 4-bit weights (29–34 MB) fit in the 50 MB L2, so with no flush they stay resident: that column is
a floor for them, not the reference; bf16's 128 MB do not fit, and this flush matches no flush there.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from harness import power
from harness.stats import Ratio, StoppingRule, paired_ratio

L2_FLUSH_BYTES = 256 * 1024 * 1024  # five times the H200's 50 MB L2
FLUSH_ROW = 8192  # float32 elements per row of the flush buffer; one output per row


class L2Flush:
    """Evicts L2 before a timed call. ``clean`` (the default, what every timing uses): a row sum over a
    256 MB buffer, which reads it and writes one float per 32 KB row (a 64 KB output, fixed, reused);
    no memset, no atomics, one kernel. ``dirty``: the former write pass, kept only to measure what it
    cost (``harness.flushcheck``)."""

    MODES = ("clean", "dirty")

    def __init__(self, mode: str = "clean", device: str = "cuda", nbytes: int = L2_FLUSH_BYTES):
        if mode not in self.MODES:
            raise ValueError(f"unknown flush mode {mode!r}; known: {', '.join(self.MODES)}")
        self.mode = mode
        rows = max(1, nbytes // 4 // FLUSH_ROW)
        self.buffer = torch.zeros(rows, FLUSH_ROW, dtype=torch.float32, device=device)
        self.out = torch.empty(rows, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        if self.mode == "clean":
            torch.sum(self.buffer, dim=1, out=self.out)
        else:
            self.buffer.view(torch.int32).bitwise_not_()


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
    """Per call (kernel names, kernel time in ms) from a time-ordered trace of (kernel name, duration in
    µs): each run of consecutive flush kernels opens a call, whose time is the sum of the kernels that
    follow it up to the next flush."""
    reps: list[tuple[tuple[str, ...], float]] = []
    names: list[str] | None = None
    total = 0.0
    in_flush = False
    for name, dur_us in kernels:
        if name in flush_names:
            if names is not None and not in_flush:
                reps.append((tuple(names), total))
            if not in_flush:
                names, total = [], 0.0
            in_flush = True
        else:
            in_flush = False
            if names is not None:
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


def flush_kernel_names(flush: L2Flush) -> set[str]:
    """The names of the kernels one flush launches: they split a trace into calls."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as probe:
        flush()
        torch.cuda.synchronize()
    return {e.name for e in _cuda_kernel_events(probe)}


def _trace(prof) -> list[tuple[str, float]]:
    return [(e.name, e.time_range.elapsed_us()) for e in _cuda_kernel_events(prof)]


def time_cuda(fn: Callable[[], object], reps: int = 30, warmup: int = 5, own_kernels: set[str] | None = None,
              flush: L2Flush | None = None) -> dict:
    """Median, p20 and p80 of the summed kernel time of ``fn`` over ``reps`` calls (CUPTI), and the names
    of the kernels summed (see ``window_kernels``; ``own_kernels`` refuses any other).

    Each call is preceded by a clean L2 flush (``L2Flush``), whose kernel is identified by name and
    splits the trace into calls. There is no fallback to event timing: events would time the host
    dispatch and every kernel between them, which is not what the row claims. ``flush``: another flush
    (``harness.flushcheck`` compares them); the pipeline always uses the clean one.
    """
    flush = flush or L2Flush()
    for _ in range(warmup):
        flush()
        fn()
    flush_names = flush_kernel_names(flush)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        torch.cuda.synchronize()
    split = split_by_flush(_trace(prof), flush_names)
    if len(split) != reps:
        raise RuntimeError(f"the CUPTI trace split into {len(split)} repetitions, expected {reps}")
    window = window_kernels(split, own_kernels)
    return summarize([t for _, t in split], "cupti_kernel_time") | window


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """Round i runs the contenders rotated by i // 2, reversed in odd rounds: over 2k rounds each is first,
    second, ... equally often and each runs before each other one equally often. Rotation alone is not
    enough with three or more: in the H200 smoke test of 5a313b5 the variant ran right after its A/A
    copy in two rounds of three, and the A/A ratio read 0.9987 [0.9970, 0.9997], "slower"."""
    k = (round_index // 2) % len(names)
    order = list(names[k:]) + list(names[:k])
    return order[::-1] if round_index % 2 else order


def assign_calls(split: list[tuple[tuple[str, ...], float]], names: Sequence[str], first_round: int,
                 rounds: int) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The calls of a trace of ``rounds`` rounds (launched in ``round_order``), per contender."""
    expected = rounds * len(names)
    if len(split) != expected:
        raise RuntimeError(f"the CUPTI trace split into {len(split)} calls, expected {expected} "
                           f"({rounds} rounds of {len(names)} contenders)")
    out: dict[str, list] = {n: [] for n in names}
    calls = iter(split)
    for i in range(first_round, first_round + rounds):
        for name in round_order(names, i):
            out[name].append(next(calls))
    return out


def _settle(calls: dict[str, Callable], flush: L2Flush, sampler: power.Sampler, min_s: float, max_s: float,
            window_s: float = 0.5, tolerance: float = 0.01) -> tuple[float, bool]:
    """Run the contenders back to back (each after a flush, as timed) until the SM clock has settled and
    ``min_s`` has passed, or ``max_s``; return the seconds run and whether the clock settled (False,
    too, when the clock cannot be read: then it ran ``min_s``)."""
    t0 = time.monotonic()
    names = list(calls)
    i = 0
    while True:
        for name in round_order(names, i):
            flush()
            calls[name]()
        i += 1
        if i % 8:
            continue
        torch.cuda.synchronize()
        elapsed = time.monotonic() - t0
        ok = sampler.read is not None and power.settled(sampler.since(t0), window_s, tolerance)
        if (elapsed >= min_s and (ok or sampler.read is None)) or elapsed >= max_s:
            return elapsed, ok


def time_paired(calls: dict[str, Callable[[], object]], own: dict[str, set[str] | None],
                comparisons: dict[str, tuple[str, str]], rule: StoppingRule, warmup: int = 5,
                nvml: power.Nvml | None = None, nvml_error: str = "", settle: tuple[float, float] | None = None) -> dict:
    """Time ``calls`` strictly alternated, each call after a clean flush, in rounds (``round_order``),
    until ``rule`` stops; return each comparison's paired ratio and the window's power state.

    ``comparisons``: name -> (reference, contender); its ratio is reference time / contender time per
    round (the contender's speedup over the reference). ``own``: per call, the kernel names its window
    may hold (None: any, recorded). ``settle`` (min_s, max_s): first run the calls back to back until
    the SM clock settles (the sustained power state); None times them at once (the cold burst).
    """
    names = list(calls)
    flush = L2Flush()
    for _ in range(warmup):
        for name in names:
            flush()
            calls[name]()
    flush_names = flush_kernel_names(flush)
    times: dict[str, list[float]] = {n: [] for n in names}
    windows: dict[str, dict] = {}
    ratios: dict[str, Ratio] = {}
    stop = None
    with power.Sampler(nvml.sample if nvml is not None else None) as sampler:
        settle_s, settled = _settle(calls, flush, sampler, *settle) if settle else (0.0, None)
        t0 = time.monotonic()
        while stop is None:
            first = len(times[names[0]])
            cycle = 2 * len(names)  # whole cycles of round_order, so that every order runs equally often
            batch = -(-rule.next_batch(first) // cycle) * cycle
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for i in range(first, first + batch):
                    for name in round_order(names, i):
                        flush()
                        calls[name]()
                torch.cuda.synchronize()
            per = assign_calls(split_by_flush(_trace(prof), flush_names), names, first, batch)
            for name, split in per.items():
                windows[name] = window_kernels(split, own.get(name))
                times[name] += [t for _, t in split]
            ratios = {c: paired_ratio(times[ref], times[con], same_within=rule.same_within)
                      for c, (ref, con) in comparisons.items()}
            stop = rule.done(list(ratios.values()))
        samples = sampler.since(t0)
    state = power.summarize(samples, nvml.default_sm_clock_mhz if nvml else None, nvml_error)
    return {"rounds": len(times[names[0]]), "stop": stop, "ratios": ratios, "times_ms": times, "windows": windows,
            "settle_s": settle_s, "settled": settled, "power": state}
