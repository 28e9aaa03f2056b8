"""Writing a file whole or not at all: every file the pipeline writes for others to read goes through
``atomic_path`` (JSON records: ``write_json``; input tensors: ``harness.inputs.save_operands``; the PTX
kept beside TileLang's cache: ``harness.compile``).

The bytes go to a temporary file beside the target, unique to its writer, which then replaces the target
(os.replace, atomic within one filesystem): a reader sees the old file or the new one, never a part, and
two writers of one file never share a temporary file. A writer killed mid-write leaves its temporary file
behind, named so that it can be told apart (``TEMP_FILE``): the next run removes it unless its writer
still lives (harness.jobs.remove_stale_temp_files).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

# the temporary file of a target "<name>": ".<name>.<its writer's PID>.<8 random>.tmp" (tempfile.mkstemp's
# random part); one without the PID, ".<name>.<8 random>.tmp", is an older writer's
TEMP_FILE = re.compile(r"^\..+?(?:\.(?P<pid>[0-9]+))?\.[a-z0-9_]{8}\.tmp$")


def _umask() -> int:
    """This process's umask, read from /proc where it can be (os.umask only reads it by setting it, which
    races with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(path: str | os.PathLike, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` (its folder made if missing) for the block to write in full (open
    it, copy to it, or name it as a tool's output file). When the block ends without an error the file
    gets the mode a plain ``open()`` would have given it (0666 less the umask), is synced to disk and
    replaces ``path``; when it raises (an interrupt included), the file is removed and ``path`` is as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; a plain open() would give this
        _fsync(tmp, os.O_WRONLY)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash once its folder is synced
        _fsync(path.parent, os.O_RDONLY)


def write_json(path: str | os.PathLike, obj) -> None:
    """``obj`` as JSON at ``path``, atomically (``atomic_path``): an interrupted job never leaves a
    half-written result behind, and concurrent writers never share a temporary file."""
    text = json.dumps(obj, indent=1, default=str)  # before any file exists: a failure here leaves nothing
    with atomic_path(path) as tmp:
        tmp.write_text(text)
