"""Published results per family: each family's points come from one GPU run, and are refreshed alone."""
import json
import shutil

import pytest
import yaml
from conftest import PUBLISHED_TABLES, REPO, copy_workflow, snakemake

from harness import tables  # noqa: E402
from harness.records import DamagedFile  # noqa: E402
from kernels.registry import VARIANTS, bytes_per_element, load_all  # noqa: E402

POINTS = REPO / "results/published/h200/points"
load_all()
PEAKS = yaml.safe_load((REPO / "config.yaml").read_text())["platforms"]["h200"]


def _load(points_dir):
    tidy, _, _, sets = tables.point_sets(points_dir, PEAKS, {v: bytes_per_element(v) for v in VARIANTS})
    best = tables.best_tiles(tidy)
    sp = tables.speedups(best, {n: v.baseline for n, v in VARIANTS.items() if v.baseline},
                         {n: v.second_baseline for n, v in VARIANTS.items() if v.second_baseline})
    return tidy, sets, sp


def test_the_published_h200_set_holds_every_family_with_its_provenance():
    tidy, sets, sp = _load(POINTS)
    assert set(sets["point_set"]) == {"fp8", "int4", "blockscaled", "dequant"}
    for _, s in sets.iterrows():
        assert s["gpu_names"] == "NVIDIA H200" and len(s["git_commits"]) >= 7 and s["measured_from"] <= s["measured_to"]
    # a family's own variants appear in its point set only; every timed variant has its matched peer there
    own = tidy[tidy["family"] != "baseline"]
    assert (own["point_set"] == own["family"]).all() or set(own[own["point_set"] != own["family"]]["variant"]) <= {
        "cublas_fp8_e4m3"}  # the tensorwise fp8 GEMM: fp8's own, and block-scaled's second baseline
    # every timed kernel's matched peer was measured at that shape in the same run (where cuBLAS refuses a
    # shape, its row says unsupported)
    timed = sp[sp["variant"].map(lambda v: VARIANTS[v].kernel is not None)]
    measured = set(tidy[["point_set", "variant", "dist", "shape"]].itertuples(index=False, name=None))
    assert len(timed) > 100 and all(k in measured for k in timed[["point_set", "baseline", "dist", "shape"]].itertuples(
        index=False, name=None))
    # a speedup is missing exactly where the peer's row is not timed (cuBLAS refuses 3000x5000x4096)
    peer_timed = set(tidy[tidy["status"] == "ok"][["point_set", "variant", "dist", "shape"]].itertuples(index=False, name=None))
    has_peer = [k in peer_timed for k in timed[["point_set", "baseline", "dist", "shape"]].itertuples(index=False, name=None)]
    assert timed["speedup"].notna().tolist() == has_peer and sum(has_peer) > 100


def test_a_ratio_is_taken_within_its_own_family_run(tmp_path):
    points = tmp_path / "points"
    shutil.copytree(POINTS, points)
    # fp8's ratios unpaired (from each row's own throughput): a paired ratio never reads another job's time
    for f in (points / "fp8/runs").rglob("*.json"):
        d = json.loads(f.read_text())
        d["rows"] = [{k: v for k, v in r.items() if "pair_" not in k} for r in d["rows"]]
        f.write_text(json.dumps(d))
    _, _, before = _load(points)
    # a later refresh of fp8 measures its cuBLAS tensorwise baseline at half the speed (twice as fast would
    # put it above the datasheet peak, and such a row is failed, not compared) ...
    for f in (points / "fp8/runs/cublas_fp8_e4m3").rglob("*.json"):
        d = json.loads(f.read_text())
        for r in d["rows"]:
            if r.get("throughput"):
                r["throughput"] /= 2
                for t in ("time_ms_median", "time_ms_p20", "time_ms_p80", "time_ms_min"):
                    r[t] *= 2
        f.write_text(json.dumps(d))
    _, _, after = _load(points)
    key = ["point_set", "variant", "dist", "shape"]
    b, a = before.set_index(key).sort_index(), after.set_index(key).sort_index()
    # ... which moves fp8's ratios against it (the second column of the fast-accumulation kernels, the
    # headline of the promoted one), and none of block-scaled's, measured in their own run
    fp8, bs = a.xs("fp8", level="point_set"), a.xs("blockscaled", level="point_set")
    fp8_before = b.xs("fp8", level="point_set")
    for col in ("speedup_vs_second", "speedup"):
        against = fp8[("second_baseline" if col == "speedup_vs_second" else "baseline")] == "cublas_fp8_e4m3"
        moved = (fp8[col] / fp8_before[col])[against].dropna().round(6)
        assert len(moved) >= 8 and moved.eq(2.0).all(), col
        assert (fp8[col] / fp8_before[col])[~against].dropna().round(6).eq(1.0).all(), col
    assert bs["speedup_vs_second"].notna().any()
    assert bs["speedup_vs_second"].equals(b.xs("blockscaled", level="point_set")["speedup_vs_second"])


def test_a_point_set_without_provenance_is_refused(tmp_path):
    points = tmp_path / "points"
    shutil.copytree(POINTS / "int4", points / "int4")
    (points / "int4/provenance.json").unlink()
    with pytest.raises(DamagedFile, match="provenance.json: missing; "):
        _load(points)


@pytest.mark.workflow
def test_refreshing_one_family_plans_its_entries_their_peers_and_the_ceilings_only(tmp_path):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    wf = copy_workflow(tmp_path, cfg)
    proc = snakemake(wf, "-n", "--forceall", "results/published/h200/points/blockscaled", "--quiet", "rules")
    plan = proc.stdout + proc.stderr
    runs = {line.split()[0] for line in plan.splitlines() if line.startswith("run_")}
    # fbgemm_groupwise_fp8 is an entry of the family (a library peer row), not a zoo entry's peer: no zoo of its own
    assert runs == {"run_blockscaled_sm90", "run_blockscaled_g128", "run_blockscaled_sm100", "run_cublas_blockwise_fp8",
                    "run_fbgemm_groupwise_fp8", "run_cublas_fp8_e4m3", "run_blockscaled_sm90_zoo",
                    "run_cublas_blockwise_fp8_zoo", "run_cublas_fp8_e4m3_zoo"}, plan
    assert "measure_ceilings" in plan and "publish_family" in plan and "emulate_" not in plan
    # the main job of a CPU host reads the published points and never rebuilds or republishes them
    proc = snakemake(wf, "-n", "--quiet", "rules")
    plan = proc.stdout + proc.stderr
    assert "emulate_fp8_e4m3" in plan
    assert not {"publish_family", "collect_published", "report_published"} & set(plan.split())


@pytest.mark.workflow
def test_the_published_report_and_tables_are_rebuilt_from_the_points(tiny_run):
    wf = tiny_run  # the session's run rebuilt them (forced) from the committed points
    page = (wf / "results/published/h200/report.html").read_text()
    # every family's provenance (the commit it was measured at) is shown
    commits = {c for prov in (wf / "results/published/h200/points").glob("*/provenance.json")
               for c in json.loads(prov.read_text())["git_commits"]}
    assert "Point sets of h200 (published)" in page and commits and all(c[:7] in page for c in commits)
    sets = (wf / "results/published/h200/point_sets.csv").read_text()
    assert all(f in sets for f in ("fp8", "int4", "blockscaled", "dequant"))
    # the committed tables are exactly what the points rebuild to
    for table in PUBLISHED_TABLES:
        rebuilt, committed = (d / "results/published/h200" / table for d in (wf, REPO))
        assert rebuilt.read_bytes() == committed.read_bytes(), table
