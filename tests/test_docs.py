"""README.md and docs/ match the code: the generated blocks are fresh (harness/docs.py, run in-process), the README
stays a door (at most 10 KB), every relative link and anchor resolves, and every command shown in a fenced
bash/sh/console block is exercised by a test: run here (``RUN_HERE``: cheap and safe commands, taken verbatim
from the docs) or named in ``EXERCISED_BY`` (the test node ids that exercise it, each checked to exist)."""
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake

from harness import docs

README_LIMIT = 10240
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")

# ------------------------------------------------------------------------------------------------ the command tables

# documented command -> the test of this file that runs it (each test below takes its commands from this table)
RUN_HERE = {
    ".venv/bin/python -m harness.docs --check": "test_the_generated_blocks_are_fresh",
    ".venv/bin/python -m harness.docs --write": "test_write_renders_what_check_accepts",
    ".venv/bin/python -m kernels.registry list": "test_the_registry_commands_answer",
    ".venv/bin/python -m kernels.registry describe fp8_e4m3_ws": "test_the_registry_commands_answer",
    # dry runs of the rerun examples (docs/pipeline.md): each path and rule name is one the workflow plans
    ".venv/bin/snakemake --cores 1 -f results/cpu/fp8_e4m3/normal/256x256x256.json": "test_the_rerun_examples_plan",
    ".venv/bin/snakemake --cores 1 --forcerun run_fp8_e4m3 emulate_fp8_e4m3": "test_the_rerun_examples_plan",
    ".venv/bin/snakemake --cores 1 results/h100/fp8_e4m3/normal/4096x4096x4096.json --config 'run_on=[h100]'":
        "test_the_rerun_examples_plan",
}

# documented command -> node ids of the tests that exercise it (too slow, GPU-only or state-changing to run here)
EXERCISED_BY = {
    # docs/operations.md: continue a stopped run on another host (the test packs and unpacks results/cpu)
    "tar czf h200-part.tgz results/h200": [
        "tests/test_resume.py::test_a_run_stopped_three_times_continues_on_fresh_checkouts_and_repeats_no_finished_job"],
    "tar xzf h200-part.tgz && .venv/bin/snakemake --cores 16": [
        "tests/test_resume.py::test_a_run_stopped_three_times_continues_on_fresh_checkouts_and_repeats_no_finished_job"],
    # README quick start: what CI runs (checked here against .ci/run); the default config's plan, and a run of it
    "bash .ci/setup && .venv/bin/snakemake --cores 1": [
        "tests/test_docs.py::test_the_quick_start_is_what_ci_runs",
        "tests/test_workflow.py::test_default_config_dry_run_plans_every_stage",
        "tests/test_workflow.py::test_the_tiny_cpu_run_emulates_every_variant_and_records_each_kernel"],
    "bash .ci/setup && .venv/bin/python -m pytest": ["tests/test_docs.py::test_the_quick_start_is_what_ci_runs"],
    # docs/contributing.md: test tiers
    '.venv/bin/python -m pytest -m "not compile and not workflow and not slurm"': [
        "tests/test_docs.py::test_the_unit_tier_leaves_out_every_declared_marker"],
    ".venv/bin/python -m pytest": ["tests/test_docs.py::test_the_quick_start_is_what_ci_runs"],
    # docs/contributing.md: adding a variant
    ".venv/bin/snakemake -n": [
        "tests/test_workflow.py::test_default_config_dry_run_plans_every_stage",
        "tests/test_adding_a_variant.py::test_a_variant_in_a_new_family_module_is_planned_and_runs"],
    # docs/pipeline.md
    ".venv/bin/snakemake --cores 1": ["tests/test_workflow.py::test_a_finished_run_has_nothing_to_do_and_a_rerun_touches_one_variant"],
    ".venv/bin/snakemake --cores 1 --configfile my.yaml": [
        "tests/test_faults.py::test_an_empty_mapping_in_an_override_is_refused_and_null_drops_a_variant"],
    # docs/operations.md
    ".venv/bin/snakemake --profile profiles/slurm --config 'run_on=[h100,b200]'": [
        "tests/test_slurm.py::test_gpu_platforms_are_planned_on_a_gpu_less_host_and_sent_to_their_partitions",
        "tests/test_slurm.py::test_the_slurm_profile_batches_every_group_the_rules_name"],
    ".venv/bin/snakemake --cores 16 --forcerun results/published/h200/points/fp8 -- results/published/h200/points/fp8": [
        "tests/test_publish.py::test_refreshing_one_family_plans_its_entries_their_peers_and_the_ceilings_only"],
    ".venv/bin/snakemake --cores 1 results/published/h200/tidy.csv results/published/h200/report.html": [
        "tests/test_publish.py::test_the_published_report_and_tables_are_rebuilt_from_the_points"],
    ".venv/bin/snakemake --cores 1 -f results/published/h200/report.html": [
        "tests/test_publish.py::test_the_published_report_and_tables_are_rebuilt_from_the_points",
        "tests/test_report.py::test_published_report_renders_in_chromium_with_its_numbers"],
    ".venv/bin/snakemake --report results/report.zip": ["tests/test_report.py::test_snakemake_report_zip"],
    ".venv/bin/snakemake --cores 16 results/h200/profile/fp8_e4m3/normal/8192x8192x8192/m128n256k128_s4_t256_wrow_z8.summary.json": [
        "tests/test_profile.py::test_profile_target_is_refused_before_anything_runs",
        "tests/test_profile.py::test_published_profiles_are_sources_no_report_rebuilds"],
    ".venv/bin/python -m harness.tryout --compile-only --shapes 16x8192x8192 --variant fp8_e4m3_ws m64n16k256_s10_t256_swapab": [
        "tests/test_tryout.py::test_compile_only_reports_each_tiles_build"],
    # docs/operations.md: the optional humming peer's offline wheel bundle (downloads: its pins are checked)
    "bash envs/humming-bundle .gpu/humming": [
        "tests/test_humming_peer.py::test_the_bundle_script_pins_the_wheels_the_docs_install"],
    # docs/operations.md: the optional fbgemm peer's offline sm_90a bundle (downloads: its pins are checked; its prune
    # is run on a library nvcc builds for three architectures)
    "bash envs/fbgemm-bundle .gpu/fbgemm": [
        "tests/test_fbgemm_peer.py::test_the_bundle_script_pins_the_wheel_and_packs_the_pruned_tree",
        "tests/test_fbgemm_peer.py::test_prune_on_a_library_nvcc_built_for_three_architectures"],
    # docs/operations.md: tuning
    ".venv/bin/snakemake --cores 16 results/published/h200/tuning/fp8": [
        "tests/test_selection.py::test_tuning_a_family_plans_its_tune_jobs_and_the_committed_table",
        "tests/test_selection.py::test_a_tune_job_on_a_fake_h200_times_the_models_candidates_and_the_run_then_uses_the_winner"],
    ".venv/bin/python -m harness.selection calibrate h200": [
        "tests/test_selection.py::test_calibrate_fits_every_selected_variant_from_the_published_measurements"],
    ".venv/bin/python -m harness.selection rank h200 fp8_e4m3_ws 16x8192x8192": [
        "tests/test_selection.py::test_rank_prints_the_models_order"],
    ".venv/bin/python -m harness.tryout --plan tries.txt --json rows.json": [
        "tests/test_tryout.py::test_a_plan_gives_each_shape_its_own_tiles_in_the_files_order",
        "tests/test_tryout.py::test_compile_only_with_a_plan_builds_every_line"],
    (".venv/bin/python -m harness.tryout --shapes 4096x4096x4096,16x8192x8192 --variant fp8_e4m3_ws "
     "m128n128k128_s6_t384_z8 m64n16k256_s10_t256_swapab"): [
        "tests/test_tryout.py::test_timing_needs_a_gpu", "tests/test_tryout.py::test_bad_requests_are_refused_before_any_compile"],
}


# ------------------------------------------------------------------------------------------------ reading the docs


def _fenced_blocks(text: str):
    """(language, lines) of every fenced code block."""
    lang, fence, lines = None, None, []
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence, lang, lines = m[1], m[2].lower(), []
        elif fence is not None and line.strip().startswith(fence) and not line.strip()[len(fence):].strip():
            yield lang, lines
            fence = None
        elif fence is not None:
            lines.append(line)


def _commands(lang: str, lines: list[str]) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped; in a console block only the
    lines after a '$ ' prompt."""
    out, current = [], ""
    for line in lines:
        if lang == "console" and not current:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        line = re.sub(r"(^|\s)#(\s.*)?$", "", line).rstrip()  # a trailing comment, or a comment line
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current = " ".join((current + line).split())
        if current:
            out.append(current)
        current = ""
    return out


def documented_commands(root: Path = REPO) -> dict[str, list[str]]:
    """Every command of a fenced shell block in README.md and docs/, with the files it appears in."""
    found: dict[str, list[str]] = {}
    for doc in docs.documents(root):
        for lang, lines in _fenced_blocks(doc.read_text()):
            if lang in SHELL_BLOCKS:
                for cmd in _commands(lang, lines):
                    found.setdefault(cmd, []).append(str(doc.relative_to(root)))
    return found


def _without_code(text: str) -> str:
    """Markdown without its fenced blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^\s*(```+|~~~+).*?^\s*\1\s*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^\s*(```+|~~~+).*?^\s*\1\s*$", "", doc.read_text(), flags=re.S | re.M)  # no fenced blocks
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)}


# ------------------------------------------------------------------------------------------------ generated blocks, size, links


def _docs_command(*args: str) -> subprocess.CompletedProcess:
    """`python -m harness.docs ...` as the docs show it, in a process of its own: what other tests of this
    process imported, registered or changed cannot reach the generated text."""
    return subprocess.run([sys.executable, "-m", "harness.docs", *args], cwd=REPO, capture_output=True, text=True)


def test_the_generated_blocks_are_fresh():
    """`python -m harness.docs --check`: it names each stale block."""
    assert _run_here("test_the_generated_blocks_are_fresh")
    proc = _docs_command("--check")
    assert proc.returncode == 0, proc.stderr


def test_write_renders_what_check_accepts(tmp_path):
    """`python -m harness.docs --write` on a copy of README.md and docs/ with one block emptied: --check names the
    block, --write restores it, and --check passes again; an unknown block is refused, naming it."""
    assert _run_here("test_write_renders_what_check_accepts")
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    readme = tmp_path / "README.md"
    original = readme.read_text()
    emptied = re.sub(r"(<!-- generated: headline -->\n).*?(<!-- end generated -->)", r"\1\2", original, flags=re.S)
    assert emptied != original, "README.md has no headline block"
    readme.write_text(emptied)
    proc = _docs_command("--check", "--root", str(tmp_path))
    assert proc.returncode == 1 and "README.md: headline" in proc.stderr, proc.stderr
    assert _docs_command("--write", "--root", str(tmp_path)).returncode == 0
    assert readme.read_text() == original
    readme.write_text(original + "\n<!-- generated: nonsense -->\nx\n<!-- end generated -->\n")
    proc = _docs_command("--check", "--root", str(tmp_path))
    assert proc.returncode == 2 and "unknown generated block 'nonsense'" in proc.stderr, proc.stderr


def test_the_readme_is_a_door():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; at most {README_LIMIT} (move reference material to docs/)"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for doc in [*docs.documents(REPO), REPO / "CHANGELOG.md"]:
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _without_code(doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_docs_never_call_a_kernel_the_seed():
    """"seed" is the RNG seed only; a kernel is named by its form (the pipelined kernel)."""
    bad = re.compile(r"\bseed[- ](form|kernel|convention)\b|\bthe seed's\b", re.I)
    hits = [f"{doc.relative_to(REPO)}:{i}: {line.strip()}" for doc in [*docs.documents(REPO), REPO / "CHANGELOG.md"]
            for i, line in enumerate(doc.read_text().splitlines(), 1) if bad.search(line)]
    assert not hits, "\n".join(hits)


# ------------------------------------------------------------------------------------------------ every command exercised


def test_every_documented_command_is_run_here_or_by_a_named_test():
    documented = documented_commands()
    assert documented, "no commands found in README.md and docs/"
    missing = {c: where for c, where in documented.items() if c not in RUN_HERE and c not in EXERCISED_BY}
    assert not missing, ("commands in the docs that no test exercises (run them in tests/test_docs.py RUN_HERE, or name "
                         "the test that does in EXERCISED_BY):\n" + "\n".join(f"  {c}   ({', '.join(w)})" for c, w in missing.items()))
    gone = sorted((set(RUN_HERE) | set(EXERCISED_BY)) - set(documented))
    assert not gone, f"tests/test_docs.py lists commands the docs no longer show: {gone}"


def test_the_named_tests_exist():
    this = Path(__file__).read_text()
    missing = [f"RUN_HERE: {t}" for t in set(RUN_HERE.values()) if not re.search(rf"^def {t}\(", this, flags=re.M)]
    for cmd, nodes in EXERCISED_BY.items():
        assert nodes, f"{cmd}: no test named"
        for node in nodes:
            path, _, name = node.partition("::")
            file = REPO / path
            if not (file.is_file() and re.search(rf"^(async )?def {re.escape(name)}\(", file.read_text(), flags=re.M)):
                missing.append(f"{cmd}: {node}")
    assert not missing, "named tests not found:\n" + "\n".join(missing)


def _ci_commands() -> dict[str, str]:
    """.ci/run's parts: name -> command."""
    parts = {}
    for line in (REPO / ".ci/run").read_text().splitlines():
        if line.startswith("part "):
            words = shlex.split(line)
            parts[words[1]] = " ".join(words[2:])
    return parts


def test_the_quick_start_is_what_ci_runs():
    """The README's two commands are set-up plus the main job, and set-up plus the tests, as .ci/run runs them (the
    main job there on every core: the same jobs and outputs as --cores 1)."""
    ci = _ci_commands()
    quick = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [c for lang, lines in _fenced_blocks(quick) if lang in SHELL_BLOCKS for c in _commands(lang, lines)]
    assert len(commands) == 2, commands
    setup = {c.split(" && ")[0] for c in commands}
    assert setup == {ci["setup"]}, (setup, ci)
    main_job, tests = (c.split(" && ", 1)[1] for c in commands)
    cores = re.compile(r"--cores \S+")
    assert cores.sub("--cores N", main_job) == cores.sub("--cores N", ci["main job"]), (main_job, ci)
    assert tests == ci["tests"], (tests, ci)
    assert ".venv/bin/snakemake --cores 1" == main_job  # the default config: no target, no --configfile


def test_the_unit_tier_leaves_out_every_declared_marker():
    """The unit tier's marker expression names exactly the markers pyproject.toml declares, and tests/conftest.py
    states the same tier."""
    import tomllib

    declared = {m.split(":")[0] for m in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    unit = next(c for c in documented_commands() if " -m pytest -m " in c)
    expression = shlex.split(unit)[-1]
    assert set(re.findall(r"not (\w+)", expression)) == declared, (expression, declared)
    assert " and ".join(f"not {m}" for m in ("compile", "workflow", "slurm")) == expression
    assert expression in (REPO / "tests/conftest.py").read_text()


# ------------------------------------------------------------------------------------------------ commands run here


def _run_here(test: str) -> list[str]:
    cmds = [c for c, t in RUN_HERE.items() if t == test]
    assert cmds, f"RUN_HERE names no command for {test}"
    return cmds


def test_the_registry_commands_answer():
    """`python -m kernels.registry list` names every variant; `describe` names its variant and a file:line."""
    if "__main__" not in (REPO / "kernels/registry.py").read_text():
        pytest.skip("kernels/registry.py has no command line (list, describe) yet")
    from kernels.registry import VARIANTS, load_all

    load_all()
    for cmd in _run_here("test_the_registry_commands_answer"):
        words = shlex.split(cmd)
        proc = subprocess.run([sys.executable, *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if words[-1] == "list":
            assert set(VARIANTS) <= set(re.findall(r"[\w]+", proc.stdout)), proc.stdout
        else:
            assert words[-1] in proc.stdout and re.search(r"\w+\.py:\d+", proc.stdout), proc.stdout


@pytest.mark.workflow
def test_the_rerun_examples_plan():
    """Each rerun example of docs/pipeline.md as a dry run of this checkout: it plans (its paths and rule names
    are ones the workflow knows), and plans the jobs the docs say it runs."""
    expected = {"-f": "emulate_fp8_e4m3", "--forcerun": "emulate_fp8_e4m3", "--config": "run_fp8_e4m3"}
    for cmd in _run_here("test_the_rerun_examples_plan"):
        words = shlex.split(cmd)[1:]
        i = words.index("--cores")
        args = words[:i] + words[i + 2:]  # the suite's snakemake() sets its own --cores
        out = (lambda p: p.stdout + p.stderr)(snakemake(REPO, "-n", *args))
        job = next(v for k, v in expected.items() if k in args)
        assert re.search(rf"^{job}\s+\d+", out, flags=re.M), f"{cmd}: no {job} job planned:\n{out[-3000:]}"


def test_the_config_reference_names_every_schema_key():
    """The generated configuration reference (docs/pipeline.md) holds every top-level key of the schema."""
    page = (REPO / "docs/pipeline.md").read_text()
    schema = yaml.safe_load((REPO / docs.SCHEMA).read_text())
    assert all(f"| `{key}` |" in page for key in schema["properties"]), "docs/pipeline.md lacks the config block"


def test_every_kernel_module_has_a_design_page():
    """docs/design/<module>.md for the module of every TileLang kernel, and for the warp-specialized skeleton."""
    import inspect

    from kernels.registry import VARIANTS, load_all

    load_all()
    modules = {Path(inspect.getsourcefile(getattr(v.kernel, "func", v.kernel))).stem for v in VARIANTS.values() if v.kernel}
    missing = sorted(m for m in modules | {"warp_specialized"} if not (REPO / "docs/design" / f"{m}.md").is_file())
    assert not missing, f"kernel modules without a docs/design page: {missing}"
