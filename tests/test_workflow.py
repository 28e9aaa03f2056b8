"""The Snakemake workflow end to end on a CPU-only host, in throwaway copies of the repo; the config
checks in-process (harness/plan.py), with a few through Snakemake to show their message reaches the user."""
import json
import shutil

import pandas as pd
import pytest
import yaml
from conftest import REPO, TINY_TILE, copy_workflow, fake_nvidia_smi, on_path, snakemake, tiny_config

from harness.plan import ConfigError, Plan, validate


@pytest.mark.workflow
def test_default_config_dry_run_plans_every_stage():
    proc = snakemake(REPO, "-n", "--forceall", "--quiet", "rules")  # the plan, whatever has already run here
    for rule in ("build_inputs", "compile_fp8_e4m3", "emulate_fp8_e4m3", "emulate_cublas_bf16", "collect", "report"):
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
    (lambda c: (c["variants"].update(int4_mma={"tiles": {"default": ["m64n64k64_s2_t128"]}, "tolerance": {"kernel_rel_fro": 1e-9}}),
                c["sweeps"].update(cpu=["64x64x127"])), "sweeps.cpu: shape 64x64x127 does not fit int4_mma"),
    # a target no instruction check covers would compile "ok" with any instructions at all
    (lambda c: c.update(targets=["sm_90a", "sm_75"]),
     "variants.fp8_e4m3: target sm_75 has no instruction check (kernels/fp8.py Variant.sass and Variant.instructions)"),
    # platforms and run_on
    (lambda c: c.update(run_on=["h300"]), "run_on.0: unknown platform 'h300'"),
    (lambda c: c.update(run_on="h100"), "run_on: 'h100' is not of type 'array'"),
    (lambda c: c["platforms"]["h100"].update(match="NVIDIA (H100"), "platforms.h100.match"),
    (lambda c: c["platforms"]["h100"]["cluster"].pop("partition"), "platforms.h100.cluster: 'partition' is a required"),
    (lambda c: c["platforms"]["h100"]["cluster"].pop("gpu_model"), "platforms.h100.cluster"),
    (lambda c: c["platforms"].update(cpu=c["platforms"]["h100"]), "platforms"),
    (lambda c: c.update(run_on=["b200"]), "platforms.b200.arch: sm_100a is not one of targets ['sm_90a']"),
    (lambda c: (c.update(run_on=["h100"]), c["platforms"]["h100"]["peak"].pop("fp8")),
     "platforms.h100.peak.fp8: missing, and variants.fp8_e4m3 is bounded by it"),
    # strict types: 1.0 would seed other inputs than 1; NaN or Inf compares false with every bound
    (lambda c: c.update(seed=1.0), "seed: 1.0 is not an integer (write 1)"),
    (lambda c: c["variants"]["fp8_e4m3"]["tolerance"].update(total_rel_fro=float("nan")),
     "variants.fp8_e4m3.tolerance.total_rel_fro: nan is not a finite number"),
    (lambda c: c["platforms"]["h100"].update(hbm_TBps=float("inf")), "platforms.h100.hbm_TBps: inf is not a finite number"),
    (lambda c: c["timing"].update(reps=True), "timing.reps: True is not of type 'integer'"),
    (lambda c: c.update(targets=["sm_90a", "sm_999"]), "targets.1: 'sm_999' is not one of"),
    (lambda c: c["platforms"]["h100"].update(arch="sm_91a"), "platforms.h100.arch: 'sm_91a' is not one of"),
    # the compile check's shapes are checked like every sweep
    (lambda c: (c["variants"].update(int4_mma={"tiles": {"default": ["m64n64k64_s2_t128"]}, "tolerance": {"kernel_rel_fro": 1e-9}}),
                c["sweeps"].update(cpu_compile=["64x64x127"])), "sweeps.cpu_compile: shape 64x64x127 does not fit int4_mma"),
    # shape classes, and tiles per class: every class named, each tile one the variant's kernel takes
    (lambda c: c.update(shape_classes=[{"name": "thin", "M_max": 16}]), "shape_classes: the last class (thin) must have no bounds"),
    (lambda c: c.update(shape_classes=[{"name": "a", "M_max": 16}, {"name": "a"}]), "shape_classes: names must be unique"),
    (lambda c: c["variants"].update(fp8_e4m3_ws={"tiles": {"sm_90a": {"m16": ["m64n16k256_s10_t256_swapab"]}},
                                                 "tolerance": c["variants"]["fp8_e4m3"]["tolerance"]}),
     "variants.fp8_e4m3_ws.tiles.sm_90a: tiles per shape class must name every class"),
    (lambda c: c["variants"].update(fp8_e4m3_ws={"tiles": {"sm_90a": {k["name"]: ["m128n192k128_s4_t384_p2"] for k in c["shape_classes"]}},
                                                 "tolerance": c["variants"]["fp8_e4m3"]["tolerance"]}),
     "variants.fp8_e4m3_ws.tiles.sm_90a.m16: tile m128n192k128_s4_t384_p2: fp8_e4m3_ws accumulates without promotion"),
    (lambda c: c["variants"].update(fp8_e4m3_ws={"tiles": {"sm_90a": ["m128n256k128_s4_t384"]},
                                                 "tolerance": c["variants"]["fp8_e4m3"]["tolerance"]}),
     "variants.fp8_e4m3_ws.tiles.sm_90a: tile m128n256k128_s4_t384: needs 262144 bytes of shared memory"),
    (lambda c: c["variants"]["fp8_e4m3"]["tiles"].update(default=["m64n64k64_s2_t128_swapab"]),
     "variants.fp8_e4m3.tiles.default: fp8_e4m3's kernel takes plain tiles only"),
])
def test_config_errors_name_the_bad_key(edit, key):
    cfg = tiny_config()
    edit(cfg)
    with pytest.raises(ConfigError) as refused:
        Plan(validate(cfg))  # what common.smk does before Snakemake plans a job
    assert str(refused.value).startswith("invalid config:\n  ") and key in str(refused.value)


@pytest.mark.workflow
@pytest.mark.parametrize("edit,key", [
    (lambda c: c.update(seeed=1), "invalid config:\n  (top level): Additional properties are not allowed ('seeed'"),
    (lambda c: c.update(run_on=["h300"]), "invalid config:\n  run_on.0: unknown platform 'h300'"),
])
def test_a_config_error_reaches_the_user_through_snakemake(tmp_path, edit, key):
    cfg = tiny_config()
    edit(cfg)
    proc = snakemake(copy_workflow(tmp_path, cfg), "-n", check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.workflow
def test_a_yaml_error_in_config_yaml_names_its_line_and_column(tmp_path):
    """Snakemake's own message for a broken config.yaml named neither; the Snakefile reads it first."""
    wf = copy_workflow(tmp_path, tiny_config())
    lines = (wf / "config.yaml").read_text().splitlines()
    lines[0] = "seed: [1, 2"  # an unclosed bracket on line 1
    (wf / "config.yaml").write_text("\n".join(lines) + "\n")
    proc = snakemake(wf, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config.yaml:" in out and "the construct began at 1:7" in out, out[-2000:]


@pytest.mark.workflow
def test_gpu_platforms_are_planned_from_a_host_without_a_gpu(tmp_path):
    cfg = tiny_config() | {"run_on": ["h100", "b200"], "targets": ["sm_90a", "sm_100a"]}
    cfg["platforms"]["b200"]["cluster"] = {"partition": "blackwell", "constraint": "b200", "runtime": 20, "mem_mb": 9000}
    wf = copy_workflow(tmp_path, cfg)
    plan = snakemake(wf, "-n").stdout
    for platform, arch in (("h100", "sm_90a"), ("b200", "sm_100a")):
        # the GPU sweep (not the CPU one), timed jobs (not emulations), the platform's own arch compiled
        assert f"results/{platform}/fp8_e4m3/normal/64x128x128.json" in plan
        assert f"results/{platform}/fp8_e4m3/normal/48x64x128.json" not in plan
        assert f"results/{platform}/ceilings.json" in plan
        assert f"results/compile/fp8_e4m3/{arch}/sweep/m64n64k64_s2_t128.json" in plan
    assert "emulate_" not in plan and "results/cpu/" not in plan
    assert "slurm_partition=h100, gpu_model=h100, runtime=30" in plan
    assert "slurm_partition=blackwell, constraint=b200, runtime=20" in plan and "gpu_model=" not in plan.split("blackwell")[1][:40]
    # a path names its platform: asking for one outside run_on plans exactly that platform
    plan = snakemake(wf, "-n", "results/l40s/tidy.csv", check=False)
    assert "platforms.l40s.arch: sm_89 is not one of targets" in plan.stdout + plan.stderr
    plan = snakemake(wf, "-n", "results/x999/tidy.csv", check=False)
    assert plan.returncode != 0 and "platforms.x999: not in the catalogue" in plan.stdout + plan.stderr


@pytest.mark.workflow
@pytest.mark.compile
def test_tiles_per_shape_class_compile_and_run_at_their_class_shapes_only(tmp_path):
    cfg = tiny_config() | {"run_on": ["h100"]}
    cfg["sweeps"]["gpu"] = ["16x256x256", "256x256x256"]
    cfg["shape_classes"] = [{"name": "m16", "M_max": 16}, {"name": "other"}]
    thin, wide = "m64n16k256_s4_t256_swapab", "m128n128k128_s3_t384_z8"
    cfg["variants"] = {"fp8_e4m3_ws": {"tiles": {"sm_90a": {"m16": [thin], "other": [wide]}},
                                       "tolerance": cfg["variants"]["fp8_e4m3"]["tolerance"]}}
    wf = copy_workflow(tmp_path, cfg)
    plan = snakemake(wf, "-n").stdout
    for tile in (thin, wide):
        assert f"results/compile/fp8_e4m3_ws/sm_90a/sweep/{tile}.json" in plan
    # each sweep record holds its tile at the shapes of its class and nowhere else
    snakemake(wf, *(f"results/compile/fp8_e4m3_ws/sm_90a/sweep/{t}.json" for t in (thin, wide)))
    for tile, shape in ((thin, "16x256x256"), (wide, "256x256x256")):
        records = json.loads((wf / f"results/compile/fp8_e4m3_ws/sm_90a/sweep/{tile}.json").read_text())["records"]
        assert [(r["shape"], r["status"]) for r in records] == [(shape, "ok")], records


def test_auto_refuses_a_gpu_the_catalogue_does_not_know(tmp_path, monkeypatch):
    on_path(monkeypatch, fake_nvidia_smi(tmp_path, "NVIDIA H200 NVL", "9.0"))
    with pytest.raises(ConfigError, match=r"run_on: auto: this host's GPU 'NVIDIA H200 NVL' matches no entry of "
                                          r"platforms\.\*\.match"):
        Plan(validate(tiny_config() | {"run_on": ["auto"]}))


@pytest.mark.workflow
def test_a_job_that_lands_on_another_gpu_fails_and_says_which_key_to_fix(tmp_path, monkeypatch):
    cfg = tiny_config() | {"run_on": ["h100"]}
    cfg["variants"] = {"cublas_bf16": cfg["variants"]["cublas_bf16"]}
    wf = copy_workflow(tmp_path / "wf", cfg)
    on_path(monkeypatch, fake_nvidia_smi(tmp_path, "NVIDIA B200", "10.0"))
    target = "results/h100/cublas_bf16/normal/64x128x128.json"
    proc = snakemake(wf, target, check=False)
    assert proc.returncode != 0 and not (wf / target).exists()
    log = (wf / "results/logs/h100/cublas_bf16/normal.log").read_text()
    assert "GPU mismatch: this job is planned for platform h100" in log and "has 'NVIDIA B200'" in log, log
    assert "platforms.h100.cluster" in log and "platforms.h100.match" in log


@pytest.mark.workflow
def test_the_tiny_cpu_run_emulates_every_variant_and_records_each_kernel(tiny_run):
    res = tiny_run / "results"
    tidy = pd.read_csv(res / "cpu/tidy.csv")
    assert set(tidy["variant"]) == {"fp8_e4m3", "fp8_e5m2", "cublas_bf16"}
    assert set(tidy["shape"]) == {"64x128x128", "48x64x128"}
    assert (tidy["tile"] == "emulated").all() and (tidy["status"] == "ok").all()
    assert tidy["throughput"].isna().all()  # nothing is timed without a GPU
    e4m3 = tidy[tidy["variant"] == "fp8_e4m3"]
    assert e4m3["total_rel_fro"].between(0.02, 0.05).all() and (e4m3["kernel_rel_fro"] < 0.005).all()
    assert pd.read_parquet(res / "cpu/tidy.parquet").shape == tidy.shape
    cm = pd.read_csv(res / "cpu/compile_matrix.csv")
    assert set(cm["status"]) == {"ok"} and set(cm["instructions"]) == {"wgmma"}
    # the SASS of every kernel, beside its source: fp8 wgmma of its own dtype on sm_90a, no spills
    for variant, dtype in (("fp8_e4m3", "E4M3"), ("fp8_e5m2", "E5M2")):
        mine = cm[cm["variant"] == variant]
        assert len(mine) == 1 and set(mine["sass"]) == {f"QGMMA F32.{dtype}.{dtype}"}
        assert mine["sass_mma"].str.startswith(f"QGMMA.64x64x32.F32.{dtype}.{dtype} x").all()
    assert (cm["sass_local_loads"] + cm["sass_local_stores"] == 0).all() and (cm["registers"] > 0).all()
    art = res / f"compile/fp8_e4m3/artifacts/sm_90a/{TINY_TILE}/64x128x128"
    assert {p.name for p in art.iterdir()} == {"kernel.cu", "kernel.ptx", "kernel.cubin", "kernel.sass"}
    report = (res / "cpu/report.html").read_text()
    assert "Not run on a GPU" in report and "fp8_e4m3" in report and "QGMMA F32.E4M3.E4M3" in report
    assert (res / "cpu/figures/accuracy.png").stat().st_size > 0
    manifest = json.loads((res / "inputs/normal/64x128x128/manifest.json").read_text())
    assert len(manifest["fp32"]["tensors"]["A"]["sha256"]) == 64 and len(manifest["fp32"]["file_sha256"]) == 64
    assert sorted(manifest["formats"]) == sorted(p.stem for p in (res / "inputs/normal/64x128x128/formats").glob("*.pt"))


def _mtimes(root):
    # a job's log and benchmark (what it cost, results/benchmarks) are its records of itself, not its results
    return {p: p.stat().st_mtime_ns for p in (root / "results").rglob("*")
            if p.is_file() and not {"logs", "benchmarks"} & set(p.parts)}


@pytest.mark.workflow
def test_a_finished_run_has_nothing_to_do_and_a_rerun_touches_one_variant(tiny_run_copy):
    wf = tiny_run_copy
    res = wf / "results"
    # a second run has nothing to do: kernels come from the project-local TileLang cache
    proc = snakemake(wf, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert any((wf / ".cache/tilelang").rglob("*.cu"))

    before = _mtimes(wf)
    target = res / "cpu/fp8_e4m3/normal/48x64x128.json"
    snakemake(wf, "-f", str(target.relative_to(wf)))
    snakemake(wf)  # bring the downstream tables up to date
    changed = {p for p, t in _mtimes(wf).items() if before.get(p) != t}
    downstream = {res / "cpu" / n for n in ("tidy.csv", "tidy.parquet", "compile_matrix.csv", "roofs.csv", "cost.csv",
                                            "report.html")}
    downstream |= set((res / "cpu/figures").glob("*"))
    # one job runs a variant's whole sweep for one distribution: only that variant's files change
    assert target in changed
    assert changed - downstream <= set((res / "cpu/fp8_e4m3/normal").glob("*.json"))

    before = _mtimes(wf)
    snakemake(wf, "--forcerun", "emulate_cublas_bf16", "--until", "emulate_cublas_bf16")  # downstream: as above
    changed = {p for p, t in _mtimes(wf).items() if before.get(p) != t}
    assert set((res / "cpu/cublas_bf16").rglob("*.json")) <= changed
    assert changed - downstream <= set((res / "cpu/cublas_bf16").rglob("*.json"))

    # a forced recompile is served by the project-local TileLang cache: no new kernel is built
    cache = wf / ".cache/tilelang"
    entries = sorted(p.name for p in cache.rglob("kernels/*"))
    assert entries
    record = res / f"compile/fp8_e4m3/sm_90a/{TINY_TILE}.json"
    before = record.stat().st_mtime_ns
    snakemake(wf, "--forcerun", "compile_fp8_e4m3", "--until", "compile_fp8_e4m3")
    assert record.stat().st_mtime_ns != before and json.loads(record.read_text())["records"][0]["status"] == "ok"
    assert sorted(p.name for p in cache.rglob("kernels/*")) == entries


@pytest.mark.workflow
def test_every_job_records_its_cost_and_the_report_shows_it(tiny_run):
    res = tiny_run / "results"
    cost = pd.read_csv(res / "cpu/cost.csv")
    # every job the CPU tables are made of, each with its benchmark: the inputs, the check compiles, one
    # emulation per entry (collect's and the report's own are written after them)
    assert sorted(cost["job"]) == ["compile/fp8_e4m3", "compile/fp8_e5m2", "cpu/cublas_bf16/normal", "cpu/fp8_e4m3/normal",
                                   "cpu/fp8_e5m2/normal", "inputs/normal/48x64x128", "inputs/normal/64x128x128"]
    assert (cost["wall_s"] > 0).all() and cost["start"].lt(cost["end"]).all()
    assert (res / "benchmarks/cpu/collect.tsv").is_file() and (res / "benchmarks/cpu/report.tsv").is_file()
    # an emulation times nothing: its wall time is all set-up; each of its two shapes is a record
    runs = cost[cost["kind"] == "run"]
    assert (runs["records"] == 2).all() and (runs["timing_s"] == 0).all() and (runs["setup_s"] == runs["wall_s"]).all()
    assert (runs["load_s"] > 0).all() and (runs["build_check_s"] > 0).all()
    rec = json.loads((res / "cpu/fp8_e4m3/normal/64x128x128.json").read_text())
    c = rec["cost"]
    assert c["standalone_s"] == c["paired_s"] == 0 and c["load_s"] > 0 and c["build_check_s"] > 0
    assert c["ready"] <= c["shape_start"] <= c["shape_end"] and rec["env"]["node"]
    # the process start (/proc) is as exact as the kernel's boot time: whole seconds
    assert -1.5 < (pd.Timestamp(c["ready"]) - pd.Timestamp(c["process_start"])).total_seconds() < 120
    page = (res / "cpu/report.html").read_text()
    assert "<h2>What this run cost</h2>" in page and "Wall time to the report" in page and "cpu/fp8_e4m3/normal" in page
    # the committed point sets carry the cost of the run that published them: the published report shows it, once
    published = (res / "published/h200/report.html").read_text()
    assert published.count("<h2>What this run cost</h2><p>Wall time to the report") == 1
    families = {p.name for p in (res / "published/h200/points").iterdir() if p.is_dir()}
    assert set(pd.read_csv(res / "published/h200/cost.csv")["point_set"]) == families


@pytest.mark.workflow
def test_a_missing_benchmark_file_reruns_nothing(tiny_run_copy):
    """Results made before jobs recorded their benchmarks stay up to date: no benchmark file is a job's input
    (collect and publish_family read them as params), so none missing is a reason to run its job again."""
    shutil.rmtree(tiny_run_copy / "results/benchmarks")
    proc = snakemake(tiny_run_copy, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def _planned_rules(proc) -> set[str]:
    """The rules a dry run would run (its job-stats table)."""
    out = proc.stdout + proc.stderr
    table = out.split("Job stats:", 1)[1].strip().split("\n\n", 1)[0] if "Job stats:" in out else ""
    # after the header ("job count") and its rule ("---"): a line per rule, then "total"
    return {line.split()[0] for line in table.splitlines()[2:] if line.strip()} - {"total", "all"}


@pytest.mark.workflow
def test_nothing_reruns_for_a_setting_or_a_kernel_it_does_not_use(tiny_run_copy):
    """timing.reps (GPU runs only) used to rerun every CPU emulation; an edited kernel module used to rerun
    every input job (the formats lived beside the kernels), and so every emulation of every family."""
    wf = tiny_run_copy
    cfg = yaml.safe_load((wf / "config.yaml").read_text())
    cfg["timing"]["reps"] += 7
    (wf / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(snakemake(wf, "-n"))

    with open(wf / "kernels/fp8_ws.py", "a") as fh:  # a kernel of the fp8 family, not of its formats
        fh.write("\n# an edit\n")
    planned = _planned_rules(snakemake(wf, "-n"))
    assert "compile_fp8_e4m3" in planned, planned  # the edit was seen by the jobs that build it
    assert not {r for r in planned if r.startswith("build_inputs_")}, planned
    assert "emulate_cublas_bf16" not in planned, planned


@pytest.mark.workflow
def test_a_reference_set_is_read_never_made(tiny_run_copy):
    """report.compare_with naming another platform's finished run used to plan that platform's whole run
    (its tidy.parquet was an input, so the collect rule's output) on a host without its GPU."""
    wf = tiny_run_copy
    (wf / "results/h100").mkdir()
    for f in ("tidy.parquet", "compile_matrix.csv"):
        (wf / "results/h100" / f).write_bytes((wf / "results/cpu" / f).read_bytes())
    cfg = yaml.safe_load((wf / "config.yaml").read_text())
    cfg["report"]["compare_with"] = [*cfg["report"]["compare_with"], "results/h100"]
    (wf / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _planned_rules(snakemake(wf, "-n")) == {"report"}  # the new reference re-renders the report only


@pytest.mark.workflow
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

    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "kernels", "harness", "workflow/scripts", "tests"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
