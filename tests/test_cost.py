"""Where a run's time goes (harness/cost.py): benchmark files read into a table of jobs, the platform filter, the
interval arithmetic behind "wall time to the report", run jobs' set-up against their timing, and the report's
"What this run cost" section with and without a cost table. No Snakemake is started: benchmark files and run
records are written by hand here."""
import json
import os
import re
import shutil

import pandas as pd
import pytest
from conftest import REPO

from harness import cost, jobs, report, tables
from harness.plan import published_points

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def bench(root, job, wall, end, rss=100.0, cpu=None, rows=1):
    """A benchmark file as Snakemake writes it (one row per repeat), ending at ``end`` (its mtime)."""
    path = root / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{wall}\t0:00:{int(wall):02d}\t{rss}\t200.0\t90.0\t95.0\t1.0\t2.0\t50.0\t{'NA' if cpu is None else cpu}\n"
    path.write_text(HEADER + line * rows)
    os.utime(path, (end, end))
    return path


def record(folder, platform, entry, dist, shape, spent=None):
    """A run record of a job's shape, with the ``cost`` object run_variant.py writes (None: an older record)."""
    path = folder / platform / entry / dist / f"{shape}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    M, N, K = map(int, shape.split("x"))
    rec = {"point": {"platform": platform, "target": "sm_90a", "variant": entry, "entry": entry, "family": "fp8",
                     "dist": dist, "shape": shape, "M": M, "N": N, "K": K, "log": f"results/logs/{platform}/{entry}/{dist}.log"},
           "env": {"node": "gpu-node-1"}, "rows": [{"tile": "lib", "status": "ok"}]}
    if spent is not None:
        rec["cost"] = {"process_start": "2027-01-15T07:59:00.000Z", "ready": "2027-01-15T07:59:05.000Z",
                       "shape_start": "2027-01-15T07:59:06.000Z", "shape_end": "2027-01-15T07:59:10.000Z",
                       **dict(zip(("load_s", "build_check_s", "standalone_s", "paired_s"), spent, strict=True))}
    path.write_text(json.dumps(rec))
    return str(path)


def test_a_benchmark_file_is_its_log_path_under_benchmarks():
    assert jobs.benchmark_of("results/logs/cpu/fp8_e4m3/normal.log") == "results/benchmarks/cpu/fp8_e4m3/normal.tsv"
    # a wildcard pattern stays a pattern (rules give their logs so)
    assert jobs.benchmark_of("results/logs/{platform}/fp8_e4m3/{dist}_zoo.log") == \
        "results/benchmarks/{platform}/fp8_e4m3/{dist}_zoo.tsv"
    assert jobs.benchmark_of("results/logs/screenshots/{folder}.log") == "results/benchmarks/screenshots/{folder}.tsv"
    for bad in ("results/cpu/collect.log", "results/logs/cpu/collect.txt"):
        with pytest.raises(ValueError, match="not a log path"):
            jobs.benchmark_of(bad)


@pytest.mark.parametrize("job,kind,result_set", [
    ("inputs/normal/64x128x128", "inputs", None),
    ("compile/fp8_e4m3", "compile", None),
    ("compile/fp8_e4m3/sm_90a/sweep/m64n64k64_s2_t128", "compile", None),
    ("cpu/fp8_e4m3/normal", "run", "cpu"),
    ("h200/fp8_e4m3_ws/normal_zoo", "run", "h200"),
    ("h200/ceilings", "ceilings", "h200"),
    ("h200/tuning/fp8_e4m3_ws", "tune", "h200"),
    ("h200/profile/fp8_e4m3/normal/4096x4096x4096/lib", "other", "h200"),
    ("h200/collect", "collect", "h200"),
    ("h200/report", "report", "h200"),
    ("published/h200/publish_fp8", "publish", "published/h200"),
    ("published/h200/tuning_fp8", "publish", "published/h200"),
    ("published/h200/collect", "collect", "published/h200"),
    ("published/h200/report", "report", "published/h200"),
    ("screenshots/results/published/h200", "report", "published/h200"),
])
def test_a_jobs_kind_and_result_set_come_from_its_path(job, kind, result_set):
    assert cost.kind_of(job) == kind and cost.set_of(job) == result_set


def test_the_reader_takes_wall_memory_cpu_and_times_from_each_file(tmp_path, capsys):
    root = tmp_path / "benchmarks"
    bench(root, "cpu/fp8_e4m3/normal", 12.5, T0 + 100, rss=321.5, cpu=20.25)
    bench(root, "compile/fp8_e4m3", 4.0, T0 + 10, rss=50.0, cpu=None, rows=2)  # two repeats; no CPU sampled
    (root / "cpu/broken.tsv").write_text("")  # unreadable: named on stderr, its job without a cost
    t = cost.read_benchmarks(root)
    assert list(t["job"]) == ["compile/fp8_e4m3", "cpu/fp8_e4m3/normal", "cpu/broken"]  # by start, none last
    run = t.set_index("job").loc["cpu/fp8_e4m3/normal"]
    assert (run["kind"], run["wall_s"], run["max_rss_mb"], run["cpu_s"]) == ("run", 12.5, 321.5, 20.25)
    assert run["end"] == "2027-01-15T08:01:40.000Z" and run["start"] == "2027-01-15T08:01:27.500Z"
    comp = t.set_index("job").loc["compile/fp8_e4m3"]
    assert comp["wall_s"] == 8.0 and pd.isna(comp["cpu_s"]) and comp["start"] == "2027-01-15T08:00:02.000Z"
    assert t.set_index("job").loc["cpu/broken", ["wall_s", "start"]].isna().all()
    assert "cpu/broken.tsv: unreadable benchmark" in capsys.readouterr().err


def test_another_platforms_jobs_are_left_out(tmp_path):
    root = tmp_path / "benchmarks"
    for job in ("inputs/normal/64x128x128", "compile/fp8_e4m3", "compile/fp8_e4m3/sm_90a/sweep/m64n64k64_s2_t128",
                "h200/fp8_e4m3/normal", "h200/ceilings", "h100/fp8_e4m3/normal", "h100/ceilings",
                "cpu/fp8_e4m3/normal", "published/h200/publish_fp8", "screenshots/results/cpu"):
        bench(root, job, 1.0, T0)
    shared = {"inputs/normal/64x128x128", "compile/fp8_e4m3", "compile/fp8_e4m3/sm_90a/sweep/m64n64k64_s2_t128"}
    assert set(cost.read_benchmarks(root, "h200")["job"]) == shared | {"h200/fp8_e4m3/normal", "h200/ceilings"}
    assert set(cost.read_benchmarks(root, "cpu")["job"]) == shared | {"cpu/fp8_e4m3/normal", "screenshots/results/cpu"}
    # files: only those named, still filtered; a missing one is its job's row without a cost
    named = [str(root / f"{j}.tsv") for j in ("h200/ceilings", "h100/ceilings", "h200/fp8_e5m2/normal")]
    t = cost.read_benchmarks(root, "h200", named)
    assert list(t["job"]) == ["h200/ceilings", "h200/fp8_e5m2/normal"]
    assert t["wall_s"].tolist()[0] == 1.0 and t[["wall_s", "start", "end"]].iloc[1].isna().all()
    s = cost.summary(t)
    assert (s["jobs"], s["unrecorded"], s["union_s"], list(s["slowest"]["job"])) == (1, 1, 1.0, ["h200/ceilings"])


def test_union_span_and_sittings_of_hand_made_intervals():
    overlapping = [(0.0, 10.0), (5.0, 20.0)]
    touching = [(20.0, 30.0)]  # starts as the last one ends
    later = [(75.0, 85.0)]  # 45 s after: the same sitting, but the gap is no job's time
    reused = [(-86_400.0, -86_300.0)]  # a job reused from yesterday's invocation: its own 100 s only
    iv = overlapping + touching + later + reused
    assert cost.union_s(overlapping) == 20.0
    assert cost.union_s(overlapping + touching) == 30.0
    assert cost.union_s(iv) == 30.0 + 10.0 + 100.0
    assert cost.merged(overlapping + touching) == [(0.0, 30.0)]
    assert cost.sittings(overlapping + touching + later) == 1
    assert cost.sittings(iv) == 2
    assert cost.sittings([(0.0, 10.0), (70.0, 80.0)]) == 2  # 60 s apart is a new sitting
    assert cost.sittings([]) == 0 and cost.union_s([]) == 0.0


def test_a_run_jobs_setup_is_its_wall_time_less_its_records_timing(tmp_path):
    root = tmp_path / "benchmarks"
    bench(root, "h200/fp8_e4m3/normal", 100.0, T0 + 100)
    bench(root, "h200/cublas_bf16/normal", 30.0, T0 + 140)
    bench(root, "compile/fp8_e4m3", 20.0, T0 - 5)
    runs = tmp_path / "runs"
    files = [record(runs, "h200", "fp8_e4m3", "normal", "64x128x128", (1.0, 9.0, 20.0, 30.0)),
             record(runs, "h200", "fp8_e4m3", "normal", "128x128x128", (2.0, 8.0, 10.0, 5.0)),
             record(runs, "h200", "cublas_bf16", "normal", "64x128x128")]  # older: no cost
    t = cost.job_table(root, "h200", run_files=files).set_index("job")
    fp8 = t.loc["h200/fp8_e4m3/normal"]
    assert fp8["records"] == 2 and fp8["load_s"] == 3.0 and fp8["build_check_s"] == 17.0
    assert (fp8["standalone_s"], fp8["paired_s"], fp8["timing_s"], fp8["setup_s"]) == (30.0, 35.0, 65.0, 35.0)
    assert t.loc["h200/cublas_bf16/normal", ["records", "timing_s", "setup_s"]].isna().all()
    assert pd.isna(t.loc["compile/fp8_e4m3", "setup_s"])
    s = cost.summary(t.reset_index())
    assert (s["run_jobs"], s["run_jobs_split"]) == (2, 1)
    assert s["run"]["setup_s"] == 35.0 and s["run"]["timing_s"] == 65.0 and s["run"]["wall_s"] == 100.0
    # the compile (-25..-5), the fp8 run (0..100) and the bf16 run (110..140): 5 and 10 s apart, one sitting
    assert s["union_s"] == 150.0 and s["span_s"] == 165.0 and s["sittings"] == 1
    kinds = s["per_kind"].set_index("kind")
    assert list(kinds.index) == ["compile", "run"] and kinds.loc["run", "jobs"] == 2 and kinds.loc["run", "wall_s"] == 130.0
    assert list(s["slowest"]["job"]) == ["h200/fp8_e4m3/normal", "h200/cublas_bf16/normal", "compile/fp8_e4m3"]


def test_the_report_section_with_a_cost_table(tmp_path):
    root = tmp_path / "benchmarks"
    bench(root, "inputs/normal/64x128x128", 3.0, T0 + 3)
    bench(root, "compile/fp8_e4m3", 50.0, T0 + 50)
    bench(root, "h200/fp8_e4m3/normal", 300.0, T0 + 400)  # 50 s after the compile: one sitting
    bench(root, "h200/ceilings", 20.0, T0 - 3 * 3600)  # reused from three hours before: a sitting of its own
    runs = tmp_path / "runs"
    files = [record(runs, "h200", "fp8_e4m3", "normal", "64x128x128", (5.0, 25.0, 100.0, 120.0))]
    folder = tmp_path / "h200"
    folder.mkdir()
    cost.job_table(root, "h200", run_files=files).to_csv(folder / "cost.csv", index=False)
    html = report.cost_section(folder)
    text = re.sub(r"<[^>]+>", "", html)
    assert "What this run cost" in text
    # 20 s + 50 s + 300 s of jobs; first start to last end: 11220 s; two sittings
    assert "Wall time to the report: 6 min 10 s with at least one of its 4 jobs running" in text
    assert "over 3 h 07 min from the first start to the last end, in 2 sittings" in text
    assert "The 4 slowest jobs" in text and "h200/fp8_e4m3/normal" in text
    assert ("Run jobs (1 of 1 with a split): 5 min 00 s, of which 3 min 40 s timing (1 min 40 s standalone, "
            "2 min 00 s paired) and 1 min 20 s set-up (5.0 s loading inputs, 25.0 s building and checking") in text
    for kind in ("inputs", "compile", "run", "ceilings"):
        assert re.search(rf">{kind}</td>", html), kind


def test_the_report_section_says_so_in_one_line_without_a_cost_table(tmp_path):
    folder = tmp_path / "cpu"
    folder.mkdir()
    html = report.cost_section(folder)
    assert "No cost recorded" in html and "<table" not in html
    (folder / "cost.csv").write_text("")  # damaged: said, never a crash
    assert "could not be read" in report.cost_section(folder)


def test_the_committed_published_set_carries_what_its_run_cost():
    """Every family of the committed H200 set was published with its jobs' cost files, and the published
    report reads them (the 10-minute claim of docs/operations.md rests on them)."""
    folder = REPO / "results/published/h200"
    families = sorted(p.name for p in (folder / "points").iterdir() if p.is_dir())
    assert cost.published_cost_files(folder) == [str(folder / f"points/{f}/cost.csv") for f in families]
    assert set(cost.concat_point_sets(folder)["point_set"]) == set(families)
    assert "Wall time to the report" in re.sub(r"<[^>]+>", "", report.cost_section(folder))


def test_published_costs_are_concatenated_a_shared_job_counted_once(tmp_path):
    folder = tmp_path / "published/h200"
    shutil.copytree(REPO / "results/published/h200/points", folder / "points")
    for published in (folder / "points").glob("*/cost.csv"):  # as point sets published before costs were recorded
        published.unlink()
    before = tables.point_sets(folder / "points", None, {})[0]
    files_before = published_points(folder)
    root = tmp_path / "benchmarks"
    bench(root, "h200/ceilings", 20.0, T0)
    bench(root, "h200/fp8_e4m3/normal", 60.0, T0 + 100)
    bench(root, "h200/int4_ws/normal", 40.0, T0 + 200)
    table = cost.job_table(root, "h200")
    # fp8 and int4 published from the same run: both hold its ceilings job
    table[table["job"] != "h200/int4_ws/normal"].to_csv(folder / "points/fp8/cost.csv", index=False)
    table[table["job"] != "h200/fp8_e4m3/normal"].to_csv(folder / "points/int4/cost.csv", index=False)
    assert cost.published_cost_files(folder) == [str(folder / f"points/{f}/cost.csv") for f in ("fp8", "int4")]
    both = cost.concat_point_sets(folder)
    assert sorted(both["job"]) == ["h200/ceilings", "h200/fp8_e4m3/normal", "h200/int4_ws/normal"]
    assert cost.summary(both)["union_s"] == 120.0
    assert "Wall time to the report: 2 min 00 s" in re.sub(r"<[^>]+>", "", report.cost_section(folder))
    # a family folder's cost.csv is no point: the published points and tables read as before
    assert published_points(folder) == files_before
    after = tables.point_sets(folder / "points", None, {})[0]
    pd.testing.assert_frame_equal(before, after)
    # the blockscaled and dequant point sets have none: the others' are still read
    assert set(both["point_set"]) == {"fp8", "int4"}


RULE = re.compile(r"^\s*rule\b", re.M)


def test_every_rule_with_a_log_records_its_benchmark_beside_it():
    """benchmark: benchmark_of(<its log>), the same string; the GPU jobs first (GPU_PRIORITY), then what they need,
    inputs and sweep compiles in the GPU's queue order, then the compile checks, longest first (harness/plan.py)."""
    priorities = {}
    for smk in sorted((REPO / "workflow/rules").glob("*.smk")):
        text = smk.read_text()
        starts = [m.start() for m in RULE.finditer(text)]
        for a, b in zip(starts, [*starts[1:], len(text)][:len(starts)], strict=True):
            block = text[a:b]
            name = re.search(r"rule\s+(\w+):|name:\s*\n\s*f?\"([^\"]+)\"", block)
            name = name.group(1) or name.group(2)
            log = re.search(r"\n\s*log:\s*\n\s*(.+?),?\n", block)
            if log is None:
                continue
            bm = re.search(r"\n\s*benchmark:\s*\n\s*benchmark_of\((.+)\)\n", block)
            assert bm is not None and bm.group(1) == log.group(1), f"{smk.name}: rule {name}"
            prio = re.search(r"\n\s*priority:\s*(.+)\n", block)
            priorities[name] = prio.group(1).strip() if prio else "0"
    assert len(priorities) >= 16, priorities
    assert {n for n, p in priorities.items() if p == "GPU_PRIORITY"} == {"measure_ceilings", "tune_{_variant}"}, priorities
    assert priorities["run_{_variant}"] == priorities["run_{_variant}_zoo"] == "run_priority(impl(_variant))"
    assert priorities["build_inputs_{_name}"] == "input_priority"
    assert priorities["compile_{_variant}_sweep"] == "sweep_compile_priority(_variant)"
    assert priorities["compile_{_variant}"] == "longest_first(PLAN.check_compile_seconds(_variant), CHECK_PRIORITY)"


def test_a_library_that_compiles_per_shape_waits_for_the_other_gpu_jobs():
    from harness.plan import GPU_PRIORITY, QUEUED_TOP, run_priority
    from kernels.registry import VARIANTS, load_all

    load_all()
    compiling = {n for n, v in VARIANTS.items() if v.prepare_compiles}
    assert compiling == {"humming_w4_int4_g128"}
    assert run_priority(VARIANTS["humming_w4_int4_g128"]) < run_priority(VARIANTS["cublas_bf16"]) == GPU_PRIORITY
    # still above every CPU job's
    assert run_priority(VARIANTS["humming_w4_int4_g128"]) > QUEUED_TOP
