"""``python -m kernels.registry list | describe``: every variant is found, every file:line it prints is a
line of a file, and each variant's name leads to its registration (``grep -rn '"<variant>"' kernels/``)."""
import re
import subprocess
import sys

import pytest
from conftest import REPO

from kernels import registry
from kernels.registry import ENTRY_RULES, INPUT_FILE, VARIANTS, describe, listing, load_all, registration_sites

load_all()
NAMES = sorted(VARIANTS)
# a repository file and a line number, as describe and list print them
FILE_LINE = re.compile(r"(?<![\w/.-])([\w./-]+\.(?:py|cuh|smk)):(\d+)\b")


@pytest.fixture(scope="module")
def plan():
    return registry.workflow_plan()


def _checked_file_lines(lines: list[str]) -> int:
    """Assert every file:line in ``lines`` names an existing file and a line within it; how many there were."""
    found = 0
    for path, number in FILE_LINE.findall("\n".join(lines)):
        file = REPO / path
        assert file.is_file(), f"{path}: no such file"
        assert 1 <= int(number) <= len(file.read_text().splitlines()), f"{path}:{number}: beyond the file"
        found += 1
    return found


@pytest.mark.parametrize("name", NAMES)
def test_describe_prints_existing_file_lines_and_the_variants_rules(name, plan):
    lines = describe(name, *plan)
    text = "\n".join(lines)
    v = VARIANTS[name]
    # registration, launch, emulation, quantizer, and the kernel factory of a TileLang variant
    assert _checked_file_lines(lines) >= 4 + (v.kernel is not None), text
    assert f"registered        {registration_sites()[name]}" in text
    for entry in plan[0].entries:
        if plan[0].impl(entry).name == name:
            assert f"run_{entry} " in text and f"emulate_{entry} " in text, text
            assert (f"compile_{entry} " in text) == (v.kernel is not None), text


@pytest.mark.parametrize("name", NAMES)
def test_grep_for_a_variant_name_lands_on_its_registration(name):
    """The literal name is the ``name=`` of one ``register(...)`` call, the one line of kernels/ that holds it."""
    hits = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "kernels").glob("*.*"))
            if path.suffix in (".py", ".cuh")
            for number, line in enumerate(path.read_text().splitlines(), 1) if f'"{name}"' in line]
    assert hits == [registration_sites()[name]], f"grep -rn '\"{name}\"' kernels/ finds {hits}"


def test_list_names_every_variant_family_and_peer():
    lines = listing()
    text = "\n".join(lines)
    for v in VARIANTS.values():
        assert re.search(rf"^  {v.name} +{v.family} +(kernels/\w+\.py|library peer)$", text, re.M), v.name
    families = {v.family for v in VARIANTS.values()}
    assert all(re.search(rf"^  {f} +kernels/", text, re.M) for f in families), text
    peers = [v.name for v in VARIANTS.values() if v.kernel is None]
    assert all(re.search(rf"^  {p} +kernels/peers\.py:\d+ ", text, re.M) for p in peers), text
    assert _checked_file_lines(lines) == len(peers)


def test_the_rule_and_input_names_are_the_workflows():
    rules = "\n".join(p.read_text() for p in sorted((REPO / "workflow/rules").glob("*.smk")))
    for template in ENTRY_RULES.values():
        written = template.replace("{entry}", "{_variant}").replace("{name}", "{_name}")
        assert f'f"{written}"' in rules, f"workflow/rules/*.smk names no rule {written}"
    assert INPUT_FILE.replace("{fmt}", "{f}").replace("{dist}", "{{dist}}").replace("{shape}", "{{shape}}") in rules


def test_braced_paths_expand_back():
    paths = ["r/cpu/x/normal/a.json", "r/cpu/x/normal/b.json", "r/cpu/x/t3/a.json", "r/cpu/x/t3/b.json", "r/h200/y/c.json"]
    assert registry.braced(paths) == ["r/cpu/x/{normal,t3}/{a,b}.json", "r/h200/y/c.json"]
    assert registry.braced(["a/b.pt"]) == ["a/b.pt"]


def test_the_command_line():
    """One process each: ``list`` and ``describe`` run as modules (their tables are the imported module's)."""
    listed = subprocess.run([sys.executable, "-m", "kernels.registry", "list"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout
    assert all(re.search(rf"^  {name} ", listed, re.M) for name in NAMES)
    described = subprocess.run([sys.executable, "-m", "kernels.registry", "describe", "dequant_w4_mxfp4"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout
    assert "kernels/dequant_w4.py:" in described and "compile_dequant_w4_mxfp4 " in described
    refused = subprocess.run([sys.executable, "-m", "kernels.registry", "describe", "dequant_w4"], cwd=REPO,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "unknown variant 'dequant_w4'" in refused.stderr
