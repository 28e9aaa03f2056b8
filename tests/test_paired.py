"""Paired timing on synthetic traces: the clean flush, the interval, the verdict, the stopping rule, the
rotation of rounds, the A/A check and the throttle flag (harness/stats.py, harness/power.py,
harness/bench.py ``time_paired``). No GPU: torch.profiler and the kernels are replaced by a recorder."""
import contextlib
import math
import random

import pytest
import torch

from harness import bench, power, runner
from harness.stats import Ratio, StoppingRule, median_interval_ranks, paired_ratio

# ---- the interval of a median -------------------------------------------------------------------

@pytest.mark.parametrize("n, ranks", [(5, None), (6, (0, 5)), (10, (1, 8)), (30, (9, 20)), (100, (39, 60))])
def test_median_interval_ranks_are_the_binomial_order_statistics(n, ranks):
    # the textbook table of distribution-free 95 % intervals for a median (1-based: n=30 -> 10th and 21st)
    assert median_interval_ranks(n) == ranks


def test_the_median_interval_covers_the_true_median_at_least_95_percent_of_the_time():
    rng = random.Random(7)
    hits = 0
    for _ in range(2000):
        ratios = [rng.lognormvariate(0.0, 0.05) for _ in range(31)]  # true median exactly 1.0
        r = paired_ratio(ratios, [1.0] * 31)
        hits += r.lo <= 1.0 <= r.hi
    assert 0.945 <= hits / 2000 <= 0.99


def test_verdicts_read_the_interval_against_one():
    assert Ratio(1.10, 1.05, 1.15, 40).verdict == "faster"
    assert Ratio(0.90, 0.85, 0.95, 40).verdict == "slower"
    assert Ratio(1.01, 0.99, 1.03, 40).verdict == "same"
    assert Ratio(1.0, -math.inf, math.inf, 3).verdict == "same"
    assert Ratio(1.0, 0.99, 1.01, 40).halfwidth == pytest.approx(0.01)


def test_a_difference_below_the_verdicts_resolution_reads_same():
    # an A/A at a very narrow interval: it misses 1 by a few 1e-4 (an order effect, or chance)
    aa = Ratio(1.0003, 1.0001, 1.0005, 200, same_within=0.005)
    assert aa.verdict == "same" and Ratio(1.0003, 1.0001, 1.0005, 200).verdict == "faster"
    assert Ratio(0.9970, 0.9950, 0.9990, 200, same_within=0.005).verdict == "same"
    # beyond the resolution the interval decides as before
    assert Ratio(1.006, 1.001, 1.011, 200, same_within=0.005).verdict == "faster"
    assert Ratio(0.990, 0.985, 0.995, 200, same_within=0.005).verdict == "slower"
    assert Ratio(1.02, 0.99, 1.05, 40, same_within=0.005).verdict == "same"  # the interval holds 1
    # paired_ratio hands the resolution on
    r = paired_ratio([1.0003] * 40, [1.0] * 40, same_within=0.005)
    assert r.same_within == 0.005 and r.verdict == "same"
    with pytest.raises(ValueError, match="same_within"):
        StoppingRule(same_within=-0.1)


def test_paired_ratio_is_the_peer_time_over_the_variant_time_per_round():
    # drift: both slow down together round by round; the ratio of each round stays 1.25
    peer = [1.0 + 0.01 * i for i in range(40)]
    variant = [p / 1.25 for p in peer]
    r = paired_ratio(peer, variant)
    assert r.median == pytest.approx(1.25) and r.lo == pytest.approx(1.25) and r.verdict == "faster"
    with pytest.raises(ValueError, match="differ in length"):
        paired_ratio(peer, variant[:-1])
    with pytest.raises(ValueError, match="non-positive"):
        paired_ratio([1.0] * 6, [0.0] * 6)


def test_the_stopping_rule_stops_at_the_target_or_the_cap_and_doubles_in_between():
    rule = StoppingRule(target_halfwidth=0.005, min_rounds=30, max_rounds=120)
    assert [rule.next_batch(n) for n in (0, 30, 60, 100, 120)] == [30, 30, 60, 20, 0]
    narrow, wide = Ratio(1.0, 0.998, 1.002, 30), Ratio(1.0, 0.98, 1.02, 30)
    assert rule.done([narrow]) == "target"
    assert rule.done([narrow, wide]) is None  # every ratio must be narrow
    assert rule.done([Ratio(1.0, 0.998, 1.002, 20)]) is None  # not before min_rounds
    assert rule.done([Ratio(1.0, 0.98, 1.02, 120)]) == "cap"
    with pytest.raises(ValueError, match="min_rounds"):
        StoppingRule(min_rounds=50, max_rounds=40)


# ---- the flush ----------------------------------------------------------------------------------

def test_the_pipeline_flush_reads_and_leaves_its_buffer_untouched():
    """The timed path's default flush is the clean one: a read pass (no dirty lines left in L2)."""
    flush = bench.L2Flush(device="cpu", nbytes=4 * bench.FLUSH_ROW * 4)
    assert flush.mode == "clean"
    flush.buffer.normal_()
    before = flush.buffer.clone()
    flush()
    assert torch.equal(flush.buffer, before)
    assert torch.allclose(flush.out, before.sum(dim=1))
    dirty = bench.L2Flush("dirty", device="cpu", nbytes=bench.FLUSH_ROW * 4)
    dirty()
    assert not torch.equal(dirty.buffer, torch.zeros_like(dirty.buffer))  # the former write pass writes
    with pytest.raises(ValueError, match="unknown flush mode"):
        bench.L2Flush("none", device="cpu")
    assert bench.time_cuda.__defaults__[-1] is None  # no flush given: L2Flush() (clean) is made


def test_a_run_of_flush_kernels_opens_one_call():
    trace = [("flush_a", 50.0), ("flush_b", 10.0), ("gemm", 20.0), ("flush_a", 50.0), ("flush_b", 10.0), ("gemm", 22.0)]
    split = bench.split_by_flush(trace, {"flush_a", "flush_b"})
    assert split == [(("gemm",), pytest.approx(0.020)), (("gemm",), pytest.approx(0.022))]


@pytest.mark.parametrize("k", [2, 3, 4])
def test_rounds_balance_positions_and_pairwise_order(k):
    names = [f"c{i}" for i in range(k)]
    orders = [bench.round_order(names, i) for i in range(2 * k)]
    for n in names:  # each contender in each position equally often
        assert sorted(o.index(n) for o in orders) == sorted(list(range(k)) * 2)
    for a in names:  # each runs before each other one in half the rounds
        for b in set(names) - {a}:
            assert sum(o.index(a) < o.index(b) for o in orders) == k
    if k == 3:  # all six orders of three
        assert len({tuple(o) for o in orders}) == 6


def test_calls_are_assigned_back_to_their_contenders():
    names = ["variant", "baseline", "aa"]
    split = [((n,), float(i)) for i, n in enumerate(n for r in range(1, 3) for n in bench.round_order(names, r))]
    per = bench.assign_calls(split, names, first_round=1, rounds=2)
    assert {n: [k[0][0] for k in calls] for n, calls in per.items()} == {n: [n, n] for n in names}
    with pytest.raises(RuntimeError, match="expected 6"):
        bench.assign_calls(split[:-1], names, first_round=1, rounds=2)


# ---- time_paired on a recorded trace ------------------------------------------------------------

class FakeGpu:
    """Stands in for CUDA: flushes and calls append (kernel, µs) to a trace that the profiler returns."""

    def __init__(self, monkeypatch, seed=0):
        self.trace, self.rng = [], random.Random(seed)
        gpu = self

        class Flush:
            def __init__(self, *a, **k):
                pass

            def __call__(self):
                gpu.trace.append(("flush", 80.0))

        @contextlib.contextmanager
        def profile(*a, **k):
            gpu.trace.clear()
            yield None

        monkeypatch.setattr(bench, "L2Flush", Flush)
        monkeypatch.setattr(bench, "flush_kernel_names", lambda flush: {"flush"})
        monkeypatch.setattr(bench, "_trace", lambda prof: list(gpu.trace))
        monkeypatch.setattr(bench.torch.profiler, "profile", profile)
        monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)

    def kernel(self, name, us, noise):
        return lambda: self.trace.append((name, us * self.rng.lognormvariate(0.0, noise)))


def _pair(gpu, variant_us, peer_us, noise, rule, aa=True):
    calls = {"variant": gpu.kernel("main_kernel", variant_us, noise), "baseline": gpu.kernel("nvjet", peer_us, noise)}
    comparisons = {"baseline": ("baseline", "variant")}
    if aa:
        calls["aa"] = calls["variant"]
        comparisons["aa"] = ("aa", "variant")
    own = {"variant": {"main_kernel"}, "aa": {"main_kernel"}, "baseline": None}
    return bench.time_paired(calls, own, comparisons, rule, warmup=1)


def test_a_faster_variant_reads_faster_and_its_a_a_check_reads_same(monkeypatch):
    gpu = FakeGpu(monkeypatch)
    res = _pair(gpu, 100.0, 110.0, 0.01, StoppingRule(0.005, 30, 400))
    base, aa = res["ratios"]["baseline"], res["ratios"]["aa"]
    assert base.verdict == "faster" and base.lo <= 1.10 <= base.hi and base.lo > 1.0
    assert aa.verdict == "same" and aa.lo <= 1.0 <= aa.hi and aa.halfwidth <= 0.01
    assert res["stop"] == "target" and res["rounds"] % 6 == 0
    assert res["windows"]["variant"] == {"timed_kernels": "main_kernel", "kernels_per_rep": 1}
    assert res["power"]["throttled"] is None and res["power"]["clock_source"] == "unavailable"


def test_equal_kernels_read_same_and_noise_stops_at_the_cap(monkeypatch):
    gpu = FakeGpu(monkeypatch, seed=3)
    res = _pair(gpu, 100.0, 100.0, 0.08, StoppingRule(0.005, 30, 90), aa=False)
    assert res["ratios"]["baseline"].verdict == "same"
    assert res["stop"] == "cap" and 90 <= res["rounds"] < 96 and set(res["ratios"]) == {"baseline"}


def test_quiet_large_kernels_stop_after_the_first_batch(monkeypatch):
    gpu = FakeGpu(monkeypatch, seed=5)
    res = _pair(gpu, 700.0, 690.0, 0.0005, StoppingRule(0.005, 30, 400))
    assert res["rounds"] == 30 and res["stop"] == "target" and res["ratios"]["baseline"].verdict == "slower"


def test_a_foreign_kernel_in_a_paired_window_is_refused(monkeypatch):
    gpu = FakeGpu(monkeypatch)
    calls = {"variant": gpu.kernel("elementwise_mul", 5.0, 0.0), "baseline": gpu.kernel("nvjet", 100.0, 0.0)}
    with pytest.raises(bench.ForeignKernel, match="elementwise_mul"):
        bench.time_paired(calls, {"variant": {"main_kernel"}}, {"baseline": ("baseline", "variant")}, StoppingRule())


def test_pair_columns_name_every_comparison_and_the_power_state(monkeypatch):
    gpu = FakeGpu(monkeypatch)
    res = _pair(gpu, 100.0, 120.0, 0.01, StoppingRule(0.005, 30, 400))
    res["power"] = power.summarize([power.Sample(0.0, 1980.0, 650.0, 60.0), power.Sample(0.1, 1400.0, 700.0, 70.0)], 1980.0)
    cold = runner.pair_columns(res, "", {"baseline": "cublas_fp8_e4m3_fastacc"})
    assert cold["pair_peer"] == "cublas_fp8_e4m3_fastacc" and cold["pair_verdict"] == "faster"
    assert cold["pair_speedup_lo"] <= cold["pair_speedup"] <= cold["pair_speedup_hi"]
    assert cold["pair_aa_verdict"] == "same" and "pair_aa_halfwidth" in cold and "pair_second" not in cold
    assert cold["sm_clock_mhz_min"] == 1400.0 and cold["throttled"] is True
    res |= {"settle_s": 2.5, "settled": True}
    sustained = runner.pair_columns(res, "sustained_", {"baseline": "cublas_fp8_e4m3_fastacc"})
    assert sustained["sustained_pair_speedup"] == cold["pair_speedup"] and sustained["sustained_settle_s"] == 2.5


# ---- the power state ----------------------------------------------------------------------------

def test_throttled_is_a_clock_below_three_quarters_of_the_default():
    samples = [power.Sample(i * 0.01, c, 600.0, 55.0) for i, c in enumerate([1980, 1975, 1400, 1960])]
    s = power.summarize(samples, 1980.0)
    assert s["throttled"] is True and s["sm_clock_mhz_min"] == 1400 and s["clock_samples"] == 4
    assert power.summarize(samples[:2] + samples[3:], 1980.0)["throttled"] is False
    assert power.summarize(samples, None)["throttled"] is None  # no default clock: no claim
    empty = power.summarize([], None, "ModuleNotFoundError: No module named 'pynvml'")
    assert empty["throttled"] is None and "pynvml" in empty["clock_source"]


def test_the_clock_has_settled_when_two_windows_agree():
    ramp = [power.Sample(i * 0.05, 1980.0 - 20 * i) for i in range(40)]  # falling 400 MHz/s
    flat = ramp + [power.Sample(2.0 + i * 0.05, 1200.0) for i in range(30)]
    assert not power.settled(ramp, 0.5, 0.01)
    assert power.settled(flat, 0.5, 0.01)
    assert not power.settled(flat[-5:], 0.5, 0.01)  # less than two windows of samples


def test_the_sampler_collects_while_open_and_tolerates_failed_reads():
    reads = iter([power.Sample(0.0, 1980.0), RuntimeError("nvml busy")] + [power.Sample(1.0, 1900.0)] * 10000)

    def read():
        x = next(reads)
        if isinstance(x, Exception):
            raise x
        return x

    with power.Sampler(read, interval_s=0.001) as s:
        import time
        time.sleep(0.05)
    assert len(s.samples) >= 2 and s.samples[0].sm_clock_mhz == 1980.0
    with power.Sampler(None) as none:
        pass
    assert none.samples == []


# ---- what a paired run job is given (harness/plan.py) ---------------------------------------------

def _plan(**timing):
    import yaml
    from conftest import REPO

    from harness.plan import Plan, validate

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["timing"].update(timing)
    cfg["run_on"] = ["h200"]
    return Plan(validate(cfg, check_shapes=False))


def test_a_run_job_reads_each_peer_from_the_entry_that_times_it_at_that_point():
    plan = _plan()
    int4_ws = plan.peer_points("int4_ws", "h200", "normal")["8192x8192x8192"]
    assert {r: p["entry"] for r, p in int4_ws.items()} == {"baseline": "int8_torch_int_mm", "second_baseline": "int8_tilelang"}
    assert int4_ws["second_baseline"]["record"] == "results/h200/int8_tilelang/normal/8192x8192x8192.json"
    assert int4_ws["baseline"]["format_file"] == "results/inputs/normal/8192x8192x8192/formats/int4_tensor_unpacked_s8.pt"
    # the bf16 peer of the W4A16 sweep is the entry that runs its shapes (cublas_bf16_w4_shapes), not cublas_bf16
    dq = plan.peer_points("dequant_w4_int4_sym_g128", "h200", "normal")
    assert dq["1x8192x8192"]["baseline"]["entry"] == "cublas_bf16_w4_shapes"
    assert dq["16x8192x8192"]["baseline"]["entry"] == "cublas_bf16"
    assert plan.peer_points("dequant_w4_int4_sym_g128", "h200", "student_t3") == {}  # no entry times that distribution
    assert plan.peer_points("cublas_bf16", "h200", "normal") == {}  # a library peer has no peer
    assert plan.peer_points("fp8_e4m3", "cpu", "normal") == {}  # emulation times nothing


def test_paired_timing_defaults_are_filled_and_inverted_bounds_refused():
    from harness.plan import ConfigError

    plan = _plan(pairing={"target_halfwidth": 0.01})
    assert plan.config["timing"]["pairing"] == {"target_halfwidth": 0.01, "same_within": 0.005, "min_rounds": 30,
                                                "max_rounds": 400, "aa_shapes": []}
    assert plan.config["timing"]["sustained"]["shapes"]  # config.yaml's headline shapes
    with pytest.raises(ConfigError, match="timing.pairing.min_rounds: 500 is more than max_rounds 400"):
        _plan(pairing={"min_rounds": 500})
    with pytest.raises(ConfigError, match="timing.sustained.min_settle_s"):
        _plan(sustained={"min_settle_s": 9.0, "max_settle_s": 2.0})
    with pytest.raises(ConfigError, match="target_halfwidth"):
        _plan(pairing={"target_halfwidth": 0})
