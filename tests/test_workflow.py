"""The Snakemake workflow end to end on a CPU-only host, in a throwaway copy of the repo."""
import json

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake, tiny_config

pytestmark = pytest.mark.workflow


def test_default_config_dry_run_plans_every_stage():
    proc = snakemake(REPO, "-n", "--forceall", "--quiet", "rules")  # the plan, whatever has already run here
    for rule in ("build_inputs", "compile_fp8_e4m3", "run_fp8_e4m3", "run_cublas_bf16", "collect", "report"):
        assert rule in proc.stdout, proc.stdout
    # the default profile makes GPU jobs exclusive
    assert "profiles/default" in proc.stdout + proc.stderr


@pytest.mark.parametrize("edit,key", [
    (lambda c: c["variants"]["fp8_e4m3"]["tolerance"].update(total_rel_fro=-1), "variants.fp8_e4m3.tolerance.total_rel_fro"),
    (lambda c: c.update(seeed=1), "seeed"),
    (lambda c: c["timing"].update(reps=5), "timing.reps"),
    (lambda c: c["variants"].update(fp9_e9m9={"tolerance": {}}), "variants.fp9_e9m9"),
    (lambda c: c["variants"]["fp8_e4m3"]["tiles"].update(default=["m64n64k64_s2"]), "variants.fp8_e4m3.tiles.default"),
    (lambda c: c["sweeps"].update(cpu=["64x64"]), "sweeps.cpu.0"),
    (lambda c: c["variants"].update(bf16_again={"uses": "cublas_bf17", "tolerance": {}}), "variants.bf16_again.uses"),
    # int4 packs two values per byte along K: an odd K is refused up front, naming where it came from
    (lambda c: (c["variants"].update(int4_mma={"tiles": {"default": ["m64n64k64_s2_t128"]}, "tolerance": {}}),
                c["sweeps"].update(cpu=["64x64x127"])), "sweeps.cpu: shape 64x64x127 does not fit int4_mma"),
    # a target no instruction check covers would compile "ok" with any instructions at all
    (lambda c: c.update(targets=["sm_90a", "sm_75"]),
     "variants.fp8_e4m3: target sm_75 has no instruction check (kernels/fp8.py Variant.instructions)"),
])
def test_config_errors_name_the_bad_key(tmp_path, edit, key):
    cfg = tiny_config()
    edit(cfg)
    proc = snakemake(copy_workflow(tmp_path, cfg), "-n", check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr


def test_asking_for_an_absent_gpu_is_an_error(tmp_path):
    cfg = tiny_config() | {"platform": "h200"}
    proc = snakemake(copy_workflow(tmp_path, cfg), "-n", check=False)
    assert proc.returncode != 0 and "h200" in proc.stdout + proc.stderr and "no GPU" in proc.stdout + proc.stderr


def _mtimes(root):
    return {p: p.stat().st_mtime_ns for p in (root / "results").rglob("*") if p.is_file() and "logs" not in p.parts}


def test_tiny_cpu_run_then_rerun_one_variant(tiny_workflow):
    wf = tiny_workflow
    snakemake(wf)
    res = wf / "results"
    tidy = pd.read_csv(res / "cpu/tidy.csv")
    assert set(tidy["variant"]) == {"fp8_e4m3", "cublas_bf16"}
    assert set(tidy["shape"]) == {"64x128x128", "48x64x128"}
    assert (tidy["tile"] == "emulated").all() and (tidy["status"] == "ok").all()
    assert tidy["throughput"].isna().all()  # nothing is timed without a GPU
    e4m3 = tidy[tidy["variant"] == "fp8_e4m3"]
    assert e4m3["total_rel_fro"].between(0.02, 0.05).all() and (e4m3["kernel_rel_fro"] < 0.005).all()
    assert pd.read_parquet(res / "cpu/tidy.parquet").shape == tidy.shape
    cm = pd.read_csv(res / "cpu/compile_matrix.csv")
    assert set(cm["status"]) == {"ok"} and set(cm["instructions"]) == {"wgmma"}
    report = (res / "cpu/report.html").read_text()
    assert "Not run on a GPU" in report and "fp8_e4m3" in report
    assert (res / "cpu/figures/accuracy.png").stat().st_size > 0
    manifest = json.loads((res / "inputs/normal/64x128x128/manifest.json").read_text())
    assert len(manifest["fp32"]["A"]["sha256"]) == 64

    # a second run has nothing to do: kernels come from the project-local TileLang cache
    assert "Nothing to be done" in snakemake(wf, "-n").stdout + snakemake(wf, "-n").stderr
    assert any((wf / ".cache/tilelang").rglob("*.cu"))

    before = _mtimes(wf)
    target = res / "cpu/fp8_e4m3/normal/48x64x128.json"
    snakemake(wf, "-f", str(target.relative_to(wf)))
    snakemake(wf)  # bring the downstream tables up to date
    changed = {p for p, t in _mtimes(wf).items() if before.get(p) != t}
    downstream = {res / "cpu" / n for n in ("tidy.csv", "tidy.parquet", "compile_matrix.csv", "roofs.csv", "report.html")}
    downstream |= set((res / "cpu/figures").glob("*"))
    # one job runs a variant's whole sweep for one distribution: only that variant's files change
    assert target in changed
    assert changed - downstream <= set((res / "cpu/fp8_e4m3/normal").glob("*.json"))

    before = _mtimes(wf)
    snakemake(wf, "--forcerun", "run_cublas_bf16")
    changed = {p for p, t in _mtimes(wf).items() if before.get(p) != t}
    assert set((res / "cpu/cublas_bf16").rglob("*.json")) <= changed
    assert changed - downstream <= set((res / "cpu/cublas_bf16").rglob("*.json"))

    # a forced recompile is served by the project-local TileLang cache: no new kernel is built
    cache = wf / ".cache/tilelang"
    entries = sorted(p.name for p in cache.rglob("kernels/*"))
    assert entries
    record = res / "cpu/compile/fp8_e4m3/sm_90a/m64n64k64_s2_t128.json"
    before = record.stat().st_mtime_ns
    snakemake(wf, "--forcerun", "compile_fp8_e4m3", "--until", "compile_fp8_e4m3")
    assert record.stat().st_mtime_ns != before and json.loads(record.read_text())["records"][0]["status"] == "ok"
    assert sorted(p.name for p in cache.rglob("kernels/*")) == entries

def test_lint_is_clean():
    proc = snakemake(REPO, "--lint", check=False)
    assert proc.returncode == 0 and "Lints for" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_conda_env_pins_match_pyproject():
    import re

    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {re.split(r"[<>=!]", d)[0].lower().replace("-", "_"): d for d in deps}
    for env in (REPO / "envs").glob("*.yaml"):
        spec = yaml.safe_load(env.read_text())["dependencies"]
        flat = [d for d in spec if isinstance(d, str)] + [d for x in spec if isinstance(x, dict) for d in x["pip"]]
        for d in flat:
            name = re.split(r"[<>=!]", d)[0].lower().replace("-", "_")
            if name in pins:
                assert d == pins[name], f"{env.name}: {d} differs from pyproject's {pins[name]}"


def test_python_is_lint_clean():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "kernels", "workflow/scripts", "tests"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
