"""Reading the pipeline's JSON (issue 30): one reader (harness/records.py) whose one exception names the
file, what is wrong and the fix; a damaged file costs its own rows or its own section, never the job."""
import json
import pickle
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO

from harness import records, tables
from harness.inputs import CorruptInput, load_format, load_point, manifest, save_operands
from harness.records import DamagedFile, failure_lines, read_json
from kernels.registry import VARIANTS, bytes_per_element, load_all

PUBLISHED = REPO / "results/published/h200"
FIGURES = ["headline", "throughput", "speedup", "roofline", "weight_bandwidth", "accuracy", "compile_matrix", "comparison"]


def run_record(entry="fp8_e4m3", shape="16x512x512", rows=None, platform="cpu", log="results/logs/cpu/fp8_e4m3/normal.log"):
    M, N, K = (int(x) for x in shape.split("x"))
    point = {"platform": platform, "target": "cpu", "variant": entry, "entry": entry, "family": "fp8", "dist": "normal",
             "shape": shape, "M": M, "N": N, "K": K, "input_format": "fp8_e4m3_tensor", "ops_unit": "TFLOP/s",
             "precision": "fp8", "baseline": "cublas_fp8_e4m3_fastacc", "second_baseline": "cublas_fp8_e4m3",
             "input_sha256": {}, "log": log}
    ok = {"tile": "emulated", "status": "ok", "reason": "", "total_rel_fro": 0.0376, "total_calc_diff": 7e-4,
          "kernel_rel_fro": 0.00166, "kernel_calc_diff": 1.4e-6}
    return {"point": point, "env": {"date": "2026-12-03T13:05:31Z", "gpu_name": "none", "git_commit": "abc",
                                    "driver": "none", "cuda": "none", "torch": "2", "tilelang": "0.1.15"},
            "tolerance": {"total_rel_fro": 0.05, "total_calc_diff": 0.0015, "kernel_rel_fro": 0.005,
                          "kernel_calc_diff": 1e-4},
            "rows": [ok] if rows is None else rows}


def write(path: Path, value) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


# ---------------------------------------------------------------- the reader


def test_the_reader_says_truncated_not_json_wrong_shape_and_missing(tmp_path):
    good = json.dumps(run_record())
    f = tmp_path / "results/cpu/fp8_e4m3/normal/16x512x512.json"
    for cut in (10, 57, len(good) // 2, len(good) - 1):  # mid-key, mid-string, mid-number, the last brace
        write(f, good[:cut])
        with pytest.raises(DamagedFile, match="truncated JSON") as err:
            read_json(f, records.RUN)
        assert err.value.path == str(f) and f"snakemake --cores 1 -f {f}" in str(err.value)
    write(f, "")
    with pytest.raises(DamagedFile, match="empty file"):
        read_json(f)
    write(f, good.replace('"point"', "'point'", 1))
    with pytest.raises(DamagedFile, match="not valid JSON"):
        read_json(f)
    write(f, json.dumps(run_record(rows=[{"status": "ok"}])))
    with pytest.raises(DamagedFile, match=r"wrong shape: key 'rows\[0\]\.tile' is missing \(expected a string\)"):
        read_json(f, records.RUN)
    write(f, json.dumps(run_record() | {"tolerance": None}))
    with pytest.raises(DamagedFile, match="wrong shape: 'tolerance' is null, expected an object"):
        read_json(f, records.RUN)
    d = run_record()
    d["point"]["M"] = True
    write(f, json.dumps(d))
    with pytest.raises(DamagedFile, match="'point.M' is a boolean, expected an integer"):
        read_json(f, records.RUN)
    with pytest.raises(DamagedFile, match=f"{tmp_path}/nothing.json: missing; recompute it"):
        read_json(tmp_path / "nothing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(DamagedFile, match="unreadable: not UTF-8"):
        read_json(tmp_path / "bin.json")


def test_damaged_file_pickles_and_corrupt_input_is_one():
    e = DamagedFile("results/x.json", "truncated JSON")
    again = pickle.loads(pickle.dumps(e))  # a job's exception may cross a process boundary
    assert str(again) == str(e) and again.fix == e.fix
    c = CorruptInput("results/inputs/normal/8x8x8/fp32.pt", "input file is missing")
    assert isinstance(c, DamagedFile) and isinstance(c, ValueError)


def test_the_fix_is_a_command_that_runs_as_printed():
    # snakemake refuses a run without --cores: the printed command must carry it
    assert records.fix_for("results/cpu/a/normal/8x8x8.json") == \
        "recompute it: snakemake --cores 1 -f results/cpu/a/normal/8x8x8.json"
    prov = "results/published/h200/points/fp8/provenance.json"
    fix = records.fix_for(prov)
    assert fix.startswith(f"restore the committed file: git checkout -- {prov}")
    assert "snakemake --cores 1 -f results/published/h200/points/fp8)" in fix
    assert records.fix_for("results/published/h200/tidy.csv") == \
        "restore the committed file: git checkout -- results/published/h200/tidy.csv"


def test_every_committed_published_json_has_its_shape():
    """The shapes are what the pipeline writes: every committed point, record and summary passes them."""
    shapes = {"provenance.json": records.PROVENANCE, "ceilings.json": records.CEILINGS,
              "summary.json": records.PROFILE_SUMMARY, "calibration.json": records.CALIBRATION}
    n = 0
    for f in sorted(PUBLISHED.rglob("*.json")):
        parts = f.relative_to(PUBLISHED).parts
        shape = shapes.get(f.name) or (records.RUN if "runs" in parts else records.COMPILE if "compile" in parts
                                       else records.TUNE if "tuning" in parts else None)
        assert shape is not None, f
        read_json(f, shape)
        n += 1
    assert n > 500


# ---------------------------------------------------------------- 1. sweep compile records of a GPU run


def compile_record(root: Path, tile: str, shapes, status="ok", reason="") -> str:
    return write(root / f"results/compile/fp8_e4m3/sm_90a/sweep/{tile}.json",
                 {"variant": "fp8_e4m3", "target": "sm_90a", "tile": tile,
                  "records": [{"shape": s, "status": status, "reason": reason} for s in shapes]})


def test_a_damaged_sweep_record_fails_its_tile_at_every_shape_only(tmp_path, capsys):
    shapes = ["256x256x256", "512x512x512"]
    good = compile_record(tmp_path, "m64n64k64_s2", shapes)
    slow = compile_record(tmp_path, "m128n128k64_s3", shapes[:1], "failed", "ptxas: too many registers")
    bad = compile_record(tmp_path, "m128n256k128_s4", shapes)
    Path(bad).write_text(Path(bad).read_text()[:60])  # truncated
    out = records.compile_outcomes([good, slow, bad], shapes)
    for s in shapes:
        status, reason = out[s]["m128n256k128_s4"]
        assert status == "failed" and reason.startswith(f"{bad}: truncated JSON")
        assert f"recompute it: snakemake --cores 1 -f {bad}" in reason
        assert out[s]["m64n64k64_s2"] == ("ok", "")
    assert out[shapes[0]]["m128n128k64_s3"] == ("failed", "ptxas: too many registers")
    assert bad in capsys.readouterr().err  # and in the run job's log
    # valid JSON of the wrong shape is damaged too
    Path(bad).write_text(json.dumps({"variant": "fp8_e4m3", "target": "sm_90a", "tile": "x", "records": None}))
    (status, reason), = {v["m128n256k128_s4"] for v in records.compile_outcomes([bad], shapes).values()}
    assert status == "failed" and "wrong shape: 'records' is null, expected an array" in reason


# ---------------------------------------------------------------- 2. damaged committed points in the report


def small_published(tmp_path: Path) -> Path:
    """A published folder of part of the fp8 family (its committed points: fp8_e4m3 and its two peers at
    normal inputs, their compile records, ceilings and provenance), to damage."""
    src, pub = PUBLISHED / "points/fp8", tmp_path / "results/published/h200"
    keep = ("fp8_e4m3", "cublas_fp8_e4m3", "cublas_fp8_e4m3_fastacc")
    for f in src.rglob("*.json"):
        rel = f.relative_to(src)
        if rel.parts[0] == "runs" and (rel.parts[1] not in keep or rel.parts[2] != "normal"):
            continue
        if rel.parts[0] == "compile" and rel.parts[1] not in keep:
            continue
        (pub / "points/fp8" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, pub / "points/fp8" / rel)
    return pub


def test_point_sets_list_a_damaged_provenance_point_and_ceilings(tmp_path):
    pub = small_published(tmp_path)
    prov = pub / "points/fp8/provenance.json"
    prov.write_text(prov.read_text()[:50])
    point = sorted((pub / "points/fp8/runs/fp8_e4m3").rglob("*.json"))[0]
    point.write_text(point.read_text()[:80])
    bytes_of = {v: bytes_per_element(v) for v in VARIANTS}
    damaged = []
    df, ceilings, compiled, sets = tables.point_sets(pub / "points", None, bytes_of, damaged=damaged)
    assert [d.path for d in damaged] == [str(prov), str(point)]
    assert all("git checkout -- " in d.fix for d in damaged)
    assert sets["damaged"].iloc[0].startswith(f"{prov}: truncated JSON")
    row = df[df["source_file"] == str(point)]
    # the damaged point is a failed row that names it, with its entry's own variant and family
    assert list(row["status"]) == ["failed"] and str(point) in row["reason"].iloc[0]
    assert row["variant"].iloc[0] == "fp8_e4m3" and row["family"].iloc[0] == "fp8"
    assert (df[df["source_file"] != str(point)]["status"] != "failed").any()
    # a damaged ceilings file leaves its probes out, listed
    ceil = pub / "points/fp8/ceilings.json"
    ceil.write_text('{"env": {}, "ceilings": []}')
    damaged = []
    _, ceilings, _, _ = tables.point_sets(pub / "points", None, bytes_of, damaged=damaged)
    assert ceilings == {} and str(ceil) in [d.path for d in damaged]


def cpu_set(tmp_path: Path) -> Path:
    """This host's collect outputs: a CPU emulation of fp8_e4m3 at one shape."""
    d = tmp_path / "results/cpu"
    f = write(d / "fp8_e4m3/normal/16x512x512.json", run_record())
    tables.tidy_runs([f]).to_parquet(d / "tidy.parquet", index=False)
    tables.compile_matrix([]).to_csv(d / "compile_matrix.csv", index=False)
    return d


def test_the_cpu_report_renders_and_lists_damaged_published_files(tmp_path, capsys):
    from harness.report import render_report

    load_all()
    pub, this = small_published(tmp_path), cpu_set(tmp_path)
    prov = pub / "points/fp8/provenance.json"
    prov.write_text(prov.read_text()[:50])
    point = sorted((pub / "points/fp8/runs/cublas_fp8_e4m3").rglob("*.json"))[0]
    point.write_text(point.read_text()[:80])
    spec = yaml.safe_load((REPO / "config.yaml").read_text())["platforms"]["h200"]
    limits = {str(this): None, str(pub): {k: spec[k] for k in ("name", "peak", "hbm_TBps", "source")}}
    page, pngs = render_report(this, "cpu (this run)", limits, [(str(pub), "h200 (published)")], 0.05,
                               {n: n for n in FIGURES}, VARIANTS)
    assert set(pngs) == set(FIGURES)
    section = page[page.index('id="damaged-inputs"'):page.index("</div>", page.index('id="damaged-inputs"'))]
    assert "<h2>Damaged inputs</h2>" in section and "Warning: 2 file(s)" in section
    for f in (prov, point):
        assert str(f) in section and f"git checkout -- {f}" in section
    assert page.index("Damaged inputs") < page.index("At a glance")  # on the first screen
    err = capsys.readouterr().err
    assert f"lpgemm: warning: damaged input: {prov}: truncated JSON" in err and str(point) in err


# ---------------------------------------------------------------- 3. valid JSON of the wrong shape in collect


@pytest.mark.parametrize("content", ["null", '{"rows": null}', '{"rows": "x"}', '{"point": []}', "[]",
                                     json.dumps(run_record(rows=[{"tile": "emulated", "status": "ok"}, 3]))])
def test_a_result_of_the_wrong_shape_becomes_a_named_failed_row(tmp_path, content):
    good = write(tmp_path / "results/cpu/fp8_e4m3/normal/16x512x512.json", run_record())
    bad = write(tmp_path / "results/cpu/fp8_e4m3/normal/48x64x128.json", content)
    damaged = []
    df = tables.tidy_runs([good, bad], defaults={"*": {"platform": "cpu"}}, damaged=damaged)
    row = df[df["shape"] == "48x64x128"]
    assert list(row["status"]) == ["failed"] and row["tile"].iloc[0] == "?"
    assert row["reason"].iloc[0].startswith(f"{bad}: wrong shape: ")
    assert f"recompute it: snakemake --cores 1 -f {bad}" in row["reason"].iloc[0]
    assert (row["M"].iloc[0], row["entry"].iloc[0], row["platform"].iloc[0]) == (48, "fp8_e4m3", "cpu")
    assert list(df[df["shape"] == "16x512x512"]["status"]) == ["ok"]
    assert [d.path for d in damaged] == [bad]


def test_a_row_without_status_is_failed_naming_the_file(tmp_path):
    rows = [{"tile": "emulated", "reason": "", "total_rel_fro": 0.1}]
    f = write(tmp_path / "results/cpu/fp8_e4m3/normal/16x512x512.json", run_record(rows=rows))
    df = tables.tidy_runs([f])
    assert list(df["status"]) == ["failed"]
    reason = df["reason"].iloc[0]
    assert reason.startswith(f"{f}: wrong shape: key 'rows[0].status' is missing")
    assert f"snakemake --cores 1 -f {f}" in reason
    assert "emulated" in failure_lines([f], [])[1]  # the failure summary lists it too


def test_compile_matrix_turns_a_wrong_shaped_record_into_a_failed_row(tmp_path):
    f = write(tmp_path / "results/compile/fp8_e4m3/sm_90a/sweep/m64n64k64_s2.json", {"records": [{"status": "ok"}]})
    damaged = []
    cm = tables.compile_matrix([f], damaged)
    assert list(cm[["variant", "target", "tile", "status"]].iloc[0]) == ["fp8_e4m3", "sm_90a", "m64n64k64_s2", "failed"]
    assert "wrong shape: key 'variant' is missing" in cm["reason"].iloc[0] and [d.path for d in damaged] == [f]


# ---------------------------------------------------------------- 4. a manifest without a format's entry


@pytest.fixture
def input_set(tmp_path):
    folder = tmp_path / "results/inputs/normal/8x8x8"
    A, B = torch.ones(8, 8), torch.full((8, 8), 2.0)
    fp32 = folder / "fp32.pt"
    fmt = folder / "formats/bf16.pt"
    m = {"fp32": {"tensors": save_operands({"A": A, "B": B}, fp32), "file_sha256": None},
         "formats": {"bf16": {"tensors": save_operands({"A": A.bfloat16(), "B": B.bfloat16()}, fmt), "file_sha256": None}}}
    from harness.inputs import file_sha256

    m["fp32"]["file_sha256"], m["formats"]["bf16"]["file_sha256"] = file_sha256(fp32), file_sha256(fmt)
    man = folder / "manifest.json"
    man.write_text(json.dumps(m))
    return fp32, fmt, man


def test_a_manifest_without_the_format_entry_is_a_corrupt_input(input_set):
    fp32, fmt, man = input_set
    raw, ops, sha = load_point(fp32, fmt, man, "bf16")
    assert sha == {k: v["sha256"] for k, v in manifest(ops).items()}
    for call in (lambda: load_point(fp32, fmt, man, "fp8_e5m2_tensor"),
                 lambda: load_format(fmt, man, "fp8_e5m2_tensor")):
        with pytest.raises(CorruptInput, match=r"no entry formats\.fp8_e5m2_tensor \(it has: bf16\)") as err:
            call()
        assert str(err.value).startswith(f"{man}: ")
        assert str(err.value).endswith(f"rebuild the input set: snakemake --cores 1 -f {man}")
    m = json.loads(man.read_text())
    del m["formats"]["bf16"]["file_sha256"]
    man.write_text(json.dumps(m))
    with pytest.raises(CorruptInput, match=r"wrong shape: key 'formats\.bf16\.file_sha256' is missing"):
        load_point(fp32, fmt, man, "bf16")
    man.write_text(json.dumps({"formats": {}}))
    with pytest.raises(CorruptInput, match=rf"{man}: wrong shape: key 'fp32' is missing"):
        load_point(fp32, fmt, man, "bf16")


# ---------------------------------------------------------------- 6. the end-of-run failure summary


def test_failure_lines_list_failed_rows_compile_records_and_unreadable_files(tmp_path):
    root = tmp_path
    ok = write(root / "results/cpu/fp8_e4m3/normal/16x512x512.json", run_record())
    failed = write(root / "results/cpu/fp8_e4m3/normal/48x64x128.json",
                   run_record(shape="48x64x128", rows=[{"tile": "emulated", "status": "failed", "reason": "too wrong"}]))
    truncated = write(root / "results/cpu/fp8_e4m3/normal/64x128x128.json", json.dumps(run_record())[:70])
    check = write(root / "results/compile/fp8_e4m3/sm_90a/m64n64k64_s2.json",
                  {"variant": "fp8_e4m3", "target": "sm_90a", "tile": "m64n64k64_s2",
                   "records": [{"shape": "256x256x256", "status": "failed", "reason": "nvcc: error"},
                               {"shape": "512x512x512", "status": "unsupported", "reason": "arch"}]})
    sweep = compile_record(root, "m128n256k128_s4", ["256x256x256"], "failed", "SASS lacks WGMMA")
    broken = compile_record(root, "m64n128k64_s2", ["256x256x256"])
    Path(broken).write_text("{")
    missing = str(root / "results/cpu/fp8_e4m3/normal/8x8x8.json")  # not made yet: skipped

    lines = failure_lines([ok, failed, truncated, missing], [check, sweep, broken])
    text = "\n".join(lines)
    assert lines[0] == "lpgemm: 2 failed row(s), 3 failed compile record(s):"
    assert f"  {failed} [emulated]: too wrong\n      log: results/logs/cpu/fp8_e4m3/normal.log" in text
    assert f"  {truncated} [?]: {truncated}: truncated JSON" in text
    assert f"snakemake --cores 1 -f {truncated}" in text
    assert f"  {check} [256x256x256]: nvcc: error\n      log: {root}/results/logs/compile/fp8_e4m3.log" in text
    assert "512x512x512" not in text  # unsupported is no failure
    assert (f"  {sweep} [256x256x256]: SASS lacks WGMMA\n"
            f"      log: {root}/results/logs/compile/fp8_e4m3/sm_90a/sweep/m128n256k128_s4.log") in text
    assert f"  {broken} [?]: {broken}: " in text and f"snakemake --cores 1 -f {broken}" in text
    assert ok not in text and missing not in text
    # relative paths, as the Snakefile passes them: the logs are relative too
    assert records.compile_log("results/compile/v/sm_90a/t.json") == "results/logs/compile/v.log"
    assert records.compile_log("results/compile/v/sm_90a/sweep/t.json") == "results/logs/compile/v/sm_90a/sweep/t.log"

    short = failure_lines([failed, truncated], [check, sweep, broken], limit=2)
    assert short[-1].startswith("  ... and 3 more") and len([s for s in short if s.startswith(f"  {root}")]) == 2
    assert failure_lines([ok, missing], []) == []


def test_collect_and_report_read_no_json_directly():
    """Every JSON read in the harness and workflow scripts of this change goes through the one reader."""
    for f in ("harness/tables.py", "harness/inputs.py", "harness/report.py", "harness/figures.py",
              "workflow/scripts/collect.py", "workflow/scripts/run_variant.py", "workflow/scripts/publish.py",
              "workflow/scripts/report.py"):
        text = (REPO / f).read_text()
        assert "json.loads(" not in text and "json.load(" not in text, f


def test_published_tables_unchanged_by_the_reader():
    """The committed published tables still come out of the committed points (no row lost or added)."""
    bytes_of = {v: bytes_per_element(v) for v in VARIANTS}
    damaged = []
    df, _, _, sets = tables.point_sets(PUBLISHED / "points", None, bytes_of, damaged=damaged)
    assert damaged == [] and "damaged" not in sets
    committed = pd.read_csv(PUBLISHED / "tidy.csv", usecols=["point_set", "entry", "dist", "shape", "tile", "status"])
    assert len(df) == len(committed) and (df["status"] == "failed").sum() == (committed["status"] == "failed").sum()
