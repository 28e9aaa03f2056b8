"""A job's code inputs are computed (the import closure), and a GPU host compiles only what it runs."""
import json

import pytest
import yaml
from conftest import REPO, copy_workflow, fake_nvidia_smi, on_path, snakemake, tiny_config

from harness.deps import import_closure


def test_closure_of_dequant_reaches_what_it_imports_and_nothing_else():
    deps = import_closure(["kernels.dequant"], REPO)
    assert {"kernels/__init__.py", "kernels/dequant.py", "kernels/baselines.py", "kernels/formats.py",
            "kernels/registry.py", "kernels/tiles.py"} <= set(deps)
    assert "kernels/fp8.py" not in deps and "kernels/int4.py" not in deps and deps == sorted(deps)
    # the CUDA decoder kernels/dequant_w4.py reads is a code input of every job that imports it
    assert "kernels/dequant_w4.py" in deps and "kernels/dequant_w4_decode.cuh" in deps
    assert not any(d.endswith(".cuh") for d in import_closure(["kernels.fp8"], REPO))


def test_closure_of_a_workflow_script_includes_its_sibling_modules_and_the_harness():
    deps = import_closure([], REPO, ["workflow/scripts/report.py"])
    assert {"workflow/scripts/checkout_first.py", "harness/jobs.py", "harness/atomic.py", "harness/tables.py",
            "kernels/registry.py"} <= set(deps)
    assert "workflow/scripts/report.py" not in deps


def test_closure_follows_every_import_form(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\nfrom pkg.c import thing\nfrom pkg import d\n",
        "pkg/b.py": "from . import e\nfrom .sub.f import g\n",
        "pkg/c.py": "import os\nimport torch\nthing = 1\n",
        "pkg/d.py": "def late():\n    from pkg import h\n    import pkg.i as i\n",
        "pkg/e.py": "", "pkg/h.py": "", "pkg/i.py": "", "pkg/unused.py": "",
        "pkg/sub/__init__.py": "", "pkg/sub/f.py": "from .. import j\nfrom ..k import *\ng = 1\n",
        "pkg/j.py": "", "pkg/k.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    deps = import_closure(["pkg.a"], tmp_path)
    assert deps == sorted(set(files) - {"pkg/unused.py"})
    with pytest.raises(ValueError, match="pkg.nope"):
        import_closure(["pkg.nope"], tmp_path)


def _planned(proc):
    return proc.stdout + proc.stderr


def _variant_config(name):
    return yaml.safe_load((REPO / "config.yaml").read_text())["variants"][name]


@pytest.mark.workflow
@pytest.mark.compile
def test_editing_a_transitive_import_reruns_the_jobs_that_reach_it(tmp_path):
    cfg = tiny_config()
    cfg["sweeps"] = {"cpu": ["16x128x256"], "gpu": ["16x128x256"], "cpu_compile": ["16x128x256"]}
    vcfg = _variant_config("dequant_w4_int4_sym_g128") | {"tiles": {"default": ["m16n64k128_s2_t128_wrow"]}}
    cfg["variants"] = {"dequant_w4_int4_sym_g128": {k: v for k, v in vcfg.items() if k != "shapes"}}
    wf = copy_workflow(tmp_path, cfg)
    # on a CPU host the run job does not need the compile record: ask for both
    targets = ["results/compile/dequant_w4_int4_sym_g128/sm_90a/m16n64k128_s2_t128_wrow.json",
               "results/cpu/dequant_w4_int4_sym_g128/normal/16x128x256.json"]
    snakemake(wf, *targets)
    record = json.loads((wf / targets[0]).read_text())
    assert [r["status"] for r in record["records"]] == ["ok"], record
    assert "Nothing to be done" in _planned(snakemake(wf, "-n", *targets))

    # a module dequant does not import changes nothing
    with open(wf / "kernels/fp8.py", "a") as fh:
        fh.write("# an edit\n")
    assert "Nothing to be done" in _planned(snakemake(wf, "-n", *targets))

    # kernels/dequant.py imports kernels/baselines.py (its matched peer), which the job does not name:
    # editing baselines.py reruns dequant's compile and run
    with open(wf / "kernels/baselines.py", "a") as fh:
        fh.write("# an edit\n")
    plan = _planned(snakemake(wf, "-n", *targets))
    assert "compile_dequant_w4_int4_sym_g128" in plan and "emulate_dequant_w4_int4_sym_g128" in plan, plan


@pytest.mark.workflow
def test_a_gpu_platform_runs_on_its_own_arch_compiled_at_its_run_shapes(tmp_path, monkeypatch):
    # a fake nvidia-smi makes this CPU host look like an H200 (sm_90a) to the planner
    bin_dir = fake_nvidia_smi(tmp_path, "NVIDIA H200", "9.0")
    cfg = tiny_config()
    cfg["run_on"] = ["auto"]
    cfg["targets"] = ["sm_89", "sm_90a"]
    run_shapes, check_shapes = ["128x128x256", "256x128x128"], ["128x128x128"]
    cfg["sweeps"] = {"cpu": check_shapes, "gpu": run_shapes, "cpu_compile": check_shapes}
    # declared unsupported on sm_89 and sm_90a: its compile jobs record every shape without nvcc
    cfg["variants"] = {"blockscaled_sm100": {k: v for k, v in _variant_config("blockscaled_sm100").items() if k != "shapes"}}
    wf = copy_workflow(tmp_path / "wf", cfg)
    on_path(monkeypatch, bin_dir)
    plan = _planned(snakemake(wf, "-n"))
    assert "compile_blockscaled_sm100" in plan and "run_blockscaled_sm100" in plan and "results/h200/" in plan, plan
    tile = "m128n128k128_s1_t128"
    # a run job needs its own arch's kernels at its shapes, and nothing of any other target
    run_inputs = plan.split("rule run_blockscaled_sm100:")[1].split("output:")[0]
    assert f"results/compile/blockscaled_sm100/sm_90a/sweep/{tile}.json" in run_inputs
    assert "sm_89" not in run_inputs and f"results/compile/blockscaled_sm100/sm_90a/{tile}.json" not in run_inputs
    records = {t: f"results/compile/blockscaled_sm100/{t}/{tile}.json" for t in cfg["targets"]}
    sweep = f"results/compile/blockscaled_sm100/sm_90a/sweep/{tile}.json"
    snakemake(wf, *records.values(), sweep)
    shapes = {t: [r["shape"] for r in json.loads((wf / p).read_text())["records"]] for t, p in records.items()}
    assert shapes == {"sm_89": check_shapes, "sm_90a": check_shapes}
    assert [r["shape"] for r in json.loads((wf / sweep).read_text())["records"]] == run_shapes
    # no target here can build it: every record is unsupported, and the jobs (whose artifacts folders then
    # hold no kernel) still succeed
    for path in (*records.values(), sweep):
        for rec in json.loads((wf / path).read_text())["records"]:
            assert rec["status"] == "unsupported" and "sm_100" in rec["reason"], rec
