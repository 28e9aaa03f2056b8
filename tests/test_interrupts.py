"""No job outlives or ignores the snakemake that scheduled it, no two processes write one job's outputs,
and concurrent write_json calls never collide (harness/jobs.py, harness/atomic.py)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness import atomic, jobs

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
MAIN_ENV = "LPGEMM_SNAKEMAKE_MAIN"

BEAT = """\
import os, subprocess, sys, time
from pathlib import Path

import checkout_first
from harness.jobs import setup

setup(snakemake)
child = subprocess.Popen(["sleep", "1000"])
pids = Path(snakemake.params.pids)
pids.with_suffix(".tmp").write_text(f"{os.getpid()} {child.pid}")
pids.with_suffix(".tmp").replace(pids)
beat = 0
while True:
    beat += 1
    Path(snakemake.params.heartbeat).write_text(str(beat))
    time.sleep(0.1)
"""


def _start_time(pid: int) -> int | None:
    """Start time of a live pid (None once it is gone or a zombie nobody reaps)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _alive(pid: int, start: int) -> bool:
    return _start_time(pid) == start


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _kill(procs) -> None:
    for pid, start in procs:
        if _alive(pid, start):
            os.kill(pid, signal.SIGKILL)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (MAIN_ENV, "SLURM_JOB_ID")}
    return {**env, **extra}


def _snakefile_block() -> str:
    """The repo Snakefile's own block between configfile: and the first include: (the part under test)."""
    text = (REPO / "Snakefile").read_text()
    head = text.split('configfile: "config.yaml"\n', 1)[1]
    return head.split("\ninclude:", 1)[0]


def _one_rule_workflow(root: Path, name: str, script: str, output: str, params: str) -> Path:
    """A workflow with the repo Snakefile's guard block and one rule running ``script`` (its job calls setup())."""
    (root / "workflow" / "scripts").mkdir(parents=True)
    (root / "workflow" / "scripts" / "checkout_first.py").symlink_to(SCRIPTS / "checkout_first.py")
    (root / "workflow" / "scripts" / f"{name}.py").write_text(script)
    (root / "config.yaml").write_text("{}\n")
    # the repo's harness for the guard block (a job's checkout_first resolves its link to the repo too)
    head = f'import sys\n\nsys.path.insert(0, {str(REPO)!r})\n\nconfigfile: "config.yaml"\n'
    (root / "Snakefile").write_text(head + _snakefile_block() + textwrap.dedent(f"""

        rule {name}:
            output: "{output}"
            params: {params}
            log: "logs/{name}.log"
            script: "workflow/scripts/{name}.py"
        """))
    return root


def _beat_workflow(root: Path) -> Path:
    """A one-rule workflow whose job (setup() first, then a `sleep 1000` child) beats forever."""
    return _one_rule_workflow(root, "beat", BEAT, "never.txt", 'pids="pids.txt", heartbeat="heartbeat.txt"')


@pytest.mark.workflow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_signal_to_snakemake_stops_the_job_and_its_children(tmp_path, sig):
    """Only the snakemake process gets the signal (not its group): the job script and the process it
    started must still be gone within seconds, and the heartbeat must stop."""
    wf = _beat_workflow(tmp_path)
    with open(wf / "snakemake.out", "w") as out:
        # an interrupt as from a terminal: SIGINT at its default even when these tests run with it ignored
        # (a background job of a non-interactive shell inherits SIGINT ignored, and snakemake rightly keeps it so)
        sm = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=wf, env=_env(),
                              preexec_fn=_default_sigint,
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    procs = []
    try:
        pids, heartbeat = wf / "pids.txt", wf / "heartbeat.txt"
        assert _wait(lambda: pids.exists() and heartbeat.exists() or sm.poll() is not None, 60), "the job never started"
        assert sm.poll() is None, (wf / "snakemake.out").read_text()[-3000:]
        job, child = map(int, pids.read_text().split())
        procs = [(pid, _start_time(pid)) for pid in (job, child)]
        assert all(start is not None for _, start in procs)

        sm.send_signal(sig)
        if sig == signal.SIGINT:  # snakemake itself stops too (it used to wait for the job forever)
            assert _wait(lambda: sm.poll() is not None, 30), "snakemake still waits for its job after SIGINT"
            assert sm.returncode != 0
        assert _wait(lambda: not any(_alive(*p) for p in procs), 10), \
            f"still running after {sig.name} to snakemake: " + ", ".join(str(p) for p, s in procs if _alive(p, s))
        before = heartbeat.read_text()
        time.sleep(0.5)
        assert heartbeat.read_text() == before, "the heartbeat goes on"
        if sig == signal.SIGKILL:
            assert "snakemake process that scheduled this job" in (wf / "logs" / "beat.log").read_text()
    finally:
        _kill(procs)
        if sm.poll() is None:
            sm.kill()
        sm.wait()


def _fake_job(tmp_path: Path, body: str, env=None, **popen) -> subprocess.Popen:
    """A process that calls setup() as a job would (log and outputs under tmp_path), then runs body."""
    code = textwrap.dedent(f"""\
        import sys, time
        from pathlib import Path
        from types import SimpleNamespace
        sys.path.insert(0, {str(REPO)!r})
        from harness.jobs import setup
        tmp = Path({str(tmp_path)!r})
        snakemake = SimpleNamespace(scriptdir={str(SCRIPTS)!r}, config={{}}, log=[str(tmp / "logs" / "job.log")],
                                    output=[str(tmp / "out" / "a.json"), str(tmp / "out" / "b.json")])
        setup(snakemake)
        """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], env=env or _env(), **popen)


def test_second_writer_of_a_job_fails_at_once_naming_the_first(tmp_path):
    first = _fake_job(tmp_path, '(tmp / "ready").write_text("1")\ntime.sleep(60)\n')
    try:
        assert _wait(lambda: (tmp_path / "ready").exists() or first.poll() is not None, 30)
        assert first.poll() is None
        t0 = time.monotonic()
        second = _fake_job(tmp_path, '(tmp / "second_ran").write_text("1")\n', stderr=subprocess.PIPE, text=True)
        _, err = second.communicate(timeout=30)
        assert second.returncode != 0 and time.monotonic() - t0 < 20, "the second writer did not fail at once"
        assert not (tmp_path / "second_ran").exists()
        assert f"PID {first.pid}" in err, err
        assert "already running this job" in err and str(tmp_path / "out" / "a.json") in err, err
        assert (tmp_path / "ready").exists() and first.poll() is None, "the first writer was disturbed"
    finally:
        first.kill()
        first.wait()
    # the lock dies with its holder, however it died: the next run goes ahead
    third = _fake_job(tmp_path, '(tmp / "third_ran").write_text("1")\n')
    assert third.wait(30) == 0 and (tmp_path / "third_ran").exists()


@pytest.mark.parametrize("cluster", [False, True], ids=["local", "slurm_job"])
def test_job_watches_the_main_process_unless_a_cluster_job(tmp_path, cluster):
    """The watchdog without snakemake: a stand-in main process, whose identity the job inherits, dies.
    A local job stops with it; a SLURM job (another SLURM_JOB_ID) is the SLURM plugin's to cancel."""
    main = subprocess.Popen(["sleep", "1000"])
    procs = [(main.pid, _start_time(main.pid))]
    try:
        ident = dict(jobs._identity(), pid=main.pid, start=procs[0][1], slurm_job="")
        env = _env(**{MAIN_ENV: json.dumps(ident)}, **({"SLURM_JOB_ID": "4242"} if cluster else {}))
        job = _fake_job(tmp_path, '(tmp / "ready").write_text("1")\ntime.sleep(60)\n', env=env)
        procs.append((job.pid, _start_time(job.pid)))
        assert _wait(lambda: (tmp_path / "ready").exists() or job.poll() is not None, 30) and job.poll() is None
        main.kill()
        main.wait()
        if cluster:
            time.sleep(2)
            assert job.poll() is None, "a cluster job was stopped when the (login-node) snakemake went away"
        else:
            assert _wait(lambda: job.poll() is not None, 10), "the job outlived its snakemake"
            assert job.returncode != 0
    finally:
        _kill(procs)
        main.wait()
        if procs[1:]:
            job.wait()


WRITER = """\
import sys
sys.path.insert(0, sys.argv[1])
from harness.atomic import write_json
me = sys.argv[3]
for i in range(int(sys.argv[4])):
    write_json(sys.argv[2], {"writer": me, "i": i, "rows": [{"tile": f"t{j}", "value": j * 0.5} for j in range(400)]})
"""


def test_concurrent_write_json_never_collides(tmp_path):
    """Two processes rewrite one file many times while it is read: every read is a complete record, no
    writer fails, and no temporary file is left."""
    out = tmp_path / "res" / "run.json"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(REPO), str(out), name, "300"],
                                stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    bad, reads = [], 0
    stop = threading.Event()

    def read():
        nonlocal reads
        while not stop.is_set():
            try:
                text = out.read_text()
            except FileNotFoundError:
                continue
            reads += 1
            try:
                obj = json.loads(text)
                assert len(obj["rows"]) == 400
            except (ValueError, KeyError, AssertionError) as e:
                bad.append(f"{e}: {text[:80]!r}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        errs = [(w.communicate(timeout=120)[1], w.returncode) for w in writers]
    finally:
        stop.set()
        reader.join()
        for w in writers:
            if w.poll() is None:
                w.kill()
    assert all(rc == 0 for _, rc in errs), "\n".join(e[-2000:] for e, _ in errs)
    assert not bad, bad[:3]
    assert reads > 0
    assert json.loads(out.read_text())["i"] == 299
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.json"]
    assert out.stat().st_mode & 0o777 != 0o600, "a result readable only by its owner (mkstemp's mode)"


def test_write_json_leaves_nothing_behind_on_error(tmp_path, monkeypatch):
    """A write that fails half-way (here the rename) keeps the old result and leaves no temporary file."""
    out = tmp_path / "r.json"
    atomic.write_json(out, {"ok": 1})

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError):
        atomic.write_json(out, {"ok": 2})
    monkeypatch.undo()
    assert json.loads(out.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_killed_job_takes_its_subprocesses_with_it(tmp_path):
    """kill -9 of a job (not of snakemake): its nvcc used to run on under init. The job's sentinel kills
    the rest of its process group within seconds."""
    main = subprocess.Popen(["sleep", "1000"])  # the stand-in snakemake stays alive throughout
    procs = [(main.pid, _start_time(main.pid))]
    try:
        ident = dict(jobs._identity(), pid=main.pid, start=procs[0][1], slurm_job="")
        job = _fake_job(tmp_path, """\
            import subprocess
            child = subprocess.Popen(["sleep", "1000"])
            (tmp / "child").write_text(str(child.pid))
            time.sleep(60)
            """, env=_env(**{MAIN_ENV: json.dumps(ident)}))
        procs.append((job.pid, _start_time(job.pid)))
        child_file = tmp_path / "child"
        assert _wait(lambda: child_file.exists() or job.poll() is not None, 30) and job.poll() is None
        child = int(child_file.read_text())
        procs.append((child, _start_time(child)))
        job.kill()
        job.wait()
        assert _wait(lambda: not _alive(*procs[2]), 10), "the killed job's subprocess runs on"
        assert _alive(*procs[0]), "the sentinel reached beyond the job"
    finally:
        _kill(procs)
        main.wait()


def test_stale_temporary_files_are_removed_and_live_ones_kept(tmp_path):
    root = tmp_path / "results"
    (root / "inputs" / "x").mkdir(parents=True)
    with atomic.atomic_path(root / "kernel.ptx") as live:  # this process's, half-written
        live.write_text("x")
        stale = [root / "inputs" / "x" / ".fp32.pt.999999999.a1b2c3d4.tmp",  # no such PID
                 root / ".tidy.csv.zz_09xyz.tmp", root / "inputs" / ".run.json.4ab_9c0d.tmp"]  # older: no PID
        kept = [live, root / "inputs" / "x" / "fp32.pt", root / "notes.tmp", root / ".hidden.json",
                root / "kernel.ptx.999999999.tmp"]
        for f in stale + kept:
            f.write_text("x")
        assert sorted(jobs.remove_stale_temp_files(root)) == sorted(stale)
        assert all(f.exists() for f in kept) and not any(f.exists() for f in stale)
    assert jobs.remove_stale_temp_files(tmp_path / "absent") == []


@pytest.mark.parametrize("argv, mode", [
    (["snakemake", "--cores", "1"], "write"), (["snakemake", "-np"], "read"), (["snakemake", "--unlock"], "write"),
    (["snakemake", "--summary"], "read"), (["snakemake", "--rerun-incomplete", "-f", "x"], "write"),
    (["pytest", "-n", "2"], None)])
def test_invocation_mode_is_read_from_snakemakes_own_command_line(monkeypatch, argv, mode):
    monkeypatch.setattr(sys, "argv", argv)
    assert jobs._invocation_mode() == mode


SLOW = """\
import os, sys, time
from pathlib import Path

import checkout_first
from harness.jobs import setup

setup(snakemake)
Path(snakemake.output[0]).write_text("partial")  # a running job's output, half written
Path(snakemake.params.ready).write_text(str(os.getpid()))
time.sleep(1000)
"""


@pytest.mark.workflow
def test_a_second_snakemake_never_touches_a_running_ones_outputs(tmp_path):
    """Runs snakemake itself (several invocations against one live run): what is under test is how two
    snakemake processes in one checkout meet, which no shared session run can show. While run A's slow
    job writes out.txt, every invocation that could write (--unlock, --rerun-incomplete, -f, a plain run)
    is refused naming A, and out.txt and A's job are untouched; a dry run only warns, naming A. A's start
    removed the temporary file an earlier, killed writer left."""
    wf = _one_rule_workflow(tmp_path, "slow", SLOW, "out.txt", 'ready="ready.txt"')
    stale = wf / "results" / "inputs" / ".fp32.pt.k3j9x0qa.tmp"  # what a kill -9 mid-write leaves
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\0" * 1000)
    with open(wf / "a.out", "w") as out:
        a = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=wf, env=_env(),
                             preexec_fn=_default_sigint, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    job = None
    try:
        assert _wait(lambda: (wf / "ready.txt").exists() or a.poll() is not None, 60), "the job never started"
        assert a.poll() is None, (wf / "a.out").read_text()[-3000:]
        job = int((wf / "ready.txt").read_text())
        job_start = _start_time(job)
        assert not stale.exists(), "the next run did not remove an interrupted writer's temporary file"
        for args in (["--unlock"], ["--cores", "1", "--rerun-incomplete", "out.txt"], ["--cores", "1", "-f", "out.txt"],
                     ["--cores", "1"]):
            b = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=wf, env=_env(), capture_output=True,
                               text=True, timeout=120)
            said = b.stdout + b.stderr
            assert b.returncode != 0, f"{args} was not refused:\n{said[-2000:]}"
            assert "another snakemake is running in this checkout" in said and f"PID {a.pid} " in said, said[-2000:]
            assert (wf / "out.txt").read_text() == "partial", f"{args} touched the running job's output"
            assert a.poll() is None and _alive(job, job_start), f"{args} disturbed the running invocation"
        dry = subprocess.run([sys.executable, "-m", "snakemake", "-n"], cwd=wf, env=_env(), capture_output=True,
                             text=True, timeout=120)
        # snakemake's own dry run then stops at the live job's output (IncompleteFilesException): the warning
        # before it says why, and what not to do
        assert "another snakemake is writing in this checkout" in dry.stderr and f"PID {a.pid} " in dry.stderr
        assert "do not --rerun-incomplete" in dry.stderr
        assert (wf / "out.txt").read_text() == "partial"
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGINT)
            try:
                a.wait(30)
            except subprocess.TimeoutExpired:
                a.kill()
                a.wait()
        if job is not None and _start_time(job) is not None:
            os.kill(job, signal.SIGKILL)


def test_a_record_deleted_while_its_job_runs_is_written_again(tmp_path, capsys):
    """A compile job writes a record per (target, tile); one deleted before the job ends used to fail the
    job, and snakemake then deleted every good sibling."""
    written = {str(tmp_path / f"{t}.json"): {"tile": t, "records": [{"status": "ok"}]} for t in ("a", "b", "c")}
    for path, obj in written.items():
        atomic.write_json(path, obj)
    Path(tmp_path / "b.json").unlink()
    assert jobs.restore_missing(written) == [str(tmp_path / "b.json")]
    assert json.loads((tmp_path / "b.json").read_text()) == written[str(tmp_path / "b.json")]
    assert "deleted while this job ran" in capsys.readouterr().err
    assert jobs.restore_missing(written) == []
