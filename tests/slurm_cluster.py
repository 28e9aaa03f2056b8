"""Pytest helper (not a test file): a session-scoped throwaway SLURM cluster on this host.

conftest.py imports the fixture, so that every test module shares one cluster (tests ask for `slurm_cluster`,
which checks their `slurm` marker).
The cluster comes from ``.ci/slurm-cluster`` (see that script for the node/partition layout); its fake
``nvidia-smi`` lies in ``cluster.bin``, which ``cluster.run`` puts first on PATH (sbatch passes PATH on to jobs).
"""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci" / "slurm-cluster"
START_TIMEOUT = 90  # the script itself gives up after about 30 s of waiting for idle nodes
STOP_TIMEOUT = 60


@dataclass
class SlurmCluster:
    dir: Path
    bin: Path

    @property
    def env(self) -> dict:
        return dict(os.environ, PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(self, cmd: str | list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run a command (a string goes through bash) with the fake nvidia-smi on PATH; never raises on exit status."""
        args = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        kwargs.setdefault("env", self.env)
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def _why_not() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "not root (the local SLURM cluster runs slurmctld/slurmd/munged as root)"
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "munged", "munge") if shutil.which(b) is None]
    if missing:
        return f"slurm-wlm not installed (run .ci/setup as root); missing: {', '.join(missing)}"
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        p = Path("/etc/slurm") / name
        if p.exists() and not p.is_symlink():
            return f"{p} is a real file (a configured SLURM host?); not replacing it with a test cluster"
    return None


def _stop(path: Path) -> None:
    try:
        subprocess.run([str(SCRIPT), "stop", str(path)], capture_output=True, text=True, timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass


@pytest.fixture(scope="session")
def slurm_cluster_session(tmp_path_factory, request):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    path = tmp_path_factory.mktemp("slurm")
    request.addfinalizer(lambda: _stop(path))  # registered first: stops even a half-started cluster
    # this host can run one (root, slurm-wlm installed): a cluster that does not start is a failure
    try:
        proc = subprocess.run([str(SCRIPT), "start", str(path)], capture_output=True, text=True, timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"local SLURM cluster did not start within {START_TIMEOUT} s: {(exc.stderr or b'')[-2000:]!r}")
    if proc.returncode != 0:
        pytest.fail(f"local SLURM cluster could not be started (rc {proc.returncode}):\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    yield SlurmCluster(dir=path, bin=path / "bin")
