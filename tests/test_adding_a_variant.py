"""docs/contributing.md "Adding a variant", followed to the letter in a throwaway copy of the workflow: a new family
module registers a variant, FAMILY_MODULES lists it, config.yaml names it, and the workflow plans and
runs it with nothing else changed."""
import json
import re

import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake, tiny_config

pytestmark = pytest.mark.workflow

TOY = "toy_fp8"
TILE = "m64n64k64_s2_t128"
SHAPE = "64x128x128"
# a new family module: the fp8 e4m3 kernel (its factory, launch, emulation and checks, as registered)
# under another name and family
TOY_MODULE = '''"""A toy family for tests/test_adding_a_variant.py: the registered fp8 e4m3 kernel under another name."""
from dataclasses import replace

from kernels import fp8  # noqa: F401  (registers fp8_e4m3 and its format)
from kernels.registry import VARIANTS, register_variant

register_variant(replace(VARIANTS["fp8_e4m3"], name="toy_fp8", family="toy",
                         description="fp8_e4m3's TileLang kernel, registered by a new family module"))
'''


def add_family_module(wf):
    """Step 1: kernels/toy.py registers the variant; kernels.registry.FAMILY_MODULES lists the module."""
    (wf / "kernels/toy.py").write_text(TOY_MODULE)
    registry = wf / "kernels/registry.py"
    text, n = re.subn(r"(FAMILY_MODULES\b[^=\n]*=\s*[(\[])(.*?)([)\]])",
                      lambda m: f'{m[1]}{m[2].rstrip().rstrip(",")}, "kernels.toy"{m[3]}', registry.read_text(),
                      count=1, flags=re.DOTALL)
    assert n == 1, "kernels/registry.py has no FAMILY_MODULES to add the module to"
    registry.write_text(text)


def toy_config(**changes) -> dict:
    """Step 2: the variant under `variants:` with tiles per target and tolerances (fp8_e4m3's), beside its
    matched peer; every other variant left out, one CPU shape."""
    cfg = tiny_config() | changes
    cfg["sweeps"]["cpu"] = [SHAPE]
    variants = yaml.safe_load((REPO / "config.yaml").read_text())["variants"]
    peer = "cublas_fp8_e4m3_fastacc"
    cfg["variants"] = {TOY: {"tiles": {"default": [TILE], "sm_90a": [TILE]}, "tolerance": variants["fp8_e4m3"]["tolerance"]},
                       peer: variants[peer]}
    return cfg


def dry_run(wf) -> tuple[set[str], str]:
    """A dry run: the rules of its job stats table (one "<rule> <count>" line each) and its whole plan."""
    proc = snakemake(wf, "-n")
    return set(re.findall(r"^(\w+)\s+\d+\s*$", proc.stdout + proc.stderr, flags=re.MULTILINE)), proc.stdout


def test_a_variant_in_a_new_family_module_is_planned_and_runs(tmp_path):
    wf = copy_workflow(tmp_path / "cpu", toy_config())
    add_family_module(wf)

    # step 3: the dry run shows its compile and emulate jobs
    rules, plan = dry_run(wf)
    assert {f"compile_{TOY}", f"emulate_{TOY}"} <= rules, rules
    assert f"run_{TOY}" not in rules
    assert f"results/compile/{TOY}/sm_90a/{TILE}.json" in plan and f"results/cpu/{TOY}/normal/{SHAPE}.json" in plan

    # ... and its emulation runs: an ok row of the new variant and family
    out = wf / f"results/cpu/{TOY}/normal/{SHAPE}.json"
    snakemake(wf, str(out.relative_to(wf)))
    result = json.loads(out.read_text())
    assert result["point"]["variant"] == TOY and result["point"]["family"] == "toy"
    assert [(r["tile"], r["status"]) for r in result["rows"]] == [("emulated", "ok")], result["rows"]
    assert result["rows"][0]["kernel_rel_fro"] < 0.005


def test_a_variant_in_a_new_family_module_is_planned_on_a_gpu_platform(tmp_path):
    wf = copy_workflow(tmp_path / "h200", toy_config(run_on=["h200"]))  # planned from this GPU-less host
    add_family_module(wf)
    rules, plan = dry_run(wf)
    assert {f"run_{TOY}", f"compile_{TOY}", f"compile_{TOY}_sweep"} <= rules, rules
    assert f"emulate_{TOY}" not in rules
    assert f"results/h200/{TOY}/normal/{SHAPE}.json" in plan
    assert f"results/compile/{TOY}/sm_90a/sweep/{TILE}.json" in plan
