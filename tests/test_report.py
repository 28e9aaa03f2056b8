"""The HTML report: self-contained, every figure decodes in a real browser, key numbers present."""
import json
import os
import re
import shutil
import subprocess
from html import escape as html_escape

import pandas as pd
import pytest
import yaml
from conftest import REPO, snakemake

from harness import tables  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIGURES = ["headline", "throughput", "speedup", "roofline", "weight_bandwidth", "accuracy", "compile_matrix", "comparison"]


def render_dom(html_file, tmp_path) -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/setup should have installed it")
        pytest.skip("chromium not installed")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=10000", "--dump-dom",
         html_file.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.workflow
def test_published_report_renders_in_chromium_with_its_numbers(tiny_run, tmp_path):
    wf = tiny_run  # the session's run rebuilt the published report from the committed points
    page = wf / "results/published/h200/report.html"
    html = page.read_text()
    assert "src=\"figures/" not in html and html.count("data:image/png;base64,") == len(FIGURES)  # self-contained
    for name in FIGURES:
        assert (wf / f"results/published/h200/figures/{name}.png").stat().st_size > 1000

    dom = render_dom(page, tmp_path)
    figures = int(re.search(r'data-figures="(\d+)"', dom).group(1))
    loaded = int(re.search(r'data-figures-loaded="(\d+)"', dom).group(1))
    assert figures == loaded == len(FIGURES)

    tidy = pd.read_parquet(REPO / "results/published/h200/tidy.parquet")
    best = tables.best_tiles(tidy)
    fp8 = best[(best["variant"] == "fp8_e4m3") & (best["shape"] == "8192x8192x8192") & (best["dist"] == "normal")]
    assert f"{fp8['throughput'].iloc[0]:.1f}" in dom  # the headline number, as the tidy table has it
    assert fp8["tile"].iloc[0] in dom
    for peer in ("cublas_fp8_e4m3_fastacc", "cublas_fp8_e4m3"):  # the matched peer and the second column
        base = best[(best["variant"] == peer) & (best["shape"] == "8192x8192x8192") & (best["dist"] == "normal")]
        assert f"{base['throughput'].iloc[0]:.1f}" in dom
    for col in ("NVIDIA H200", tidy["git_commit"].iloc[0], "unsupported"):
        assert col in dom
    # the first screen leads with the matched-peer speedup figure, then the at-a-glance table; the
    # banner is read from the rows (a GPU run), not from the host rendering it
    assert dom.index('alt="headline"') < dom.index("At a glance") < dom.index('alt="throughput"')
    assert "Run on NVIDIA H200 (sm_90a)" in dom and "Not run on a GPU" not in dom
    # every committed Nsight Compute profile is listed with its limiter and kernels
    summaries = sorted((REPO / "results/published/h200/profile").rglob("summary.json"))
    assert summaries and "<h2>Profiles</h2>" in dom
    for f in summaries:
        d = json.loads(f.read_text())
        assert d["limiter"] in dom and all(html_escape(k) in dom for k in d["kernel_names"]), f


@pytest.mark.workflow
def test_cpu_report_shows_published_gpu_numbers_labelled(tiny_run_copy, tmp_path):
    wf = tiny_run_copy
    cfg = yaml.safe_load((wf / "config.yaml").read_text())
    # a tolerance no fp8 GEMM meets: its rows are failed (a changed param reruns the emulation), and
    # failed is shown in red
    cfg["variants"]["fp8_e4m3"]["tolerance"]["kernel_rel_fro"] = 1e-12
    (wf / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake(wf)
    page = wf / "results/cpu/report.html"
    html = page.read_text()
    failed_red = "background: #f4b6bf"  # report.STATUS_STYLE["failed"], as pandas writes the CSS
    assert re.search(r"<td[^>]*>failed</td>", html) and failed_red in html
    dom = render_dom(page, tmp_path)
    assert "Not run on a GPU" in dom and "h200 (published)" in dom
    assert re.search(rf'data-figures-loaded="{len(FIGURES)}"', dom)
    own = pd.read_parquet(wf / "results/cpu/tidy.parquet")
    assert set(own[own["variant"] == "fp8_e4m3"]["status"]) == {"failed"}
    worst = own[own["variant"] == "fp8_e4m3"]["total_rel_fro"].max()
    assert f"{worst:.3g}" in dom  # this host's own numerics are in the page


def test_comparison_flags_regressions():
    tidy = pd.read_parquet(REPO / "results/published/h200/tidy.parquet")
    slower = tidy.copy()
    hit = (slower["variant"] == "fp8_e4m3") & (slower["shape"] == "8192x8192x8192")
    slower.loc[hit, "throughput"] *= 0.8
    cmp = tables.compare_sets(slower, tidy, threshold=0.05)
    flagged = cmp[cmp["regression"] != ""]
    assert set(flagged["variant"]) == {"fp8_e4m3"} and set(flagged["shape"]) == {"8192x8192x8192"}
    assert (flagged["regression"] == "slower").all()
    assert (tables.compare_sets(tidy, tidy, 0.05)["regression"] == "").all()


@pytest.mark.workflow
def test_snakemake_report_zip(tiny_run_copy):
    snakemake(tiny_run_copy, "--report", "results/report.zip")
    import zipfile

    names = zipfile.ZipFile(tiny_run_copy / "results/report.zip").namelist()
    for name in FIGURES:
        assert any(n.endswith(f"{name}.png") for n in names), names
