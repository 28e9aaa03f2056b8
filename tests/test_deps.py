"""A job's code inputs are computed (the import closure), and a GPU host compiles only what it runs."""
import json
import os
import stat

import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake, tiny_config

from kernels.deps import compile_jobs, import_closure


def test_closure_of_dequant_reaches_int4_through_its_import():
    deps = import_closure(["kernels.dequant"], REPO)
    assert {"kernels/__init__.py", "kernels/dequant.py", "kernels/int4.py", "kernels/registry.py",
            "kernels/tiles.py", "kernels/tn_gemm.py"} <= set(deps)
    assert "kernels/fp8.py" not in deps and deps == sorted(deps)


def test_closure_of_a_workflow_script_includes_its_sibling_modules():
    deps = import_closure([], REPO, ["workflow/scripts/report.py"])
    assert {"workflow/scripts/script_setup.py", "workflow/scripts/tables.py", "kernels/registry.py"} <= set(deps)
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


def test_compile_jobs_give_the_gpu_its_run_shapes_and_other_targets_the_check_shapes():
    tiles = {"sm_89": ["a"], "sm_90a": ["b", "c"], "sm_100a": []}
    run, check = ["1x2x3", "4x5x6"], ["7x8x9"]
    assert compile_jobs(tiles, "sm_90a", run, check) == [
        ("sm_89", "a", check), ("sm_90a", "b", run), ("sm_90a", "c", run)]
    # a CPU-only host compiles every target at the check shapes only
    assert compile_jobs(tiles, None, run, check) == [("sm_89", "a", check), ("sm_90a", "b", check), ("sm_90a", "c", check)]


def _planned(proc):
    return proc.stdout + proc.stderr


def _variant_config(name):
    return yaml.safe_load((REPO / "config.yaml").read_text())["variants"][name]


@pytest.mark.workflow
def test_editing_a_transitive_import_reruns_the_jobs_that_reach_it(tmp_path):
    cfg = tiny_config()
    cfg["sweeps"] = {"cpu": ["16x128x256"], "gpu": ["16x128x256"], "cpu_compile": ["16x128x256"]}
    vcfg = _variant_config("dequant_w4_int4_sym_g128") | {"tiles": {"default": ["m16n64k128_s2_t128_wrow"]}}
    cfg["variants"] = {"dequant_w4_int4_sym_g128": {k: v for k, v in vcfg.items() if k != "shapes"}}
    wf = copy_workflow(tmp_path, cfg)
    # on a CPU host the run job does not need the compile record: ask for both
    targets = ["results/cpu/compile/dequant_w4_int4_sym_g128/sm_90a/m16n64k128_s2_t128_wrow.json",
               "results/cpu/dequant_w4_int4_sym_g128/normal/16x128x256.json"]
    snakemake(wf, *targets)
    record = json.loads((wf / targets[0]).read_text())
    assert [r["status"] for r in record["records"]] == ["ok"], record
    assert "Nothing to be done" in _planned(snakemake(wf, "-n", *targets))

    # a module dequant does not import changes nothing
    with open(wf / "kernels/fp8.py", "a") as fh:
        fh.write("# an edit\n")
    assert "Nothing to be done" in _planned(snakemake(wf, "-n", *targets))

    # kernels/dequant.py imports kernels/int4.py: editing int4.py reruns dequant's compile and run
    with open(wf / "kernels/int4.py", "a") as fh:
        fh.write("# an edit\n")
    plan = _planned(snakemake(wf, "-n", *targets))
    assert "compile_dequant_w4_int4_sym_g128" in plan and "run_dequant_w4_int4_sym_g128" in plan, plan


@pytest.mark.workflow
def test_a_gpu_host_compiles_its_own_arch_at_every_run_shape_and_other_targets_at_check_shapes(tmp_path, monkeypatch):
    # a fake nvidia-smi makes this CPU host look like an H200 (sm_90a) to the planner
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in\n  *--query-gpu=name,compute_cap*) echo "NVIDIA H200, 9.0" ;;\n'
                   '  *) echo "NVIDIA H200, 550.00, 1980" ;;\nesac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    cfg = tiny_config()
    cfg["platform"] = "auto"
    cfg["targets"] = ["sm_89", "sm_90a"]
    run_shapes, check_shapes = ["128x128x256", "256x128x128"], ["128x128x128"]
    cfg["sweeps"] = {"cpu": check_shapes, "gpu": run_shapes, "cpu_compile": check_shapes}
    # declared unsupported on sm_89 and sm_90a: its compile job records every shape without nvcc
    cfg["variants"] = {"blockscaled_sm100": {k: v for k, v in _variant_config("blockscaled_sm100").items() if k != "shapes"}}
    (tmp_path / "wf").mkdir()
    wf = copy_workflow(tmp_path / "wf", cfg)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    plan = _planned(snakemake(wf, "-n"))
    assert "compile_blockscaled_sm100" in plan and "run_blockscaled_sm100" in plan and "results/h200/" in plan, plan
    records = {t: f"results/h200/compile/blockscaled_sm100/{t}/m128n128k128_s1_t128.json" for t in cfg["targets"]}
    snakemake(wf, *records.values())
    shapes = {t: [r["shape"] for r in json.loads((wf / p).read_text())["records"]] for t, p in records.items()}
    assert shapes == {"sm_89": check_shapes, "sm_90a": run_shapes}
