"""What the whole suite shares: runs and compiles paid for once per session, and markers that are checked.

Tiers (docs/contributing.md, "Tests"): the unit tier, `pytest -m "not compile and not workflow and not slurm"`, compiles
no kernel and starts no Snakemake; the full suite runs everything. A test that compiles a TileLang kernel
(in this process) must carry the `compile` marker, one that starts Snakemake or reads a session pipeline
run the `workflow` marker, one that uses the SLURM test cluster the `slurm` marker: otherwise it fails.

Shared, never repeated:
- ``tiny_run``: the tiny CPU pipeline (``tiny_config``), run once with the published H200 tables and report
  rebuilt beside it; tests that only read use it in place, tests that change something take
  ``tiny_run_copy`` (the finished folder, ``.snakemake/`` included, copied with its timestamps).
- ``kernels``: each (variant, tile, target, shape) compiled once into a session folder, by default at
  ``CANONICAL_SHAPE`` (the config's compile-check shape).
- One TileLang kernel cache the suite owns (``KERNEL_CACHE``), cleared when a session starts and seeded
  with the main job's cache (``.cache/tilelang``) where there is one: under ``.ci/run`` the kernels the main
  job compiled at the same shape are loaded, not rebuilt.
"""
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
KERNEL_CACHE = REPO / ".cache/tilelang-tests"
MAIN_JOB_CACHE = REPO / ".cache/tilelang"
# TileLang reads its cache folder when it is imported: set before any test module imports it
os.environ["TILELANG_CACHE_DIR"] = str(KERNEL_CACHE)

from slurm_cluster import slurm_cluster_session  # noqa: E402, F401  (one session-wide cluster for every SLURM test)

from harness import compile as harness_compile  # noqa: E402
from harness.plan import AUTO_ENV  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import parse_shape, parse_tile  # noqa: E402

DEFAULT_CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())
# the main job's compile-check shape: there, a config tile is a cache hit after the main job
CANONICAL_SHAPE = parse_shape(DEFAULT_CONFIG["sweeps"]["cpu_compile"][0])


# ---------------------------------------------------------------- markers that are checked

_current = {"item": None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current["item"] = item


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    _current["item"] = None


def module_level_imports(path: Path) -> set[str]:
    """The modules a Python file imports at module level (an optional library must not be among a kernel
    module's: a function's import runs only when it is called)."""
    import ast

    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def require_marker(marker: str, what: str) -> None:
    """Fail the running test (its fixtures included) unless it carries ``marker``."""
    item = _current["item"]
    if item is not None and item.get_closest_marker(marker) is None:
        pytest.fail(f"{item.nodeid} {what} but is not marked @pytest.mark.{marker} (tests/conftest.py: tiers)",
                    pytrace=False)


def _watch_tilelang_compile():
    import tilelang

    if getattr(tilelang.compile, "lpgemm_watched", False):
        return
    real = tilelang.compile

    def compile(*args, **kwargs):
        require_marker("compile", "compiles a TileLang kernel")
        return real(*args, **kwargs)

    compile.lpgemm_watched = True
    tilelang.compile = compile


_real_build = harness_compile.build


def _watched_build(*args, **kwargs):
    _watch_tilelang_compile()  # TileLang is imported on the first build, which then calls it watched
    return _real_build(*args, **kwargs)


harness_compile.build = _watched_build  # before the test modules import it by name

_real_popen_init = subprocess.Popen.__init__


def _starts_snakemake(args) -> bool:
    words = args.split() if isinstance(args, str) else [str(a) for a in args]
    return any(w == "snakemake" or w.endswith("/snakemake") for w in words)


def _watched_popen_init(self, args, *rest, **kwargs):
    if _starts_snakemake(args):
        require_marker("workflow", "starts Snakemake")
    _real_popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _watched_popen_init


def pytest_collection_modifyitems(items):
    """The SLURM tests first (pytest-xdist hands out files in this order; the random order stays otherwise):
    they mostly wait on the cluster's scheduler, so one worker waits there while the others run the rest.
    Among them, the one that needs the session's tiny run last, by when another worker has made it."""
    def slurm_first(item):
        slurm = item.get_closest_marker("slurm") is not None
        return not slurm, slurm and "tiny_run" in item.fixturenames

    items.sort(key=slurm_first)


@pytest.fixture
def slurm_cluster(slurm_cluster_session):  # noqa: F811  (the imported fixture)
    require_marker("slurm", "uses the SLURM test cluster")
    return slurm_cluster_session


# ---------------------------------------------------------------- the suite's kernel cache


def pytest_configure(config):
    """A fresh kernel cache per session (no test depends on what an earlier session compiled), seeded
    with the main job's, whose kernels at the same shapes are the same cache entries. Made once, by the
    process that starts the session (pytest-xdist's workers share it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    shutil.rmtree(KERNEL_CACHE, ignore_errors=True)
    if MAIN_JOB_CACHE.is_dir():
        shutil.copytree(MAIN_JOB_CACHE, KERNEL_CACHE, copy_function=_link_or_copy)
    KERNEL_CACHE.mkdir(parents=True, exist_ok=True)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)  # TileLang writes new entries, never rewrites old ones: a link is a copy
    except OSError:
        shutil.copy2(src, dst)


def session_dir(tmp_path_factory, name: str) -> Path:
    """A folder every worker of this session shares (pytest-xdist gives each worker a base of its own)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


def once_per_session(folder: Path, make) -> Path:
    """``make(folder)`` run by the first worker that asks, under a lock; the others wait, then reuse it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        done = folder.parent / (folder.name + ".done")
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            make(folder)
            done.touch()
    return folder


@pytest.fixture(autouse=True)
def _no_inherited_auto_platform(monkeypatch):
    """A run_on auto resolved in this process (harness.plan.resolve_auto) stays in its test."""
    monkeypatch.delenv(AUTO_ENV, raising=False)


@dataclass(frozen=True)
class Compiled:
    """One compile record and its artifacts folder (kernel.cu, .ptx, .cubin, .sass), as the compile step writes them."""

    record: dict
    dir: Path

    @property
    def source(self) -> str:
        return (self.dir / "kernel.cu").read_text()

    @property
    def sass(self) -> str:
        return (self.dir / "kernel.sass").read_text()


class KernelBuilds:
    def __init__(self, root: Path):
        self.root = root

    def __call__(self, variant: str, tile: str, arch: str = "sm_90a", shape=CANONICAL_SHAPE) -> Compiled:
        folder = self.root / variant / arch / tile / "x".join(map(str, shape))

        def compile_into(out: Path):
            rec = harness_compile.compile_record(get_variant(variant), *shape, parse_tile(tile), arch, out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "record.json").write_text(json.dumps(rec))

        once_per_session(folder, compile_into)
        return Compiled(json.loads((folder / "record.json").read_text()), folder)


@pytest.fixture(scope="session")
def _kernel_builds(tmp_path_factory):
    return KernelBuilds(session_dir(tmp_path_factory, "kernels"))


@pytest.fixture
def kernels(_kernel_builds):
    """``kernels(variant, tile, arch="sm_90a", shape=CANONICAL_SHAPE)`` -> Compiled, each compiled once per session."""
    require_marker("compile", "uses compiled kernels")
    return _kernel_builds


# ---------------------------------------------------------------- workflow copies and the shared runs


def copy_workflow(dest: Path, config: dict) -> Path:
    """A throwaway copy of the workflow with its own config.yaml (a --configfile would merge, not replace)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "kernels", "harness", "envs", "profiles", "results/published"):
        src = REPO / item
        (shutil.copytree(src, dest / item, ignore=shutil.ignore_patterns("__pycache__", "report.html", "figures"))
         if src.is_dir() else shutil.copy(src, dest / item))
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(workdir))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir,
                          capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


TINY_TILE = "m64n64k64_s2_t128"


def tiny_config() -> dict:
    """The default config cut to a CPU run of minutes: two TileLang variants of one small tile (two compile
    jobs, so that a cluster batches them) and the bf16 peer, two small shapes, one distribution."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run_on"] = ["cpu"]
    cfg.pop("zoo")  # about a hundred GPU shapes of real models: the tiny GPU sweep has one
    cfg["distributions"] = ["normal"]
    cfg["targets"] = ["sm_90a"]
    cfg["sweeps"] = {"cpu": ["64x128x128", "48x64x128"], "gpu": ["64x128x128"], "cpu_compile": ["64x128x128"]}
    keep = {"fp8_e4m3", "fp8_e5m2", "cublas_bf16"}
    cfg["variants"] = {k: v for k, v in cfg["variants"].items() if k in keep}
    for name in ("fp8_e4m3", "fp8_e5m2"):
        cfg["variants"][name]["tiles"] = {"default": [TINY_TILE]}
    return cfg


PUBLISHED_TABLES = ("tidy.csv", "point_sets.csv", "compile_matrix.csv", "roofs.csv")


@pytest.fixture(scope="session")
def _tiny_run_session(tmp_path_factory):
    def run(wf: Path):
        copy_workflow(wf, tiny_config())
        published = [f"results/published/h200/{f}" for f in (*PUBLISHED_TABLES, "report.html")]
        # the main job's targets, and the published tables and report rebuilt from the committed points
        snakemake(wf, "all", *published, "--forcerun", "collect_published", "report_published")

    return once_per_session(session_dir(tmp_path_factory, "tiny-run"), run)


@pytest.fixture
def tiny_run(_tiny_run_session):
    """The finished tiny CPU run (read it, never change it: take tiny_run_copy for that)."""
    require_marker("workflow", "reads the session's pipeline run")
    return _tiny_run_session


@pytest.fixture
def tiny_run_copy(tiny_run, tmp_path):
    """A copy of the finished tiny run to change: Snakemake finds it up to date, as the original."""
    return shutil.copytree(tiny_run, tmp_path / "wf", symlinks=True)


@pytest.fixture
def tiny_workflow(tmp_path):
    return copy_workflow(tmp_path, tiny_config())


def fake_nvidia_smi(folder: Path, name: str, cc: str) -> Path:
    """A folder holding an nvidia-smi that reports one GPU (put it first on PATH): the name and compute
    capability of --query-gpu=name,compute_cap, and name, driver and clock for any other query."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ncase "$*" in\n  *--query-gpu=name,compute_cap*) echo "{name}, {cc}" ;;\n'
                   f'  *) echo "{name}, 550.00, 1980" ;;\nesac\n')
    smi.chmod(0o755)
    return bin_dir


def on_path(monkeypatch, bin_dir: Path) -> None:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
