"""Warm job starts: a job's process forked from one that has already imported torch, TileLang and the kernels.

Every workflow job is a new Python process, and on a GPU host most of a short job is its start: importing
torch and TileLang and registering the kernels took 12 s per process on the H200 host, against a few
seconds of timing in a run job, and ~60 run jobs run one after another there. So the first job of a
snakemake invocation on a host starts a *warm server* for it: a process that imports all of that once (and
never touches the GPU), then forks a child per job. A job's script, at ``harness.jobs.setup``, hands itself
to the server (``handoff``): the server forks, and the child runs the very script the job was started with,
from its first line, with the job's working directory, environment, arguments and standard streams
(passed over the socket). The child is a new process with a fresh CUDA context, so what a job measures is
measured as before; only the imports are shared. The job's own process (the *client*) stays, waiting: it is
what snakemake started and waits for, it forwards an interrupt or a termination to the child, and it exits
with the child's status. The child watches the client as every job watches the main snakemake process
(``harness.jobs``): kill the client, or the snakemake above it, and the child stops.

GPU jobs go further: the server keeps one long-lived child for them, the *GPU worker*, which runs them one
after another in its own process (with each job's directory, environment, arguments and streams, as a forked
child would). Its CUDA context, cuBLAS handles and profiler (CUPTI) are then set up once rather than once per
job: a process's first profiled timing took ~5.5 s on the H200 host, against 15 s for a whole average run job.
What a job times, and how, is the same code in either process. A job that fails or is interrupted takes the
worker down with it (the next GPU job gets a fresh one), and a GPU job that arrives while the worker is busy
(a second GPU slot) is forked as any job is. ``LPGEMM_GPU_WORKER=0`` forks every GPU job as well.

A server belongs to one main snakemake process and one set of start-up conditions (the interpreter, this
checkout, TileLang's cache folder, the environment): it exits when that snakemake is gone. Where there is
no local main snakemake to belong to (a cluster job on its node, a script started by hand) or
``LPGEMM_WARM=0``, or the server cannot start, a job starts cold, as before, saying why in its log.
"""
from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.atomic import write_json
from harness.jobs import _alive, _proc_stat, outside_the_job

# "0" turns warm starts off (every job imports everything itself)
WARM_ENV = "LPGEMM_WARM"
# "0": GPU jobs are forked per job like the others (no GPU worker)
GPU_WORKER_ENV = "LPGEMM_GPU_WORKER"
# set in a forked job: the identity ({"pid", "start"}) of the client process it stands in for
CLIENT_ENV = "LPGEMM_WARM_CLIENT"
# what the server imports once; each is what some job would import anyway (nothing here touches the GPU)
# in stages: where importing a stage leaves a forked child unable to use the GPU (something in it initialised the
# CUDA driver), the server stops before it and the jobs import the rest themselves ("kernels.registry" stands
# for registering every kernel: load_all)
PRELOAD = (("numpy", "torch", "pandas", "snakemake.script", "snakemake.iocontainers"),
           ("tilelang",),
           ("harness.compile", "harness.inputs", "harness.metrics", "harness.records", "harness.stats",
            "harness.tables", "harness.device", "kernels.registry"),
           ("harness.power", "harness.bench", "harness.runner", "harness.ceilings"))
# how long a client waits for a new server to import everything before starting cold
START_TIMEOUT_S = 180.0
# a server with no job and no connection for this long exits even if its snakemake lives on
IDLE_EXIT_S = 1800.0
# variables that differ from job to job and that nothing reads at import: not part of a server's key
PER_JOB_ENV = ("TMPDIR", "TMP", "TEMP", CLIENT_ENV)


class WarmUnavailable(RuntimeError):
    """No warm server for this job (the reason is printed; the job then starts cold)."""


def server_key(main: dict, cache_dir: str, environ: dict) -> str:
    """One server per main snakemake, interpreter, checkout, TileLang cache folder and environment (the
    thread-count variables snakemake sets per rule included: torch and OpenBLAS read them at import)."""
    env = {k: v for k, v in environ.items() if k not in PER_JOB_ENV}
    ident = [main.get(k) for k in ("host", "boot", "pid_ns", "pid", "start")]
    blob = json.dumps([ident, sys.executable, str(Path.cwd().resolve()), cache_dir, sorted(env.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def socket_path(key: str) -> Path:
    # node-local and short (a Unix socket's path is limited to 107 bytes)
    return Path(os.environ.get("LPGEMM_WARM_DIR", "/tmp")) / f"lpgemm-warm-{key}.sock"


# ---------------------------------------------------------------- the client: a job handing itself over


def handoff(snakemake, main: dict, cache_dir: str, forked_cost: str | None = None) -> None:
    """Run this job in a child of the warm server and exit with its status; raise WarmUnavailable (to start
    cold) where that cannot be done. ``main``: the local main snakemake's identity (harness.jobs.local_main);
    ``forked_cost``: where to write the child's peak memory and CPU time (harness.jobs.forked_cost_of)."""
    script = getattr(sys.modules["__main__"], "__real_file__", None)  # snakemake's copy of the script
    if script is None or not os.path.exists(script):
        raise WarmUnavailable("no script file to hand over")
    key = server_key(main, cache_dir, dict(os.environ))
    conn = _connect(key) or _start_server(key, main, cache_dir)
    me = {"pid": os.getpid(), "start": _proc_stat(os.getpid())[3]}  # what the child watches
    request = json.dumps({"script": os.path.abspath(script), "argv": sys.argv, "cwd": os.getcwd(),
                          "env": dict(os.environ), "client": me, "gpu": _uses_gpu(snakemake)}).encode()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        reply = conn.recv(4096)
    except OSError as e:
        raise WarmUnavailable(f"the warm server did not take the job ({e})") from None
    if not reply.startswith(b"pid "):
        raise WarmUnavailable(f"the warm server refused the job: {reply.decode(errors='replace')}")
    child = int(reply.split()[1])
    _forward_signals(child)
    status, usage = _wait_status(conn)
    if forked_cost is not None and usage is not None:
        with contextlib.suppress(OSError):
            write_json(forked_cost, usage)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _uses_gpu(snakemake) -> bool:
    """Whether the job holds a GPU (its rule's ``gpu`` resource): what the GPU worker runs."""
    try:
        return int(snakemake.resources.get("gpu", 0) or 0) > 0
    except (AttributeError, TypeError, ValueError):
        return False


def _connect(key: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(socket_path(key)))
    except OSError:
        conn.close()
        return None
    return conn


def _start_server(key: str, main: dict, cache_dir: str) -> socket.socket:
    """Start the server (one job at a time, under a lock: the others then find it) and connect to it."""
    path = socket_path(key)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (conn := _connect(key)) is not None:  # another job started it while this one waited
            return conn
        if path.with_suffix(".failed").exists():  # this run's server could not start: no job waits for it again
            raise WarmUnavailable(path.with_suffix(".failed").read_text().strip())
        log_dir = Path(".snakemake") / "lpgemm-warm"
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{key}.log"
        with open(log, "ab") as out, open(os.devnull, "rb") as null:
            # its own session: no job's process group, interrupt or killpg reaches it; it ends with its snakemake
            # this checkout's harness first on its path, as checkout_first puts it for a job
            boot = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
                    "from harness.warm import main; main()")
            proc = subprocess.Popen([sys.executable, "-c", boot, str(path), str(main["pid"]), str(main["start"]),
                                     cache_dir], stdin=null, stdout=out, stderr=out, start_new_session=True,
                                    cwd=os.getcwd())
        outside_the_job(proc.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if (conn := _connect(key)) is not None:
                return conn
            if proc.poll() is not None:
                why = f"the warm server exited at start with status {proc.returncode} (log: {log})"
                break
            time.sleep(0.05)
        else:
            proc.kill()
            why = f"the warm server did not start within {START_TIMEOUT_S:.0f} s (log: {log})"
        path.with_suffix(".failed").write_text(why + "\n")
        raise WarmUnavailable(why)


def _forward_signals(child: int) -> None:
    """An interrupt or termination of this client goes on to the child's process group (the child leads
    one, its subprocesses in it), which stops as a cold job would; this client then exits with its status."""
    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)


def _wait_status(conn: socket.socket) -> tuple[int, dict | None]:
    """The child's exit status, and its peak memory (MB) and CPU seconds (its subprocesses' included)."""
    while True:
        try:
            msg = conn.recv(4096)
        except InterruptedError:
            continue
        except OSError as e:
            print(f"lpgemm: the warm server was lost while running this job ({e})", file=sys.stderr)
            return 1, None
        if msg.startswith(b"exit "):
            _, code, max_rss_mb, cpu_s = msg.decode().split()
            return int(code), {"max_rss_mb": float(max_rss_mb), "cpu_s": float(cpu_s)}
        print("lpgemm: the warm server was lost while running this job", file=sys.stderr)
        return 1, None


# ---------------------------------------------------------------- the server


def _import_stage(stage: tuple[str, ...]) -> None:
    import importlib

    for name in stage:
        importlib.import_module(name)
        if name == "kernels.registry":
            importlib.import_module(name).load_all()


def _in_a_child(test) -> bool:
    """Whether ``test`` returns True in a forked child (an exception, printed to the server's log, is False)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = bool(test())
        except BaseException:  # noqa: BLE001 (the reason goes to the server's log)
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(0 if ok else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _child_uses_gpu() -> bool:
    """Whether a child forked now can use the GPU, as a job would (True too where there is none): something
    imported may have initialised the CUDA driver in this process, which a forked child cannot then use."""
    def use_gpu():
        import torch

        if torch.cuda.is_available():
            torch.ones(1, device="cuda").sum().item()
        return True

    return _in_a_child(use_gpu)


def _stage_keeps_children_on_gpu(stage: tuple[str, ...]) -> bool:
    """Whether a process that imports ``stage`` (on top of what this one has) can still fork a child that uses
    the GPU: tried in a child of its own, so that this process never imports a stage that would break it."""
    return _in_a_child(lambda: _import_stage(stage) or _child_uses_gpu())


def serve(path: Path, main_pid: int, main_start: int, cache_dir: str) -> None:
    os.environ["TILELANG_CACHE_DIR"] = cache_dir  # read by TileLang at import, as harness.jobs.setup sets it
    # TileLang asks torch.cuda.is_available() at import; answered by the CUDA runtime it initialises the driver,
    # and torch then refuses CUDA in every forked child ("Cannot re-initialize CUDA in forked subprocess", seen on
    # the H200 host). Answered through NVML, as torch offers for this case, it leaves the driver alone.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    t0 = time.monotonic()
    gpu_here = os.path.exists("/dev/nvidiactl")  # only then can an import spoil a child's GPU
    loaded = []
    for stage in PRELOAD:
        if gpu_here and not _stage_keeps_children_on_gpu(stage):
            print(f"lpgemm warm server {os.getpid()}: after importing {', '.join(stage)} a forked child could not "
                  f"use the GPU; the jobs import it and what follows themselves", flush=True)
            break
        _import_stage(stage)
        loaded += stage
    import torch

    if torch.cuda.is_initialized():  # a forked child could not use the GPU
        raise SystemExit("lpgemm warm server: CUDA was initialised while importing; not serving")
    print(f"lpgemm warm server {os.getpid()}: imported {', '.join(loaded) or 'nothing'} in "
          f"{time.monotonic() - t0:.1f} s; serving {path}", flush=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    worker = GpuWorker(enabled=os.environ.get(GPU_WORKER_ENV, "1") != "0")
    idle_since = time.monotonic()
    try:
        while _alive(main_pid, main_start):
            ready, _, _ = select.select([listener, *worker.sockets()], [], [], 0.2)
            if listener in ready:
                conn, _ = listener.accept()
                if (job := _receive(conn)) is None:
                    conn.close()
                elif not (job[0].get("gpu") and worker.run(*job, conn, [listener, conn, *children.values()])):
                    children[_fork_job(*job, conn, [listener, *children.values(), *worker.sockets()])] = conn
            if worker.sockets() and worker.sockets()[0] in ready:
                worker.reply()
            _reap(children, worker)
            if children or ready or worker.busy():
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT_S:
                break
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    print(f"lpgemm warm server {os.getpid()}: its snakemake is gone or it was idle; exiting", flush=True)


def _exit_message(status: int, usage) -> bytes:
    """What a client waits for: the job's exit status (a signal's as 128 + its number), peak memory (MB) and
    CPU seconds. ``status``: os.wait's; ``usage``: (ru_maxrss KiB, CPU s)."""
    code = os.waitstatus_to_exitcode(status)
    return f"exit {code if code >= 0 else 128 - code} {usage[0] / 1024:.1f} {usage[1]:.3f}".encode()


def _reap(children: dict[int, socket.socket], worker: GpuWorker) -> None:
    while children or worker.pid is not None:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == worker.pid:
            worker.ended(status, usage)
            continue
        conn = children.pop(pid, None)
        if conn is None:
            continue
        # ru_maxrss is in KiB on Linux; both include what the child waited for (nvcc, ptxas)
        with contextlib.suppress(OSError):
            conn.send(_exit_message(status, (usage.ru_maxrss, usage.ru_utime + usage.ru_stime)))
        conn.close()


def _receive(conn: socket.socket) -> tuple[dict, list[int]] | None:
    """A client's request and its three standard streams; None (the client told why) if malformed."""
    try:
        data, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * array.array("i").itemsize))
        fds = array.array("i")
        for level, kind, blob in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
        request = json.loads(data)
        if len(fds) != 3:
            raise ValueError(f"expected 3 standard streams, got {len(fds)}")
    except (OSError, ValueError) as e:
        with contextlib.suppress(OSError):
            conn.send(f"bad request: {e}".encode())
        return None
    return request, list(fds)


def _fork_job(request: dict, fds: list[int], conn: socket.socket, inherited: list[socket.socket]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the job
        code = 1
        try:
            os.setpgid(0, 0)  # before anything: the client forwards signals to this group
            for s in inherited:
                s.close()
            code = _run_job(request, fds, at_exit=True)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.send(f"pid {pid}".encode())
    return pid


class GpuWorker:
    """The server's side of its GPU worker: a child forked at the first GPU job, which then runs every GPU job
    handed to it, one at a time, in its own process (``_serve_gpu_jobs``); the client of the job it runs waits
    on ``conn`` as it would for a forked child. A job that fails, or any end of the worker, starts a new one
    at the next GPU job."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.pid: int | None = None
        self.sock: socket.socket | None = None  # the server's end of the pair
        self.conn: socket.socket | None = None  # the client of the job running now

    def sockets(self) -> list[socket.socket]:
        return [self.sock] if self.sock is not None else []

    def busy(self) -> bool:
        return self.conn is not None

    def run(self, request: dict, fds: list[int], conn: socket.socket, inherited: list[socket.socket]) -> bool:
        """Hand the job to the worker (started if need be); False if it cannot take it now (busy, off, or
        lost on the way): then it is forked as any job is."""
        if not self.enabled or self.busy():
            return False
        if self.sock is None:
            if self.pid is not None:  # a worker lost on the way, not yet reaped
                return False
            self._start(inherited)
        try:
            self.sock.sendmsg([json.dumps(request).encode()],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as e:
            print(f"lpgemm warm server: the GPU worker did not take a job ({e}); forking it instead", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # reaped as any end of it (ended)
            self._close()
            return False
        for fd in fds:
            os.close(fd)
        conn.send(f"pid {self.pid}".encode())
        self.conn = conn
        return True

    def _start(self, inherited: list[socket.socket]) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)  # the group its clients forward signals to
                for s in (*inherited, mine):
                    s.close()
                _serve_gpu_jobs(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.sock = pid, mine
        print(f"lpgemm warm server: GPU worker {pid} started", flush=True)

    def reply(self) -> None:
        """The worker's word on the job it ran (``exit ...``), passed on to that job's client."""
        try:
            msg = self.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            msg = b""
        if msg.startswith(b"exit ") and self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send(msg)
            self.conn.close()
            self.conn = None

    def ended(self, status: int, usage) -> None:
        """The worker process ended: its last word first, else its own exit status stands for the job's."""
        if self.conn is not None:
            self.sock.setblocking(False)
            self.reply()
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send(_exit_message(status, (usage.ru_maxrss, usage.ru_utime + usage.ru_stime)))
            self.conn.close()
            self.conn = None
        self._close()
        self.pid = None

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None


def _serve_gpu_jobs(sock: socket.socket) -> None:
    """The GPU worker: each job handed over runs here in turn, as a forked child would run it, and its exit
    status, peak memory and CPU time go back; after a failed or interrupted job, or once the server is gone
    (the socket closes), the worker exits. Never returns."""
    from harness import jobs

    own_env, own_cwd = dict(os.environ), os.getcwd()
    own_streams = [os.dup(fd) for fd in (0, 1, 2)]
    jobs.watch_for_worker()  # the snakemake above it; each job's client too, while its job runs
    try:
        while True:
            job = _receive(sock)
            if job is None:
                return
            request, fds = job
            _reset_peak_memory()
            before = _cpu_seconds()
            held = jobs.begin_job(request["client"])
            try:
                code = _run_job(request, fds, at_exit=False)
            finally:  # back to the worker's own streams, directory and environment, holding nothing of the job's
                jobs.end_job(held)
                for target, fd in enumerate(own_streams):
                    os.dup2(fd, target)
                os.chdir(own_cwd)
                os.environ.clear()
                os.environ.update(own_env)
                healthy = _release_gpu_memory()
            sock.send(f"exit {code} {_peak_memory_mb():.1f} {_cpu_seconds() - before:.3f}".encode())
            if code != 0 or jobs.interrupted() or not healthy:
                return
    except (OSError, KeyboardInterrupt):  # the server is gone, or an interrupt between jobs
        return
    finally:
        with contextlib.suppress(Exception):
            import atexit

            atexit._run_exitfuncs()
        os._exit(0)


def _cpu_seconds() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _reset_peak_memory() -> None:
    """Linux: the process's peak resident size (VmHWM) starts again from its current size (proc(5), clear_refs)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_memory_mb() -> float:
    with contextlib.suppress(OSError, StopIteration, ValueError):
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    return 0.0


def _release_gpu_memory() -> bool:
    """What the job left cached in torch's allocator goes back to the GPU, as it would with its process; False
    if the CUDA context is no longer usable (a kernel's fault is sticky: a job that kept going after one, with
    failed rows, leaves a context in which every later job would fail), and the worker then ends."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return bool(torch.ones(1, device="cuda").sum().item() == 1)
    except Exception as e:  # noqa: BLE001 (any failure here means the same)
        print(f"lpgemm GPU worker: the CUDA context is unusable after a job ({e}); the worker ends", flush=True)
        return False


def _run_job(request: dict, fds: list[int], at_exit: bool) -> int:
    """Become the job (its streams, directory, environment and arguments), run its script from the top, and
    return its exit status as its process would have it. ``at_exit``: the process ends with the job, so its
    exit handlers run now (in the GPU worker they run when the worker ends)."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[CLIENT_ENV] = json.dumps(request["client"])
        sys.argv = list(request["argv"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the job's
        import runpy

        runpy.run_path(request["script"], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (the job's own error, reported as an uncaught one would be)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        if at_exit:
            with contextlib.suppress(Exception):
                import atexit

                atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return code


def main() -> None:
    serve(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
