"""Warm job starts (harness/warm.py): a job's script runs in a child forked from a server that imported
everything once; the job's process waits for it and exits with its status."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_interrupts import REPO, SCRIPTS, _env, _snakefile_block, _wait

from harness import warm

JOB = """\
import json, os, sys
from pathlib import Path

import checkout_first
from harness.jobs import setup

setup(snakemake)
parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
Path(snakemake.output[0]).write_text(json.dumps({"pid": os.getpid(), "parent": parent,
                                                 "torch": "torch" in sys.modules, "argv": sys.argv,
                                                 "cwd": os.getcwd(), "threads": os.environ.get("OMP_NUM_THREADS")}))
print("job output", flush=True)
if snakemake.wildcards.i == "fail":
    sys.exit(3)
"""


def _workflow(root: Path) -> Path:
    (root / "workflow" / "scripts").mkdir(parents=True)
    (root / "workflow" / "scripts" / "checkout_first.py").symlink_to(SCRIPTS / "checkout_first.py")
    (root / "workflow" / "scripts" / "job.py").write_text(JOB)
    (root / "workflow" / "scripts" / "gpu_job.py").write_text(GPU_JOB)
    (root / "config.yaml").write_text("{}\n")
    head = f'import sys\n\nsys.path.insert(0, {str(REPO)!r})\n\nconfigfile: "config.yaml"\n'
    (root / "Snakefile").write_text(head + _snakefile_block() + textwrap.dedent("""

        rule job:
            output: "out/{i}.json"
            threads: 2
            log: "logs/{i}.log"
            script: "workflow/scripts/job.py"

        # a GPU job (it holds the gpu resource), after the ones its name lists (gout/b_after_a.json: after a)
        rule gpu_job:
            input: lambda wc: [f"gout/{j}.json" for j in wc.i.split("_after_", 1)[1:]]
            output: "gout/{i}.json"
            resources: gpu=1
            threads: 2
            log: "logs/g_{i}.log"
            script: "workflow/scripts/gpu_job.py"
        """))
    return root


GPU_JOB = """\
import fcntl, json, os, sys
from pathlib import Path

import checkout_first
from harness.jobs import setup

setup(snakemake)
i = snakemake.wildcards.i
parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
earlier = {}
for f in snakemake.input:  # each earlier job's lock: released when that job ended, though its process lives on
    fd = os.open(str(Path("logs") / f"g_{Path(f).stem}.log.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        earlier[f] = "free"
    except BlockingIOError:
        earlier[f] = "held"
    os.close(fd)
Path(snakemake.output[0]).write_text(json.dumps({"pid": os.getpid(), "parent": parent, "cwd": os.getcwd(),
                                                 "threads": os.environ.get("OMP_NUM_THREADS"), "earlier": earlier}))
print(f"gpu job {i} output", flush=True)
if i.startswith("fail"):
    sys.exit(3)
"""


def _run(wf: Path, *targets: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--resources", "gpu=1", "--rerun-triggers",
                           "mtime", "--keep-going", "--", *targets],
                          cwd=wf, capture_output=True, text=True, env=_env(**env), timeout=600)


@pytest.mark.workflow
def test_jobs_run_in_children_of_one_warm_server_and_report_their_status(tmp_path):
    wf = _workflow(tmp_path / "wf")
    proc = _run(wf, "out/a.json", "out/b.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (json.loads((wf / "out" / f"{i}.json").read_text()) for i in "ab")
    for job in (a, b):
        assert "harness.warm" in job["parent"], job["parent"]  # forked by the server ...
        assert job["torch"]  # ... which had imported torch
        assert job["cwd"] == str(wf) and job["threads"] == "2"  # the job's own directory and environment
        assert job["argv"][0].endswith(".job.py")  # snakemake's copy of the script, run from the top
    assert a["parent"] == b["parent"]
    logs = (wf / "logs" / "a.log").read_text()
    assert "job output" in logs and "cold start" not in logs
    server_logs = list((wf / ".snakemake" / "lpgemm-warm").glob("*.log"))
    assert len(server_logs) == 1 and "serving" in server_logs[0].read_text()
    # the server belongs to that snakemake: gone with it (it looks five times a second)
    sock = warm.socket_path(server_logs[0].stem)
    assert _wait(lambda: not _serves(sock), 10), f"{sock} still serves after its snakemake ended"

    failed = _run(wf, "out/fail.json")  # a child's exit status is the job's
    assert failed.returncode != 0 and "out/fail.json" in failed.stderr


@pytest.mark.workflow
def test_gpu_jobs_run_one_after_another_in_one_worker_which_a_failed_job_takes_down(tmp_path):
    wf = _workflow(tmp_path / "wf")
    # a, then b in the same worker; then a failing job, after which c gets a fresh worker
    proc = _run(wf, "gout/c_after_fail_after_b_after_a.json")
    assert proc.returncode != 0 and "gout/fail_after_b_after_a.json" in proc.stderr
    a, b = (json.loads((wf / "gout" / f"{i}.json").read_text()) for i in ("a", "b_after_a"))
    assert a["pid"] == b["pid"] and "harness.warm" in a["parent"]  # one process, a child of the server
    assert b["earlier"] == {"gout/a.json": "free"}  # a's lock went with a, not with the process
    assert a["cwd"] == str(wf) and a["threads"] == b["threads"] == "2"
    for i in ("a", "b_after_a"):  # each job's output in its own log only
        log = (wf / "logs" / f"g_{i}.log").read_text()
        assert f"gpu job {i} output" in log and log.count("gpu job") == 1, log
    assert not (wf / "gout" / "c_after_fail_after_b_after_a.json").exists()  # its input failed: c never ran
    server_log = next((wf / ".snakemake" / "lpgemm-warm").glob("*.log")).read_text()
    assert server_log.count("GPU worker") == 1, server_log

    again = _run(wf, "gout/d_after_a.json", "gout/e_after_d_after_a.json")  # a new snakemake: a new server, worker
    assert again.returncode == 0, again.stderr[-3000:]
    d, e = (json.loads((wf / "gout" / f"{i}.json").read_text()) for i in ("d_after_a", "e_after_d_after_a"))
    assert d["pid"] == e["pid"] != a["pid"]

    off = _run(wf, "gout/f.json", "gout/g_after_f.json", **{warm.GPU_WORKER_ENV: "0"})  # each GPU job forked
    assert off.returncode == 0, off.stderr[-3000:]
    f, g = (json.loads((wf / "gout" / f"{i}.json").read_text()) for i in ("f", "g_after_f"))
    assert f["pid"] != g["pid"] and "harness.warm" in f["parent"]


@pytest.mark.workflow
def test_a_gpu_job_after_a_failed_one_in_the_same_run_gets_a_fresh_worker(tmp_path):
    wf = _workflow(tmp_path / "wf")
    proc = _run(wf, "gout/fail1.json", "gout/h_after_fail2.json", "gout/k.json")
    assert proc.returncode != 0
    k = json.loads((wf / "gout" / "k.json").read_text())
    server_log = next((wf / ".snakemake" / "lpgemm-warm").glob("*.log")).read_text()
    assert server_log.count("GPU worker") >= 2 and "harness.warm" in k["parent"], server_log


def _serves(sock: Path) -> bool:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(str(sock))
    except OSError:
        return False
    finally:
        s.close()
    return True


@pytest.mark.workflow
def test_warm_starts_off_runs_the_job_in_its_own_process(tmp_path):
    wf = _workflow(tmp_path / "wf")
    proc = _run(wf, "out/a.json", **{warm.WARM_ENV: "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = json.loads((wf / "out" / "a.json").read_text())
    assert "harness.warm" not in job["parent"] and not job["torch"]
    assert f"cold start: {warm.WARM_ENV}=0" in (wf / "logs" / "a.log").read_text()


def test_a_server_is_keyed_by_its_snakemake_and_start_up_conditions():
    main = {"host": "h", "boot": "b", "pid_ns": "n", "pid": 10, "start": 5}
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "TMPDIR": "/tmp/job1"}
    key = warm.server_key(main, "/cache", env)
    assert key == warm.server_key(main, "/cache", env | {"TMPDIR": "/tmp/job2"})  # per job, read by nobody at import
    assert key != warm.server_key(main | {"pid": 11}, "/cache", env)  # another snakemake
    assert key != warm.server_key(main, "/other", env)  # TileLang reads its cache folder at import
    assert key != warm.server_key(main, "/cache", env | {"OMP_NUM_THREADS": "4"})  # torch reads it at import
    assert len(str(warm.socket_path(key))) < 100


def test_a_stage_is_tried_in_a_child_before_the_server_imports_it(capfd):
    """The server imports a stage only where a child that imported it could still fork a GPU-using child (on
    a host without a GPU: where it imports at all); a failing stage is reported, not raised."""
    import sys

    assert warm._stage_keeps_children_on_gpu(("json",))
    assert "no_such_module_for_lpgemm" not in sys.modules
    assert not warm._stage_keeps_children_on_gpu(("no_such_module_for_lpgemm",))
    assert "ModuleNotFoundError" in capfd.readouterr().err
