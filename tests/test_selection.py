"""Tile selection (harness/selection.py, kernels/tile_space.py): the candidates a kernel's rules allow, the
cost model's ranking, the tuned table's keys and staleness, the order of config, tuned and model tiles, the
zoo's planning, and the tune job itself on a host with a fake H200."""
import json
import shutil

import pytest
import yaml
from conftest import REPO, copy_workflow, fake_nvidia_smi, on_path, snakemake, tiny_config

from harness import selection
from harness.plan import ConfigError, Plan, load_config, validate
from harness.selection import Constants, PlatformModel, predict_us, rank, register_problem, tune_key, tune_record
from kernels.registry import get_variant, tile_problem
from kernels.smem import kernel_smem_bytes
from kernels.tile_space import candidates
from kernels.tiles import parse_tile, smem_problem

CONFIG = load_config()
H200 = PlatformModel.from_config("h200", CONFIG["platforms"]["h200"])
SELECTED = ["fp8_e4m3_ws", "fp8_e5m2_ws", "fp8_e4m3_ws_promoted", "int4_ws", "blockscaled_sm90"]
# the W4A16 kernels: resident CTAs (several per SM), modelled by predict_resident_us
DEQUANT = ["dequant_w4_int4_sym_g128", "dequant_w4_uint4_zp_g128", "dequant_w4_e2m1_g32", "dequant_w4_mxfp4"]


@pytest.mark.parametrize("name", SELECTED)
@pytest.mark.parametrize("shape", [(16, 8192, 8192), (128, 2112, 7168), (4096, 4096, 4096)])
def test_every_candidate_is_a_tile_the_kernel_takes_and_fits(name, shape):
    v = get_variant(name)
    tiles = candidates(v, *shape, "sm_90a")
    assert tiles and len({t.name for t in tiles}) == len(tiles)
    for t in tiles:
        assert tile_problem(v, t) is None and smem_problem(t.name, kernel_smem_bytes(v.kernel, t), "sm_90a") is None
        assert parse_tile(t.name) == t
        # the deepest ring that fits: one more stage does not
        deeper = parse_tile(t.name.replace(f"_s{t.num_stages}_", f"_s{t.num_stages + 1}_"))
        assert (t.num_stages == v.tile_space.max_stages or tile_problem(v, deeper) is not None
                or smem_problem(t.name, kernel_smem_bytes(v.kernel, deeper), "sm_90a") is not None)
    assert candidates(v, *shape, "sm_89") == []  # wgmma kernels have no tiles there


def test_only_small_m_gets_the_swapped_form_and_int4_ws_never_gets_block_n_224():
    fp8 = get_variant("fp8_e4m3_ws")
    assert any(t.swap_ab for t in candidates(fp8, 16, 8192, 8192, "sm_90a"))
    assert not any(t.swap_ab for t in candidates(fp8, 4096, 8192, 8192, "sm_90a"))
    assert all(t.promote == 2 for t in candidates(get_variant("fp8_e4m3_ws_promoted"), 4096, 4096, 4096, "sm_90a"))
    int4 = get_variant("int4_ws")
    assert not any(t.block_N == 224 for t in candidates(int4, 8192, 8192, 8192, "sm_90a"))
    assert "block_N 224" in tile_problem(int4, parse_tile("m128n224k128_s3_t384_z8"))


def test_the_model_charges_waves_padding_and_shallow_rings():
    v = get_variant("fp8_e4m3_ws")
    tile = parse_tile("m128n256k128_s3_t384_z8")
    one_wave = predict_us(v, 128 * 11, 256 * 12, 4096, tile, H200)  # 132 tiles: one full wave
    assert predict_us(v, 128 * 11, 256 * 12 + 8, 4096, tile, H200) > 1.5 * one_wave  # 11 more tiles: a second wave
    two_stages = parse_tile("m128n256k128_s2_t384_z8")
    assert predict_us(v, 4096, 4096, 4096, two_stages, H200) > 1.3 * predict_us(v, 4096, 4096, 4096, tile, H200)
    # decode: the swapped tile (M becomes the wgmma's N) beats 128 padded rows
    assert predict_us(v, 16, 8192, 8192, parse_tile("m128n16k128_s10_t384_z16_swapab"), H200) < \
        predict_us(v, 16, 8192, 8192, parse_tile("m128n128k128_s6_t384_z8"), H200)


def test_ranking_is_sorted_deterministic_and_leaves_out_spilling_accumulators():
    v = get_variant("fp8_e4m3_ws_promoted")
    ranked = rank(v, 4096, 4096, 4096, H200)
    assert ranked == rank(v, 4096, 4096, 4096, H200)
    times = [us for _, us in ranked]
    assert times == sorted(times)
    assert all(t.block_N <= 208 for t, _ in ranked)  # two accumulators of block_N/2 registers + 24 fit 232
    assert register_problem(parse_tile("m128n224k128_s3_t384_z16_p2")) is not None
    assert register_problem(parse_tile("m128n256k128_s3_t384_z16")) is None  # one accumulator fits


def test_calibration_recovers_constants_it_was_generated_with():
    v = get_variant("fp8_e4m3_ws")
    truth = Constants(mma_eff=0.7, latency_us=2.0, tile_us=1.5)
    shapes = [(4096, 4096, 4096), (2048, 7168, 2048), (16, 8192, 8192), (8192, 8192, 8192), (256, 4096, 14336)]
    points = [(M, N, K, t, predict_us(v, M, N, K, t, H200, truth)) for M, N, K in shapes
              for t, _ in rank(v, M, N, K, H200)[:4]]
    fitted, quality = selection.calibrate(v, points, H200, steps=150)
    assert quality["median_abs_log_error"] < quality["median_abs_log_error_default"] / 3
    assert abs(fitted.mma_eff - 0.7) < 0.1


def _record(variant="fp8_e4m3_ws", shape="4096x4096x4096", **key):
    k = tune_key(variant, shape, "sm_90a", "NVIDIA H200") | key
    rows = [{"tile": "m128n256k128_s3_t384_z8", "status": "ok", "time_ms_median": 0.100},
            {"tile": "m128n208k128_s4_t384_z8", "status": "ok", "time_ms_median": 0.090},
            {"tile": "m128n208k256_s2_t384_z8", "status": "failed", "reason": "kernel_rel_fro 1 > 0.005"}]
    cands = [(r["tile"], 90.0 + i) for i, r in enumerate(rows)]
    return tune_record(k, "normal", {}, cands, rows)


def test_a_tune_record_keeps_the_fastest_passing_tile_and_the_models_regret():
    rec = _record()
    assert rec["winner"] == "m128n208k128_s4_t384_z8" and rec["model_pick"] == "m128n256k128_s3_t384_z8"
    assert rec["regret"] == pytest.approx(0.100 / 0.090)
    assert [c["model_rank"] for c in rec["candidates"]] == [1, 2, 3] and rec["candidates"][2]["status"] == "failed"
    failed_pick = tune_record(rec["key"], "normal", {}, [("m128n208k256_s2_t384_z8", 1.0)],
                              [{"tile": "m128n208k256_s2_t384_z8", "status": "failed"}])
    assert failed_pick["winner"] is None and failed_pick["regret"] is None


@pytest.mark.parametrize("change, why", [
    ({"source_sha256": "0" * 64}, "source_sha256 differs"),
    ({"gpu_name": "NVIDIA H100 80GB HBM3"}, "not a GPU matching"),
    ({"arch": "sm_100a"}, "arch differs"),
    ({"tilelang": "0.0.1"}, "tilelang differs"),
])
def test_a_record_whose_key_no_longer_holds_is_stale(change, why, monkeypatch):
    monkeypatch.setattr(selection, "tool_versions", lambda: {"tilelang": "0.1.15", "nvcc": "unknown"})
    spec = CONFIG["platforms"]["h200"]
    rec = _record() | {"key": _record()["key"] | {"tilelang": "0.1.15"}}
    assert selection.staleness(rec, "fp8_e4m3_ws", "4096x4096x4096", "sm_90a", spec["match"]) is None
    stale = rec | {"key": rec["key"] | change}
    assert why in selection.staleness(stale, "fp8_e4m3_ws", "4096x4096x4096", "sm_90a", spec["match"])


def test_a_record_whose_winner_spills_is_never_used(monkeypatch):
    monkeypatch.setattr(selection, "tool_versions", lambda: {"tilelang": "0.1.15", "nvcc": "unknown"})
    spec = CONFIG["platforms"]["h200"]
    rec = _record() | {"key": _record()["key"] | {"tilelang": "0.1.15"}}
    spilling = rec | {"candidates": [c | {"spills": 20 if c["tile"] == rec["winner"] else 0} for c in rec["candidates"]]}
    why = selection.staleness(spilling, "fp8_e4m3_ws", "4096x4096x4096", "sm_90a", spec["match"])
    assert why is not None and "spills (20 local loads and stores" in why
    loser_spills = rec | {"candidates": [c | {"spills": 0 if c["tile"] == rec["winner"] else 634} for c in rec["candidates"]]}
    assert selection.staleness(loser_spills, "fp8_e4m3_ws", "4096x4096x4096", "sm_90a", spec["match"]) is None


def test_no_committed_tuned_record_selects_a_spilling_tile():
    for path in sorted(REPO.glob("results/published/*/tuning/*/*/*.json")):
        rec = json.loads(path.read_text())
        won = [c for c in rec.get("candidates", []) if c["tile"] == rec.get("winner")]
        assert not (won and won[0].get("spills")), f"{path.relative_to(REPO)}: winner {rec['winner']} spills"


def _h200_plan(tmp_path, monkeypatch, record=None, tiles=None):
    """A plan of fp8_e4m3_ws on the H200 whose checkout is ``tmp_path`` (holding ``record``, if given)."""
    monkeypatch.setattr(selection, "REPO", tmp_path)
    monkeypatch.setattr(selection, "tool_versions", lambda: {"tilelang": "0.1.15", "nvcc": "unknown"})
    cfg = tiny_config() | {"run_on": ["h200"]}
    cfg["sweeps"]["gpu"] = ["4096x4096x4096"]
    cfg["variants"]["fp8_e4m3_ws"] = {"tolerance": cfg["variants"]["fp8_e4m3"]["tolerance"],
                                      "tiles": tiles or {"default": ["m128n256k128_s3_t384_z16"]}}
    if record is not None:
        path = tmp_path / "results/published/h200/tuning/fp8/fp8_e4m3_ws/4096x4096x4096.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
    monkeypatch.setattr("harness.plan.Plan.platform_model", lambda self, p: H200)
    return Plan(validate(cfg, check_shapes=False))


def test_config_tiles_override_the_tuned_table_which_overrides_the_model(tmp_path, monkeypatch):
    rec = _record() | {"key": _record()["key"] | {"tilelang": "0.1.15"}}
    model = rank(get_variant("fp8_e4m3_ws"), 4096, 4096, 4096, H200)[0][0].name
    plan = _h200_plan(tmp_path / "a", monkeypatch)
    assert plan.choice("fp8_e4m3_ws", "h200", "4096x4096x4096").source == "model"
    assert plan.tiles_for_shape("fp8_e4m3_ws", "sm_90a", "4096x4096x4096", "h200") == [model]
    # a target the kernel has no tile space for keeps its listed default (the unsupported record)
    assert not plan.selects("fp8_e4m3_ws", "sm_89") and plan.tiles_for("fp8_e4m3_ws", "sm_89") == ["m128n256k128_s3_t384_z16"]
    plan = _h200_plan(tmp_path / "b", monkeypatch, record=rec)
    choice = plan.choice("fp8_e4m3_ws", "h200", "4096x4096x4096")
    assert (choice.source, choice.tiles) == ("tuned", ["m128n208k128_s4_t384_z8"]) and choice.record.endswith(".json")
    stale = rec | {"key": rec["key"] | {"source_sha256": "f" * 64}}
    plan = _h200_plan(tmp_path / "c", monkeypatch, record=stale)
    choice = plan.choice("fp8_e4m3_ws", "h200", "4096x4096x4096")
    assert choice.source == "model" and "stale: source_sha256 differs" in choice.why
    listed = {"sm_90a": ["m128n128k128_s6_t384_z8"]}
    plan = _h200_plan(tmp_path / "d", monkeypatch, record=rec, tiles=listed)
    assert not plan.selects("fp8_e4m3_ws", "sm_90a")
    assert plan.tiles_for_shape("fp8_e4m3_ws", "sm_90a", "4096x4096x4096", "h200") == ["m128n128k128_s6_t384_z8"]


def test_the_zoo_is_planned_for_its_entries_and_their_peers_at_its_distributions_only():
    plan = Plan(dict(CONFIG, run_on=["h200"]))
    layers = plan.zoo_layers()
    assert len(layers) >= 24 and len({layer.split()[0] for ls in layers.values() for layer in ls}) >= 3
    Ms = [int(s.split("x")[0]) for s in layers]
    assert any(M <= 16 for M in Ms) and any(32 <= M <= 256 for M in Ms) and any(M >= 2048 for M in Ms)
    assert "cublas_fp8_e4m3_fastacc" in plan.zoo_entries() and "fp8_e4m3" not in plan.zoo_entries()
    runs = plan.run_outputs("h200", ["fp8_e4m3_ws"])
    assert "results/h200/fp8_e4m3_ws/normal/16x6144x4096.json" in runs
    assert "results/h200/fp8_e4m3_ws/student_t3/16x6144x4096.json" not in runs
    assert not any("16x6144x4096" in f for f in plan.run_outputs("cpu", ["fp8_e4m3_ws"]))
    # blockscaled_sm90 lists its sm_90a tiles per shape class (issue 34), so the H200 does not tune it; the W4A16
    # kernels' tiles are selected (issue 44)
    assert set(plan.tune_entries("h200")) == set(SELECTED + DEQUANT) - {"blockscaled_sm90"}
    cfg = dict(CONFIG, zoo=dict(CONFIG["zoo"], entries=["cublas_bf16"]))
    with pytest.raises(ConfigError, match="zoo.entries.0: cublas_bf16 is a library peer"):
        validate(cfg, check_shapes=False)


def test_a_zoo_layer_with_its_own_entries_is_timed_by_them_and_their_peers_only():
    plan = Plan(dict(CONFIG, run_on=["h200"]))
    qwen_down = "1x3584x18944"  # a W4A16 zoo layer (Qwen2.5-7B mlp down_proj) at M = 1
    for entry in [*DEQUANT, "humming_w4_int4_g128", "tinygemm_w4_g128", "cublas_bf16"]:
        assert qwen_down in plan.zoo_shapes(entry), entry
    for entry in ["fp8_e4m3_ws", "cublas_fp8_e4m3", "cublas_bf16_w4_shapes", "torch_dequant_matmul_w4_int4_sym_g128"]:
        assert qwen_down not in plan.zoo_shapes(entry), entry
    # a shape two layers share (the fp8 zoo's and the W4A16 zoo's Llama-3.1-8B q+k+v at M = 16): both lists time it,
    # under one name
    assert "16x6144x4096" in plan.zoo_shapes("fp8_e4m3_ws") and "16x6144x4096" in plan.zoo_shapes("dequant_w4_mxfp4")
    assert plan.zoo_layers()["16x6144x4096"] == ["Llama-3.1-8B self_attn q+k+v (fused)"]
    # the peer one entry pairs with is the one timing the shape: the zoo's, or at a shape of the family's own sweep
    # the entry whose sweep it is (no second cuBLAS run of it)
    assert plan.peer_entry("dequant_w4_int4_sym_g128", "baseline", "normal", qwen_down) == "cublas_bf16"
    assert plan.peer_entry("dequant_w4_int4_sym_g128", "baseline", "normal", "1x4096x14336") == "cublas_bf16_w4_shapes"
    assert "cublas_bf16_w4_shapes" not in plan.zoo_entries()
    for entries, why in ((["cublas_bf16"], "zoo.layers.8.entries.0: cublas_bf16 is a library peer"),
                         (["dequant_w4_mxfp4", "nope"], "zoo.layers.8.entries.1: 'nope' is not a config entry")):
        cfg = yaml.safe_load(yaml.safe_dump(CONFIG))
        cfg["zoo"]["layers"][8]["entries"] = entries
        with pytest.raises(ConfigError, match=why):
            validate(cfg, check_shapes=False)


def test_the_w4a16_zoo_covers_four_model_families_at_every_token_count_with_a_tile_for_each_layer():
    """Issue 44's zoo: at least 16 layers of at least four public model families timed by the dequantize entries,
    each at M = 1, 16, 64, 256 and 2048, hidden sizes that are no multiple of 1024 among them, and every layer a
    shape the dequantize tiles take (N a multiple of 64, K of 128)."""
    layers = [la for la in CONFIG["zoo"]["layers"] if set(DEQUANT) <= set(la.get("entries", []))]
    assert len(layers) >= 16 and len({la["model"].split("-")[0] for la in layers}) >= 4
    assert all(set(la["M"]) >= {1, 16, 64, 256, 2048} for la in layers)
    assert any(la["K"] % 1024 for la in layers) and any(la["N"] % 1024 for la in layers)
    assert all(la["N"] % 64 == 0 and la["K"] % 128 == 0 for la in layers)


def test_the_gpus_queue_takes_next_the_run_job_whose_cpu_jobs_left_are_cheapest():
    plan = Plan(dict(CONFIG, run_on=["h200"]))
    queue = plan.gpu_queue
    # every planned GPU run job once: each entry's sweep per distribution, and its zoo
    runs = sum(len(plan.variant_dists(e)) + (len(plan.zoo_dists(e)) if plan.zoo_shapes(e) else 0) for e in plan.entries)
    assert len(queue) == runs

    seconds = plan.cpu_job_seconds
    queued = set()
    for place, needs in enumerate(queue):  # greedy: no later job needed less of what was not yet queued
        cost = sum(seconds(j) for j in needs - queued)
        assert all(cost <= sum(seconds(j) for j in later - queued) for later in queue[place + 1:]), place
        queued |= needs
    # the library peers need inputs only, so they open the queue; the W4A16 shapes' many formats come later
    assert all(job[0] == "inputs" for job in queue[0])
    assert not any("28672" in job[2] for job in queue[0])
    assert {("sweep", "fp8_e4m3_ws", "sm_90a", t) for t in plan.sweep_tiles("fp8_e4m3_ws", "sm_90a")} <= set().union(*queue)
    assert Plan(dict(CONFIG, run_on=["cpu"])).gpu_queue == []


def test_cpu_jobs_go_in_the_gpus_queue_order_then_longest_first_below_the_gpu():
    from harness.plan import (
        CHECK_PRIORITY,
        KERNEL_COMPILE_S,
        QUEUED_PRIORITY,
        QUEUED_TOP,
        UNQUEUED_PRIORITY,
        longest_first,
        queued_priority,
    )

    plan = Plan(dict(CONFIG, run_on=["h200"]))
    # the estimates grow with the work: elements and formats of an input, kernels of a compile
    assert plan.input_seconds("1x28672x8192") > plan.input_seconds("8192x8192x8192") > plan.input_seconds("64x6144x4096")
    sweeps = [(e, t) for e in plan.entries if plan.is_tilelang(e) for t in plan.sweep_tiles(e, "sm_90a")]
    assert len({plan.sweep_compile_seconds(e, "sm_90a", t) for e, t in sweeps}) > 3
    e, t = max(sweeps, key=lambda x: len(plan.sweep_shapes(x[0], "sm_90a", x[1])))
    assert plan.sweep_compile_seconds(e, "sm_90a", t) == KERNEL_COMPILE_S * len(plan.sweep_shapes(e, "sm_90a", t))
    # within a place longest first; an earlier place above a later one whatever the seconds; all queued jobs above
    # the unqueued, those above the checks, and every one below the GPU jobs (the humming run's 49 included)
    xs = [0.0, 1.0, 36.0, 120.0, 240.0, 1e6]
    n = len(plan.gpu_queue)
    places = [[queued_priority(place, n, x) for x in xs] for place in range(n)]
    for row in places:
        assert row == sorted(row) and len(set(row)) == len(xs)
    assert all(min(a) > max(b) for a, b in zip(places[:-1], places[1:], strict=True))
    check, unqueued = ([longest_first(x, tier) for x in xs] for tier in (CHECK_PRIORITY, UNQUEUED_PRIORITY))
    assert CHECK_PRIORITY <= min(check) and max(check) < UNQUEUED_PRIORITY <= min(unqueued)
    assert max(unqueued) < QUEUED_PRIORITY <= min(places[-1]) and max(places[0]) < QUEUED_TOP < 49
    # a job takes the place of the first queued run job that needs it
    first = sorted(plan.gpu_queue[0])[0]
    assert plan.cpu_priority(first, 5.0) == queued_priority(0, n, 5.0)
    place, job = max((next(i for i, q in enumerate(plan.gpu_queue) if j in q), j) for j in set().union(*plan.gpu_queue))
    assert place > 0 and job not in plan.gpu_queue[0]
    assert plan.cpu_priority(job, 5.0) == queued_priority(place, n, 5.0) < plan.cpu_priority(first, 5.0)
    cpu = Plan(dict(CONFIG, run_on=["cpu"]))
    assert cpu.cpu_priority(("inputs", "normal", "64x6144x4096"), 7.0) == longest_first(7.0, UNQUEUED_PRIORITY)


def test_rank_prints_the_models_order(capsys):
    assert selection.main(["rank", "h200", "fp8_e4m3_ws", "16x8192x8192", "--top", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    times = [float(line.split()[1]) for line in lines]
    assert len(lines) == 5 and times == sorted(times) and parse_tile(lines[0].split()[0]).swap_ab


@pytest.mark.parametrize("name", DEQUANT)
@pytest.mark.parametrize("shape", [(1, 8192, 8192), (16, 576, 7168), (64, 3584, 18944), (2048, 4736, 3584)])
def test_every_dequant_candidate_fits_its_shape_with_the_ring_that_keeps_most_ctas_per_sm(name, shape):
    from kernels.dequant_w4 import check_dequant_w4_tile, decode_form, overlapped_form

    v = get_variant(name)
    space = v.tile_space
    tiles = candidates(v, *shape, "sm_90a")
    assert tiles and len({t.name for t in tiles}) == len(tiles)
    assert any(t.block_M > 64 for t in tiles)  # the prefill form at every M
    # the decode form only where its rows are few; the overlapped form splits K at any M
    assert any(t.split_k > 1 and decode_form(t) for t in tiles) == (shape[0] <= 64)
    assert any(t.split_k > 1 and overlapped_form(t) for t in tiles)
    for t in tiles:
        check_dequant_w4_tile(_fmt(v), shape[2], t)
        smem = kernel_smem_bytes(v.kernel, t)
        assert smem_problem(t.name, smem, "sm_90a") is None
        ctas = space.ctas_per_sm(t, smem)
        names = {u.name for u in tiles}
        for stages in range(space.min_stages, space.max_stages + 1):  # no other depth holds more CTAs; each as many is
            other = parse_tile(t.name.replace(f"_s{t.num_stages}_", f"_s{stages}_"))  # a candidate too
            other_smem = kernel_smem_bytes(v.kernel, other)
            if smem_problem(t.name, other_smem, "sm_90a") is None:
                assert space.ctas_per_sm(other, other_smem) <= ctas
                assert (space.ctas_per_sm(other, other_smem) < ctas) == (other.name not in names)


def test_a_tune_times_different_tiles_not_ring_depths_of_one():
    """The model ranks m8n64k512_split2 at rings 2, 3 and 4 first at 1x8192x8192; the tune's candidates take its
    best depth and go on to other tiles."""
    plan = Plan(load_config())
    ranked = [t for t, _ in rank(get_variant("dequant_w4_int4_sym_g128"), 1, 8192, 8192, H200)]
    picked = [parse_tile(name) for name, _ in plan.tune_candidates("dequant_w4_int4_sym_g128", "h200", "1x8192x8192")]
    assert len(picked) == plan.selection["tune_candidates"] and picked[0] == ranked[0]
    assert len({(t.block_M, t.block_N, t.block_K, t.split_k) for t in picked}) == len(picked)
    assert len({(t.block_M, t.block_N, t.block_K, t.split_k) for t in ranked[:len(picked)]}) < len(picked)


def test_a_k_split_need_not_divide_the_k_blocks():
    """K = 18944 is 74 blocks of 256: a split of 4 runs 18, 18, 19 and 19 (Qwen2.5-7B's down projection, narrow N
    and long K, lost to tinygemm while only a split of 2 fit); a split with fewer K blocks than CTAs does not fit."""
    from kernels.dequant_w4 import check_dequant_w4_tile

    v = get_variant("dequant_w4_int4_sym_g128")
    check_dequant_w4_tile(_fmt(v), 18944, parse_tile("m8n64k256_s4_t128_wrow_split4"))
    with pytest.raises(ValueError, match=r"K=256 must be a multiple of block_K=256 with at least one K block per CTA "
                                         r"of the split \(2\)"):
        check_dequant_w4_tile(_fmt(v), 256, parse_tile("m8n64k256_s4_t128_wrow_split2"))
    assert any(t.split_k == 4 for t in candidates(v, 1, 3584, 18944, "sm_90a"))
    assert rank(v, 1, 3584, 18944, H200)[0][0].split_k >= 4  # 56 output tiles: a split of 2 leaves SMs idle


def _fmt(v):
    return v.kernel.keywords["fmt"]  # the W4Format the variant's kernel factory is bound to


@pytest.mark.parametrize("name", DEQUANT)
def test_every_layer_gets_a_dequant_tile_at_every_batch(name):
    """Any N multiple of 64 and K multiple of 128 (hidden sizes that are not a multiple of 1024 included) has
    a ranked tile at decode, small-batch and prefill M, and the model's pick fits the kernel at that shape."""
    from kernels.dequant_w4 import check_dequant_w4_tile

    v = get_variant(name)
    for N in (64, 576, 2112, 3584, 4736, 13824, 18944):
        for K in (128, 384, 2880 + 64, 3584, 4736, 5120, 18944):
            for M in (1, 16, 64, 256, 2048):
                ranked = rank(v, M, N, K, H200)
                assert ranked, (M, N, K)
                check_dequant_w4_tile(_fmt(v), K, ranked[0][0])


def test_the_resident_model_counts_ctas_per_sm_and_fills_idle_sms_with_a_k_split():
    from kernels.dequant_w4 import dequant_w4_ctas_per_sm

    v = get_variant("dequant_w4_int4_sym_g128")
    tile = parse_tile("m16n64k256_s3_t128_wrow")
    # 108 registers (112 allocated) x 128 threads: four CTAs per SM; a fourth stage's shared memory leaves room for three
    assert dequant_w4_ctas_per_sm(tile, kernel_smem_bytes(v.kernel, tile)) == 4
    deeper = parse_tile("m16n64k256_s4_t128_wrow")
    assert dequant_w4_ctas_per_sm(deeper, kernel_smem_bytes(v.kernel, deeper)) == 3
    wide = parse_tile("m8n64k512_s2_t128_wrow")  # 170 registers (176 allocated): two
    assert dequant_w4_ctas_per_sm(wide, kernel_smem_bytes(v.kernel, wide)) == 2
    assert dequant_w4_ctas_per_sm(parse_tile("m128n128k128_s4_t256_wrow"), 0) == 1  # the warp-specialized form
    # 1x4096x14336: 64 CTAs unsplit leave half the SMs idle; a split of 2 or 4 fills them
    unsplit = predict_us(v, 1, 4096, 14336, parse_tile("m8n64k256_s4_t128_wrow"), H200)
    assert predict_us(v, 1, 4096, 14336, parse_tile("m8n64k256_s4_t128_wrow_split4"), H200) < 0.7 * unsplit
    # a row block of 8 at M = 64 decodes the weight 8 times: slower than one block of 64 rows
    assert predict_us(v, 64, 8192, 8192, parse_tile("m8n64k256_s4_t128_wrow"), H200) > \
        predict_us(v, 64, 8192, 8192, parse_tile("m64n64k256_s2_t128_wrow"), H200)


def test_the_resident_model_runs_clusters_past_what_the_gpu_holds_in_a_second_round():
    """On the H200 clusters of 4 fill 124 of 132 SMs (cluster_sms): 128 clusters of 4 CTAs at 4 per SM need a
    second round (Nsight Compute, 2026-12-07: Max Active Clusters 124; the tile ran 1.27x the time of its 2-way
    split); a ring as deep as a short K range costs its prologue; a lone CTA per SM is chained by its K blocks'
    latency, so it wants few, wide blocks."""
    from dataclasses import replace

    v = get_variant("dequant_w4_int4_sym_g128")
    split4 = parse_tile("m8n64k256_s4_t128_wrow_split4")
    assert H200.resident_clusters(4, 4) == 124 and H200.resident_clusters(2, 4) == 264
    every_sm = replace(H200, cluster_sms=None)
    assert every_sm.resident_clusters(4, 4) == 132
    assert predict_us(v, 1, 8192, 8192, split4, H200) > 1.2 * predict_us(v, 1, 8192, 8192, split4, every_sm)
    assert predict_us(v, 1, 8192, 8192, split4, H200) > predict_us(v, 1, 8192, 8192, parse_tile(
        "m8n64k256_s4_t128_wrow_split2"), H200)
    shallow, deep = parse_tile("m8n64k256_s2_t128_wrow_split4"), parse_tile("m8n64k256_s4_t128_wrow_split4")
    assert predict_us(v, 1, 4096, 14336, shallow, H200) < predict_us(v, 1, 4096, 14336, deep, H200)
    # 128 CTAs, one per SM: K blocks of 512 beat 128 (measured 15.2 against 32.5 µs)
    assert predict_us(v, 1, 4096, 14336, parse_tile("m8n64k512_s2_t128_wrow_split2"), H200) < \
        0.7 * predict_us(v, 1, 4096, 14336, parse_tile("m8n64k128_s2_t128_wrow_split2"), H200)


def test_a_platform_whose_cluster_sms_exceed_its_sms_is_refused():
    cfg = yaml.safe_load((selection.REPO / "config.yaml").read_text())
    cfg["platforms"]["h200"]["cluster_sms"] = 140
    with pytest.raises(ConfigError, match=r"platforms\.h200\.cluster_sms: 140 is more than its sms \(132\)"):
        Plan(cfg).platform_spec("h200")


def test_the_ctas_per_sm_from_estimated_registers_match_the_published_compile_records_within_one():
    """The model's count of resident CTAs (from decode_form_registers, before compiling) is within one of the
    count ptxas's registers give, for every published decode-form tile."""
    from kernels.dequant_w4 import decode_form, dequant_w4_ctas_per_sm

    seen = 0
    for path in (REPO / "results/published/h200/points/dequant/compile").glob("dequant_w4_*/sm_90a/*.json"):
        for rec in json.loads(path.read_text())["records"]:
            tile = parse_tile(rec["tile"])
            if decode_form(tile) and rec.get("registers"):
                seen += 1
                smem = rec["smem_dynamic_bytes"]
                estimated, compiled = dequant_w4_ctas_per_sm(tile, smem), dequant_w4_ctas_per_sm(tile, smem, rec["registers"])
                assert abs(estimated - compiled) <= 1, (rec["tile"], estimated, compiled)
    assert seen >= 8
    tile = parse_tile("m32n64k256_s2_t128_wrow")  # ptxas: 167 registers (compile-only, 2026-12-07), estimate 112
    assert dequant_w4_ctas_per_sm(tile, 50176) == 4 and dequant_w4_ctas_per_sm(tile, 50176, 167) == 3


def test_calibrate_fits_every_selected_variant_from_the_published_measurements(tmp_path, monkeypatch):
    published = selection.REPO / "results/published/h200"
    (tmp_path / "results/published/h200").mkdir(parents=True)
    shutil.copy(published / "tidy.csv", tmp_path / "results/published/h200/tidy.csv")
    shutil.copytree(published / "tuning", tmp_path / "results/published/h200/tuning",
                    ignore=shutil.ignore_patterns("calibration.json"))
    monkeypatch.setattr(selection, "REPO", tmp_path)
    assert selection.main(["calibrate", "h200", "--steps", "5"]) == 0
    fit = json.loads(selection.calibration_path("h200").read_text())
    assert set(fit["constants"]) == set(SELECTED + DEQUANT) and set(fit["constants"]["int4_ws"]) >= set(Constants.FITTED)
    assert set(fit["constants"]["dequant_w4_mxfp4"]) >= set(Constants.FITTED_RESIDENT)
    assert all(q["points"] >= 20 for q in fit["fit"].values())
    # refitting some variants keeps every other variant's constants as they were
    before = fit["constants"]
    assert selection.main(["calibrate", "h200", "--steps", "5", "--variants", "dequant_w4_e2m1_g32"]) == 0
    after = json.loads(selection.calibration_path("h200").read_text())["constants"]
    assert {n: c for n, c in after.items() if n != "dequant_w4_e2m1_g32"} == \
        {n: c for n, c in before.items() if n != "dequant_w4_e2m1_g32"}
    with pytest.raises(Exception, match="unknown variant"):
        selection.main(["calibrate", "h200", "--variants", "dequant_w4_nope"])


@pytest.mark.workflow
def test_tuning_a_family_plans_its_tune_jobs_and_the_committed_table(tmp_path):
    """A dry run (planning only) of the documented tune command on a host without a GPU."""
    cfg = yaml.safe_load((selection.REPO / "config.yaml").read_text()) | {"run_on": ["h200"]}
    wf = copy_workflow(tmp_path / "wf", cfg)
    shutil.rmtree(wf / "results/published/h200/tuning/fp8")
    plan = snakemake(wf, "-n", "results/published/h200/tuning/fp8").stdout
    jobs = {line.split()[0]: int(line.split()[1]) for line in plan.split("Job stats:")[1].splitlines()[3:]
            if line.strip() and line.split()[-1].isdigit() and not line.startswith("total")}
    assert {k: v for k, v in jobs.items() if k.startswith(("tune_", "publish"))} == {
        "tune_fp8_e4m3_ws": 1, "tune_fp8_e5m2_ws": 1, "tune_fp8_e4m3_ws_promoted": 1, "publish_tuning": 1}
    assert "results/h200/tuning/fp8_e4m3_ws/16x6144x4096.json" in plan  # a zoo shape is tuned too


# put first on a workflow copy's PYTHONPATH: every process of that run sees an H200 through torch, and
# run_gpu "times" each tile that compiled at the model's prediction, the model's first pick 1.5x slower
FAKE_GPU = """
import torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a: "NVIDIA H200"
torch.cuda.get_device_capability = lambda *a: (9, 0)
import harness.runner
from harness.plan import load_config
from harness.selection import PlatformModel, predict_us

def run_gpu(variant, A, B, ops, tiles, arch, tolerance, reps, warmup, compiled=None, pairing=None):
    import os
    if os.environ.get("LPGEMM_TEST_STOP_AT") == f"{A.shape[0]}x{B.shape[0]}x{A.shape[1]}":
        os._exit(1)  # the machine taken away while this shape is timed
    model = PlatformModel.from_config("h200", load_config()["platforms"]["h200"])
    rows = []
    for i, tile in enumerate(tiles):
        status, why = (compiled or {}).get(tile.name, ("ok", ""))
        us = predict_us(variant, A.shape[0], B.shape[0], A.shape[1], tile, model) * (1.5 if i == 0 else 1.0)
        rows.append({"tile": tile.name, "status": status, "reason": why} | ({"time_ms_median": us / 1e3} if status == "ok" else {}))
    return rows

harness.runner.run_gpu = run_gpu
"""


def _fake_h200_tune(tmp_path, monkeypatch, shapes: list[str], candidates: int):
    """A copy of the workflow that tunes fp8_e4m3_ws at ``shapes`` (the model's best ``candidates`` tiles) on a fake
    H200 (nvidia-smi and torch say so; FAKE_GPU times the tiles), with no committed tuned table."""
    cfg = tiny_config() | {"run_on": ["h200"], "tile_selection": {"model_picks": 1, "tune_candidates": candidates}}
    cfg["sweeps"]["gpu"] = shapes
    cfg["variants"] = {"fp8_e4m3_ws": {"tiles": {"default": ["m128n256k128_s3_t384_z16"]},
                                       "tolerance": cfg["variants"]["fp8_e4m3"]["tolerance"]}}
    wf = copy_workflow(tmp_path / "wf", cfg)
    shutil.rmtree(wf / "results/published/h200/tuning", ignore_errors=True)
    (wf / "sitecustomize.py").write_text(FAKE_GPU)
    on_path(monkeypatch, fake_nvidia_smi(tmp_path, "NVIDIA H200", "9.0"))
    return wf


@pytest.mark.workflow
def test_a_tune_job_stopped_part_way_keeps_its_finished_shapes_and_times_only_the_rest(tmp_path, monkeypatch):
    """A tune job on a fake H200 dies while timing its second shape: snakemake deletes the job's outputs, but the
    first shape's record is kept; the next run reuses it (and compiles nothing for it), tunes the second, and
    once the job is whole keeps nothing, so a forced rerun tunes afresh."""
    from harness.plan import kept_tune_path

    shapes = ["64x128x128", "64x256x128"]
    wf = _fake_h200_tune(tmp_path, monkeypatch, shapes, candidates=1)
    first, second = (f"results/h200/tuning/fp8_e4m3_ws/{s}.json" for s in shapes)
    kept_first, kept_second = (wf / kept_tune_path("h200", "fp8_e4m3_ws", s) for s in shapes)
    monkeypatch.setenv("LPGEMM_TEST_STOP_AT", "64x256x128")
    assert snakemake(wf, "results/published/h200/tuning/fp8", check=False).returncode != 0
    assert not (wf / first).exists() and not (wf / second).exists()  # the stopped job's outputs are gone
    assert kept_first.exists() and not kept_second.exists()
    kept = json.loads(kept_first.read_text())["record"]
    monkeypatch.delenv("LPGEMM_TEST_STOP_AT")
    snakemake(wf, "results/published/h200/tuning/fp8")
    log = (wf / "results/logs/h200/tuning/fp8_e4m3_ws.log").read_text()
    assert "reusing the records of 1 shapes" in log
    assert json.loads((wf / first).read_text()) == kept and json.loads((wf / second).read_text())["winner"]
    assert not kept_first.exists() and not kept_second.exists()


@pytest.mark.workflow
def test_a_tune_job_on_a_fake_h200_times_the_models_candidates_and_the_run_then_uses_the_winner(tmp_path, monkeypatch):
    """Runs the pipeline's tune job (it compiles two kernels, about 20 s) on a fake H200 (nvidia-smi and torch
    say so; FAKE_GPU times each compiled tile at the model's prediction, its first pick 1.5x slower): the
    record holds both candidates with their compile outcome, the winner and the model's regret, and a run
    planned afterwards compiles and times the winner."""
    wf = _fake_h200_tune(tmp_path, monkeypatch, ["64x128x128"], candidates=2)
    target = "results/h200/tuning/fp8_e4m3_ws/64x128x128.json"
    snakemake(wf, target)
    rec = json.loads((wf / target).read_text())
    assert rec["key"]["variant"] == "fp8_e4m3_ws" and rec["key"]["gpu_name"] == "NVIDIA H200"
    assert rec["key"]["source_sha256"] == selection.kernel_source_sha256("fp8_e4m3_ws")
    first, second = rec["candidates"]
    assert [first["model_rank"], second["model_rank"]] == [1, 2] and first["registers"] > 0
    assert first["status"] == second["status"] == "ok"
    assert rec["model_pick"] == first["tile"] and rec["winner"] == second["tile"]
    assert rec["regret"] == pytest.approx(1.5 * first["predicted_us"] / second["predicted_us"], rel=1e-3)
    plan = snakemake(wf, "-n", "results/h200/fp8_e4m3_ws/normal/64x128x128.json").stdout
    assert f"results/compile/fp8_e4m3_ws/sm_90a/sweep/{second['tile']}.json" in plan
    assert f"sweep/{first['tile']}.json" not in plan
