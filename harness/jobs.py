"""The life of a workflow job: one writer per job, one snakemake writing per checkout, and no job
outliving the snakemake that scheduled it. Every workflow script starts with ``setup`` (log, job lock,
watchdog); the Snakefile calls ``register_main`` and ``hold_checkout``.

How the local executor runs a `script:` job (Snakemake 9): a worker thread of the main snakemake process
calls shell("python .snakemake/scripts/tmpXXXX.<name>.py"), a bash that execs the script, so the job is a
direct child of the main process, in its process group, and snakemake keeps no hold on it beyond waiting:
  - SIGKILL to snakemake: the job is reparented to init and runs on, writing outputs nobody records;
  - SIGINT to snakemake alone (not a terminal's Ctrl-C, which reaches its whole process group): the
    scheduler cancels by shutting its thread pool down, which waits for the running jobs to end;
  - SIGTERM: snakemake's graceful stop, by design: no new jobs, the running ones finish.
So: the main snakemake process (the Snakefile calls register_main) exports its identity to the jobs and
forwards an interrupt to them; setup() makes each job the leader of its own process group (its
subprocesses, nvcc and ptxas, join it) and starts a watchdog thread that stops the whole group the moment
that snakemake is gone. setup() also takes a per-job lock, so two processes never write one job's outputs
(an orphan from before and its rerun after --unlock --rerun-incomplete).

Results are written whole or not at all (harness/atomic.py); what writers killed mid-write leave behind is
removed when the next run takes the checkout (remove_stale_temp_files).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from harness.atomic import TEMP_FILE, write_json

# the main snakemake process's identity, exported to every job it starts (register_main)
MAIN_ENV = "LPGEMM_SNAKEMAKE_MAIN"
# after an interrupt, how long the jobs get to stop on their own before they are killed
INTERRUPT_GRACE_S = 10.0
# descriptors this job keeps open for its whole life: its lock (setup), its sentinel's pipe
_held_fds: list[int] = []


# where a job's log is, and beside it in a tree of its own what the job cost (Snakemake's benchmark: directive)
LOGS = "results/logs"
BENCHMARKS = "results/benchmarks"


def benchmark_of(log: str) -> str:
    """A rule's benchmark file from its log: results/logs/<X>.log -> results/benchmarks/<X>.tsv (a wildcard
    pattern stays a pattern). Every rule's ``benchmark:`` is this of its ``log:`` (workflow/rules/*.smk)."""
    log = str(log)
    if not (log.startswith(LOGS + "/") and log.endswith(".log")):
        raise ValueError(f"{log}: not a log path of the form {LOGS}/<X>.log")
    return f"{BENCHMARKS}/{log[len(LOGS) + 1:-len('.log')]}.tsv"


def forked_cost_of(benchmark: str) -> str:
    """Beside a job's benchmark, the peak memory and CPU time of the child a warm start ran it in
    (harness/warm.py), which Snakemake's benchmark of the job's own process does not see."""
    return str(benchmark).removesuffix(".tsv") + ".forked.json"


class JobAlreadyRunning(RuntimeError):
    """Another live process is running this very job: writing its outputs too would corrupt them."""


def setup(snakemake) -> Path:
    """Make sure this is the only process running the job (lock next to its log), send stdout/stderr
    (including C++ logs) to the rule's log, and stop the job (with its subprocesses) if the snakemake that
    scheduled it goes away; return the repo root. (The script's ``import checkout_first``, before it,
    put that root first on sys.path.)"""
    repo = Path(snakemake.scriptdir).resolve().parents[1]
    # a project-local kernel cache (read by TileLang at import): warm reruns load instead of compiling
    os.environ["TILELANG_CACHE_DIR"] = str(repo / snakemake.config.get("tilelang_cache", ".cache/tilelang"))
    cold_reason = _hand_off(snakemake)  # returns only where this process runs the job itself
    if snakemake.log:
        log = Path(str(snakemake.log[0]))
        log.parent.mkdir(parents=True, exist_ok=True)
        # before the log is truncated: a second writer must leave the first one's log alone
        _lock_job(log.with_name(log.name + ".lock"), [str(o) for o in snakemake.output])
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if cold_reason:
        print(f"lpgemm: cold start: {cold_reason}", file=sys.stderr, flush=True)
    if not _watching:
        _watch_main()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupted)
    return repo


_interrupts: list[int] = []


def _interrupted(signum, frame):
    """The job's interrupt: noted, then raised as Python's own would be."""
    _interrupts.append(signum)
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether this job was interrupted: a subprocess (nvcc, ptxas) killed by the same interrupt makes its
    caller fail with an ordinary error before the KeyboardInterrupt arrives, and that failure is no result."""
    return bool(_interrupts)


def _hand_off(snakemake) -> str:
    """Hand this job to the warm server of its snakemake (harness/warm.py) and exit with the status of the
    child that ran it; or return why this process runs it itself (empty in a forked job)."""
    from harness import warm

    if os.environ.get(warm.CLIENT_ENV):
        return ""  # the forked job itself
    if os.environ.get(warm.WARM_ENV, "1") == "0":
        return f"{warm.WARM_ENV}=0"
    main = local_main()
    if main is None:
        return "no local snakemake to share a warm server with"
    _watch_main()  # the client is a job to its snakemake: interrupts reach it, and it ends with it
    forked_cost = None
    with contextlib.suppress(ValueError, IndexError, TypeError):
        forked_cost = forked_cost_of(benchmark_of(str(snakemake.log[0])))
    try:
        warm.handoff(snakemake, main, os.environ["TILELANG_CACHE_DIR"], forked_cost)
    except warm.WarmUnavailable as e:
        return str(e)
    return "unreachable"  # pragma: no cover (handoff exits)


# ---------------------------------------------------------------- one writer per job


class _Held(Exception):
    """Another live process holds the lock; ``holder``: what it wrote there."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def _exclusive_lock(path: Path, guarding: str) -> int | None:
    """An exclusive flock on ``path``, held for as long as the returned descriptor is open, stamped with this
    process's PID and host (what a refused taker is told), or _Held naming the holder. flock is released by
    the kernel when its holder dies, however it dies, so a stale file never blocks anyone; the file stays
    (unlinking a lock file races with the next taker). Python's descriptors are close-on-exec: nothing a
    job execs inherits it. None, with a warning, where the filesystem has no locks (``guarding``: what then
    goes unguarded)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise _Held(holder) from None
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            print(f"lpgemm: warning: cannot lock {path} ({e.strerror}); not guarding against {guarding}", file=sys.stderr)
            return None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                  f"{' '.join(sys.argv)[:300]}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    return os.pread(fd, 1000, 0).decode(errors="replace").strip() or "a process that has not written its PID yet"


def _lock_job(lock: Path, outputs: list[str]) -> None:
    """Hold the job's lock for the life of this process, or fail at once naming the process that holds it."""
    try:
        fd = _exclusive_lock(lock, "a second writer")
    except _Held as e:
        raise JobAlreadyRunning(
            f"another process ({e.holder}) is already running this job and writing its outputs: {', '.join(outputs)}. "
            f"Two writers would corrupt them; wait for that process to end or stop it, then rerun (lock: {lock})") from None
    if fd is not None:
        _held_fds.append(fd)


# ---------------------------------------------------------------- one invocation per checkout

# Held, for its whole life, by the snakemake that may write in this checkout (flock: the kernel releases
# it however that process dies, so a stale file never blocks anyone).
INVOCATION_LOCK = Path(".snakemake") / "lpgemm-invocation.lock"
# snakemake options that only read: a dry run, listings, graphs, summaries. They may run beside a writer.
READ_ONLY_OPTIONS = ("dryrun", "summary", "detailed_summary", "list_rules", "list_target_rules", "dag", "rulegraph",
                     "filegraph", "d3dag", "lint", "list_changes", "list_input_changes", "list_params_changes",
                     "list_untracked", "list_conda_envs", "print_compilation", "containerize", "export_cwl")
_checkout_lock: list[int] = []


try:  # in snakemake's process: its own error type, reported as a plain message
    from snakemake.exceptions import WorkflowError as _WorkflowError
except ImportError:  # pragma: no cover (a job's environment always has snakemake)
    _WorkflowError = RuntimeError


class CheckoutBusy(_WorkflowError):
    """Another snakemake is writing in this checkout."""


def _invocation_mode() -> str | None:
    """'read' or 'write' for a snakemake started from its command line (sys.argv parsed by snakemake's
    own parser), None where this process was not (the Python API, a test harness)."""
    prog = Path(sys.argv[0]).name if sys.argv else ""
    if prog != "snakemake" and not sys.argv[0].endswith(os.path.join("snakemake", "__main__.py")):
        return None
    try:
        from snakemake.cli import get_argument_parser

        args, _ = get_argument_parser().parse_known_args(sys.argv[1:])
    except (Exception, SystemExit):
        return None
    return "read" if any(getattr(args, o, False) for o in READ_ONLY_OPTIONS) else "write"


def guard_checkout() -> None:
    """Called at parse time by the main snakemake process. One snakemake writes in a checkout at a time:
    a second one that would write (a run, -f, --rerun-incomplete, --unlock, --touch, --delete-all-output,
    --cleanup-metadata) is refused before it plans anything, naming the running one. Snakemake's own
    advice to a second run (--unlock, then --rerun-incomplete) would otherwise have it delete the first
    run's outputs as incomplete while that run is still writing them. A read-only invocation (-n, --summary,
    listings, graphs) only warns. Started through the API (no command line to read), the lock is taken at
    onstart (hold_checkout), before any job is prepared, which is when snakemake deletes outputs."""
    mode = _invocation_mode()
    if mode == "write":
        hold_checkout()
    elif mode == "read":
        INVOCATION_LOCK.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(INVOCATION_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"lpgemm: warning: another snakemake is writing in this checkout ({_holder(fd)}). What this "
                  f"shows can change under it, and snakemake calls the outputs of its running jobs incomplete: they "
                  f"are not; do not --rerun-incomplete or --cleanup-metadata them while it runs", file=sys.stderr)
        except OSError:
            pass
        finally:
            os.close(fd)


def hold_checkout() -> None:
    """Take this checkout's invocation lock for the life of this process (once; again is a no-op), or
    raise CheckoutBusy naming the snakemake that holds it and what to do. Then remove what killed writers
    left half-written under results/ (no writer of this checkout is alive now)."""
    if _checkout_lock:
        return
    INVOCATION_LOCK.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = _exclusive_lock(INVOCATION_LOCK, "a second snakemake in this checkout")
    except _Held as e:
        if e.holder.startswith(f"PID {os.getpid()} "):  # this very process, parsing the workflow again
            return
        raise CheckoutBusy(
            f"another snakemake is running in this checkout ({e.holder}) and writing its results. Nothing was done "
            f"and nothing of it was touched. Wait for it to end, or stop it (kill -INT <its PID>; its jobs stop "
            f"with it), then run again; while it runs, only read-only options work (-n, --summary). Do not use "
            f"--unlock or --rerun-incomplete against a live run: snakemake would delete its outputs as "
            f"incomplete (lock: {INVOCATION_LOCK.resolve()})") from None
    if fd is not None:
        _checkout_lock.append(fd)
        remove_stale_temp_files(Path("results"))


def remove_stale_temp_files(root: Path) -> list[Path]:
    """Delete the temporary files that killed writers left under root (a kill -9 mid-write leaves a hidden
    temporary file beside its target that no rerun would overwrite: harness.atomic.TEMP_FILE); one whose
    writer is still alive stays."""
    removed = []
    if not root.is_dir():
        return removed
    for folder, _, files in os.walk(root):
        for name in files:
            m = TEMP_FILE.match(name)
            if m is None or (m["pid"] and _proc_stat(int(m["pid"])) is not None):
                continue
            path = Path(folder) / name
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    if removed:
        print(f"lpgemm: removed {len(removed)} temporary file(s) left by an interrupted run under {root}/",
              file=sys.stderr)
    return removed


# ---------------------------------------------------------------- no job outlives its snakemake


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, process group, start time in clock ticks since boot) of pid, None if it is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()  # after "pid (comm) ": state is field 3, starttime 22
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _identity() -> dict | None:
    """What tells this process apart from any other, even after its PID is reused (Linux only)."""
    stat = _proc_stat(os.getpid())
    if stat is None:
        return None
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "pid_ns": pid_ns,
            "pid": os.getpid(), "start": stat[3], "slurm_job": os.environ.get("SLURM_JOB_ID", "")}


def register_main(workflow) -> None:
    """Called by the Snakefile. In the main snakemake process: export its identity to every job it will
    start (jobs inherit os.environ), and forward an interrupt to its running jobs. A snakemake that only
    runs jobs (a cluster job re-parsing the Snakefile, --mode remote/subprocess) keeps the value it
    inherited from the main one."""
    main = getattr(workflow, "is_main_process", None)
    if main is False:
        return
    if main:
        guard_checkout()
    ident = _identity()
    if ident is None:  # not Linux: no watching, behaviour as before
        return
    value = json.dumps(ident, separators=(",", ":"))
    if main:
        os.environ[MAIN_ENV] = value  # a stale value from an outer environment must not win
    else:
        os.environ.setdefault(MAIN_ENV, value)
    if main and threading.current_thread() is threading.main_thread():
        _forward_interrupts()


# processes this one started that are not part of its job (the warm server a job's process starts belongs to the
# main snakemake and serves every job; it and its children stop on their own when that snakemake is gone)
_outside_the_job: list[int] = []


def outside_the_job(pid: int) -> None:
    """``pid``, a process this one started, and all below it are not stopped with this job (``_stop_job_tree``)."""
    _outside_the_job.append(pid)


def _descendants(root: int, exclude: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """(pid, process group) of every process below root, those at and below ``exclude`` left out, from one
    pass over /proc."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _proc_stat(int(name))) is not None:
            children.setdefault(stat[1], []).append((int(name), stat[2]))
    found, todo = [], [root]
    while todo:
        for pid, pgid in children.get(todo.pop(), []):
            if pid not in exclude:
                found.append((pid, pgid))
                todo.append(pid)
    return found


def _job_groups() -> list[tuple[int, int]]:
    """(process group, its leader's start time) of this process's running jobs: each job leads its own
    group (setup), its subprocesses in it."""
    own = os.getpgrp()
    groups = []
    for pid, pgid in _descendants(os.getpid()):
        if pid == pgid != own and (stat := _proc_stat(pid)) is not None:
            groups.append((pgid, stat[3]))
    return groups


def _signal_groups(groups, sig) -> None:
    for pgid, start in groups:
        stat = _proc_stat(pgid)
        if stat is not None and stat[3] == start:  # still that job, not a reused PID
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)


def _forward_interrupts() -> None:
    """SIGINT to the main process alone reaches no job (they lead their own groups, and snakemake waits for
    them); a terminal's Ctrl-C reaches them only through this too. So the first interrupt passes SIGINT on
    to every job's group (Python raises KeyboardInterrupt in a script, nvcc stops) and kills, after
    INTERRUPT_GRACE_S, what is left of them; a second interrupt kills them at once. Then snakemake's own
    handling (KeyboardInterrupt) runs as before."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or getattr(previous, "lpgemm_forwarder", False):
        return  # interrupts ignored on purpose (nohup, `cmd &` in a script), or already forwarding
    interrupted: list = []

    def forward(signum, frame):
        with contextlib.suppress(OSError):
            groups = _job_groups()
            if interrupted:
                _signal_groups(groups + interrupted, signal.SIGKILL)
            else:
                _signal_groups(groups, signal.SIGINT)
                interrupted.extend(groups)
                timer = threading.Timer(INTERRUPT_GRACE_S, lambda: _signal_groups(_job_groups() + groups, signal.SIGKILL))
                timer.daemon = True
                timer.start()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    forward.lpgemm_forwarder = True
    signal.signal(signal.SIGINT, forward)


def local_main() -> dict | None:
    """The identity of the main snakemake process that scheduled this job, if it runs on this host and
    the job is not a cluster job of its own (None otherwise: nothing here can watch it)."""
    raw = os.environ.get(MAIN_ENV)
    if not raw or not sys.platform.startswith("linux"):
        return None
    try:
        main = json.loads(raw)
        main["pid"], main["start"] = int(main["pid"]), int(main["start"])
    except (ValueError, KeyError, TypeError):
        return None
    # A job in a SLURM allocation other than the main's is a cluster job: its snakemake may well be gone
    # on purpose (a login-node session), and the SLURM executor plugin owns cancelling it (scancel ends
    # the whole allocation, every process in it). So only a job that the main process started here,
    # locally, is watched (a main run inside an allocation, with its local executor, included).
    if os.environ.get("SLURM_JOB_ID", "") != main.get("slurm_job", ""):
        return None
    here = _identity()
    if here is None or any(here[k] != main.get(k) for k in ("host", "boot", "pid_ns")):
        return None  # another host, a reboot, a container's own PID namespace: its PIDs mean nothing here
    return main


# whether this process already watches (a warm start's client falls back to running the job itself)
_watching: list[bool] = []


def _watch_main() -> None:
    """If the main snakemake process that scheduled this job runs on this host (and the job is not a
    cluster job), lead a process group of our own and stop it all when that process is gone; a job forked
    by the warm server (harness/warm.py) also stops when the client it stands in for is gone."""
    main = local_main()
    if main is None:
        return
    _watching.append(True)
    watched = [(main["pid"], main["start"], f"the snakemake process that scheduled this job (PID {main['pid']})")]
    if (client := _warm_client()) is not None:
        watched.append((client["pid"], client["start"], f"the job process that handed this job over (PID {client['pid']})"))
    pidfds = []
    for pid, _, _ in watched:
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):  # pidfd: Python 3.9+, Linux 5.3+
            pidfd = os.pidfd_open(pid)
        pidfds.append(pidfd)
    _become_group_leader()
    _reap_group_at_exit()
    # checked after opening the pidfds, so that each descriptor is known to refer to that very process
    for pid, start, what in watched:
        if not _alive(pid, start):
            _stop_job_tree(f"{what} is gone")
    threading.Thread(target=_watchdog, args=(watched, pidfds), name="lpgemm-watchdog", daemon=True).start()
    # PR_SET_PDEATHSIG is not used: it fires when the *thread* that started the job ends (here a worker
    # thread of snakemake's pool), only for the direct parent, and a signal it sends either kills just this
    # process (leaving nvcc behind) or runs a Python handler no sooner than this thread would.


# in the GPU worker (harness/warm.py): the client of the job it runs now, watched as a forked job watches its own
_current_client: list[dict] = []


def watch_for_worker() -> None:
    """The GPU worker's watch: the snakemake above it for its whole life, and each job's client while that job
    runs (``begin_job``); either gone, and the worker stops with all its subprocesses."""
    if not _watching:
        _watch_main()


def begin_job(client: dict) -> int:
    """In the GPU worker, before a job: watch its client, forget the last job's interrupt; returns the count
    of held descriptors that are the worker's own (``end_job`` closes the rest)."""
    _current_client[:] = [{"pid": int(client["pid"]), "start": int(client["start"])}]
    _interrupts.clear()
    return len(_held_fds)


def end_job(held: int) -> None:
    """In the GPU worker, after a job: release what the job held for its life (its lock), stop watching its client."""
    while len(_held_fds) > held:
        with contextlib.suppress(OSError):
            os.close(_held_fds.pop())
    _current_client.clear()


def _become_group_leader() -> None:
    """Our own process group, inherited by our subprocesses: one killpg reaches them all, and nothing
    outside the job. Off the terminal's foreground group, a read from it would stop us, so stdin goes."""
    with contextlib.suppress(OSError):  # EPERM: already a session (so a group) leader
        os.setpgid(0, 0)
    with contextlib.suppress(OSError):
        if os.isatty(0):
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)


# The sentinel: blocks on a pipe whose only writer is the job, so it wakes however the job ends (kill -9
# included), then kills the job's whole group. SIGINT (forwarded to the group) is not for it.
_SENTINEL = ("import os, signal, sys\n"
             "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "try:\n    os.read(int(sys.argv[1]), 1)\nexcept OSError:\n    pass\n"
             "try:\n    os.killpg(int(sys.argv[2]), signal.SIGKILL)\nexcept OSError:\n    pass\n")


def _reap_group_at_exit() -> None:
    """A job killed outright (kill -9, the OOM killer) leaves its subprocesses, nvcc and ptxas among them,
    running under init: they are in its process group, but nothing signals a group when its leader dies.
    A small sentinel process in the group outlives the job by a moment and kills what is left of it."""
    if os.getpgrp() != os.getpid():
        return  # not a group of our own: killing it would reach snakemake itself
    import subprocess

    read_end, write_end = os.pipe()  # both close-on-exec: no subprocess of the job holds the write end
    try:
        subprocess.Popen([sys.executable, "-S", "-c", _SENTINEL, str(read_end), str(os.getpid())],
                         pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    except OSError as e:
        print(f"lpgemm: warning: no sentinel for this job's subprocesses ({e})", file=sys.stderr)
        os.close(write_end)
    else:
        _held_fds.append(write_end)  # kept open for the life of this process
    finally:
        os.close(read_end)


def _alive(pid: int, start: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[3] == start and stat[0] not in ("Z", "X")


def _watchdog(watched: list[tuple[int, int, str]], pidfds: list[int | None]) -> None:
    poller = select.poll()
    for pidfd in pidfds:
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)  # readable once that process has exited
    # the poll wakes at once when a watched process exits; the check each second covers any without a pidfd
    while True:
        poller.poll(1000)
        for pid, start, what in watched:
            if not _alive(pid, start):
                _stop_job_tree(f"{what} is gone")
        for client in list(_current_client):  # the GPU worker's job of the moment
            if not _alive(client["pid"], client["start"]) and client in _current_client:
                _stop_job_tree(f"the job process that handed this job over (PID {client['pid']}) is gone")


def _stop_job_tree(reason: str) -> None:
    """Kill every process of this job, this one last, and never return."""
    with contextlib.suppress(OSError):
        os.write(2, f"lpgemm: {reason}; stopping this job and all its subprocesses\n".encode())
    me = os.getpid()
    with contextlib.suppress(OSError):
        # those that left our group too (a start_new_session child); not a warm server this process started: its
        # jobs stop on their own, each saying why in its log, and it ends with its snakemake
        for pid, _ in _descendants(me, tuple(_outside_the_job)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if os.getpgrp() == me:
        with contextlib.suppress(OSError):
            os.killpg(me, signal.SIGKILL)
    os._exit(1)


def _warm_client() -> dict | None:
    """In a job forked by the warm server: the identity ({"pid", "start"}) of the job process that snakemake
    started and that handed the job over (harness/warm.py, which imports this module: hence imported here)."""
    from harness.warm import CLIENT_ENV

    try:
        client = json.loads(os.environ[CLIENT_ENV])
        return {"pid": int(client["pid"]), "start": int(client["start"])}
    except (KeyError, ValueError, TypeError):
        return None


def job_started() -> float | None:
    """When this job's process started (Unix time): the process snakemake started, which for a warm start
    (harness/warm.py) is the client that handed the job over, not the child running it. None off Linux."""
    client = _warm_client()
    stat = _proc_stat(os.getpid() if client is None else client["pid"])
    try:
        boot = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return None if stat is None else boot + stat[3] / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the GPU, and records written again


@contextlib.contextmanager
def gpu_lock():
    """Hold an exclusive, node-local lock while using the GPU: no two GPU jobs of this pipeline overlap on
    one node, whoever scheduled them (two snakemake invocations, a local run beside a cluster job). It
    lives on the node (/tmp, or LPGEMM_GPU_LOCK), never on a shared filesystem, where a lock would
    serialise every node or protect nothing."""
    lock = Path(os.environ.get("LPGEMM_GPU_LOCK", "/tmp/lpgemm-gpu.lock"))
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def restore_missing(written: dict) -> list[str]:
    """At the end of a job that writes several records: write again any of them (path -> the object written)
    that is gone. One record deleted while the job ran would otherwise fail the job (MissingOutputException),
    and snakemake would then delete all its good siblings."""
    missing = [str(path) for path in written if not Path(str(path)).exists()]
    for path in missing:
        write_json(path, written[path])
        print(f"lpgemm: {path} was deleted while this job ran; written again", file=sys.stderr)
    return missing
