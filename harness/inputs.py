"""Deterministic input matrices and their storage with content hashes.

The matrices are bit-identical on every machine: each element is a pure function of a key (from
sha256 of the seed, distribution, shape and operand name) and its row-major index, computed with
integer arithmetic on uint64 (SplitMix64) and, for the floating-point part, only float64 +, -, *, /
and sqrt, which IEEE 754 rounds correctly (hence identically on every CPU, SIMD or not), plus exact
operations (comparisons, selects, frexp). No libm function (log, exp, erf: not correctly rounded,
so they differ between builds), no torch random generator, no float32 arithmetic: one float64 ->
float32 rounding at the end. The work is split into chunks run on a thread pool; the values do not
depend on the chunk size or the number of threads.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from harness.atomic import atomic_path
from harness.records import MANIFEST, MANIFEST_FORMAT, DamagedFile, read_json, recompute_command, shape_problem
from kernels.registry import Operands

# elements per task and worker threads: they change the speed, never a value. Per chunk each numpy call
# holds the GIL for a moment: 2^19 keeps 16 threads busy (2^16 was 4x slower there) and is near the best on 2
CHUNK = 1 << 19
THREADS = os.cpu_count() or 1

# ---------------------------------------------------------------- counter-based uniform variates

# SplitMix64 (Steele, Lea, Flood 2014): element i of a stream with key k is mix(k + (i + 1) * gamma);
# uint64 array arithmetic in numpy wraps modulo 2**64
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S12, _S27, _S30, _S31 = (np.uint64(s) for s in (12, 27, 30, 31))
_TWO_M52 = float.fromhex("0x1p-52")


def _stream_keys(streams: int, seed: int, dist: str, rows: int, cols: int, name: str) -> list[np.uint64]:
    # a stable per-(dist, shape, operand) key (Python's hash() is salted per process), one per stream
    base = hashlib.sha256(repr((seed, dist, rows, cols, name)).encode()).digest()
    return [np.uint64(int.from_bytes(hashlib.sha256(base + s.to_bytes(4, "little")).digest()[:8], "little"))
            for s in range(streams)]


def _bits(key: np.uint64, lo: int, hi: int) -> np.ndarray:
    """64 random bits for each element index in [lo, hi) of the stream ``key``."""
    z = np.arange(lo + 1, hi + 1, dtype=np.uint64)
    z *= _GAMMA
    z += key
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


def _uniform(bits: np.ndarray) -> np.ndarray:
    """Uniform on the open interval (0, 1): (top 52 bits + 1/2) * 2**-52, exact in float64."""
    u = (bits >> _S12).view(np.int64).astype(np.float64)  # < 2**52: exact
    u += 0.5
    u *= _TWO_M52
    return u


# ---------------------------------------------------------------- float64 functions from + - * / sqrt

def _horner(coeffs: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    """c[0] x^n + ... + c[n] (highest power first), one rounded multiply and add per step."""
    acc = x * coeffs[0]
    acc += coeffs[1]
    for c in coeffs[2:]:
        acc *= x
        acc += c
    return acc


_LN2 = 0.6931471805599453  # the float64 nearest ln 2
_SQRT_HALF = 0.7071067811865476
# 2 atanh(s) = 2 s (1 + s^2/3 + s^4/5 + ...); |s| <= 0.1716 so the term in s^22 is below 1e-18
_ATANH = tuple(1.0 / (2 * k + 1) for k in reversed(range(11)))


def _ln(x: np.ndarray) -> np.ndarray:
    """Natural log of positive normal float64 values, relative error a few 1e-16."""
    m, e = np.frexp(x)  # x = m 2^e exactly, m in [0.5, 1)
    low = m < _SQRT_HALF
    m = np.where(low, m + m, m)  # now in [sqrt(1/2), sqrt(2))
    e = (e - low).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)  # ln m = 2 atanh(s)
    out = _horner(_ATANH, s * s)
    out *= s + s
    e *= _LN2
    out += e
    return out


# Wichura, "The percentage points of the normal distribution", Algorithm AS 241 (PPND16),
# Applied Statistics 37 (1988) 477-484: relative accuracy about 1e-16 for min(p, 1-p) > 1e-300.
_A = (2.5090809287301226727e3, 3.3430575583588128105e4, 6.7265770927008700853e4, 4.5921953931549871457e4,
      1.3731693765509461125e4, 1.9715909503065514427e3, 1.3314166789178437745e2, 3.3871328727963666080e0)
_B = (5.2264952788528545610e3, 2.8729085735721942674e4, 3.9307895800092710610e4, 2.1213794301586595867e4,
      5.3941960214247511077e3, 6.8718700749205790830e2, 4.2313330701600911252e1, 1.0)
_C = (7.74545014278341407640e-4, 2.27238449892691845833e-2, 2.41780725177450611770e-1, 1.27045825245236838258e0,
      3.64784832476320460504e0, 5.76949722146069140550e0, 4.63033784615654529590e0, 1.42343711074968357734e0)
_D = (1.05075007164441684324e-9, 5.47593808499534494600e-4, 1.51986665636164571966e-2, 1.48103976427480074590e-1,
      6.89767334985100004550e-1, 1.67638483018380384940e0, 2.05319162663775882187e0, 1.0)
_E = (2.01033439929228813265e-7, 2.71155556874348757815e-5, 1.24266094738807843860e-3, 2.65321895265761230930e-2,
      2.96560571828504891230e-1, 1.78482653991729133580e0, 5.46378491116411436990e0, 6.65790464350110377720e0)
_F = (2.04426310338993978564e-15, 1.42151175831644588870e-7, 1.84631831751005468180e-5, 7.86869131145613259100e-4,
      1.48753612908506148525e-2, 1.36929880922735805310e-1, 5.99832206555887937690e-1, 1.0)


def normal_quantile(p: np.ndarray) -> np.ndarray:
    """The N(0,1) inverse CDF of float64 ``p`` in the open interval (0, 1), bit-reproducible."""
    p = np.asarray(p, dtype=np.float64)
    q = p - 0.5
    r = 0.180625 - q * q
    z = _horner(_A, r)
    z *= q
    z /= _horner(_B, r)
    (tail,) = np.nonzero(np.abs(q) > 0.425)
    if tail.size:
        pt, neg = p[tail], q[tail] < 0.0
        s = np.sqrt(-_ln(np.where(neg, pt, 1.0 - pt)))  # 1 - pt is exact here
        t = s - 1.6
        zt = _horner(_C, t)
        zt /= _horner(_D, t)
        (far,) = np.nonzero(s > 5.0)  # min(p, 1-p) < 1.4e-11
        if far.size:
            t = s[far] - 5.0
            zt[far] = _horner(_E, t) / _horner(_F, t)
        z[tail] = np.where(neg, -zt, zt)
    return z


# ---------------------------------------------------------------- distributions

class Distribution(NamedTuple):
    streams: int  # independent variates per element
    sample: Callable[[list[np.uint64], int, int], np.ndarray]  # (stream keys, lo, hi) -> float64 [hi - lo]


def _normal(keys: list[np.uint64], lo: int, hi: int) -> np.ndarray:
    return normal_quantile(_uniform(_bits(keys[0], lo, hi)))


def _student_t3(keys: list[np.uint64], lo: int, hi: int) -> np.ndarray:
    # Student's t with 3 degrees of freedom: Z0 / sqrt((Z1^2 + Z2^2 + Z3^2) / 3); heavy tails stress
    # per-tensor scales. |Z0| >= 2.8e-16 and the root <= 8.3, so no float32 subnormal (no FTZ effect).
    chi2 = None
    for key in keys[1:]:
        z = _normal([key], lo, hi)
        z *= z
        chi2 = z if chi2 is None else np.add(chi2, z, out=chi2)
    chi2 /= 3.0
    out = _normal(keys[:1], lo, hi)
    out /= np.sqrt(chi2, out=chi2)
    return out


DISTRIBUTIONS = {"normal": Distribution(1, _normal), "student_t3": Distribution(4, _student_t3)}


def make_matrix(dist: str, rows: int, cols: int, seed: int, name: str, threads: int = THREADS) -> torch.Tensor:
    """A (rows, cols) float32 matrix drawn from ``dist``, a pure function of its arguments but ``threads``
    (how many work on it, which changes no value), on any machine."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
    d = DISTRIBUTIONS[dist]
    keys = _stream_keys(d.streams, seed, dist, rows, cols, name)
    n, chunk = rows * cols, CHUNK
    out = np.empty(n, dtype=np.float32)

    def fill(lo: int) -> None:
        hi = min(lo + chunk, n)
        np.copyto(out[lo:hi], d.sample(keys, lo, hi), casting="same_kind")  # round to nearest float32

    starts = range(0, n, chunk)
    workers = max(1, min(threads, len(starts)))
    if workers == 1:
        for lo in starts:
            fill(lo)
    else:
        with ThreadPoolExecutor(workers) as pool:
            for _ in pool.map(fill, starts):  # re-raises a worker's exception
                pass
    return torch.from_numpy(out).reshape(rows, cols)


def make_operands(dist: str, M: int, N: int, K: int, seed: int, threads: int = THREADS) -> tuple[torch.Tensor, torch.Tensor]:
    """Unquantized A (M,K) and B (N,K); B does not depend on M, so one weight serves many M."""
    return make_matrix(dist, M, K, seed, f"A{M}", threads), make_matrix(dist, N, K, seed, "B", threads)


# ---------------------------------------------------------------- hashes and storage

def tensor_sha256(t: torch.Tensor) -> str:
    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.sha256(data.numpy()).hexdigest()  # hashes the buffer in place, no copy


def manifest(ops: Operands) -> dict:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."), "sha256": tensor_sha256(v)}
            for k, v in ops.items()}


def file_sha256(path: str | os.PathLike, block: int = 1 << 22) -> str:
    """sha256 of a file's bytes, read in blocks (record it next to a manifest; see load_operands)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(block):
            h.update(data)
    return h.hexdigest()


# A file's sha256 is computed once on a host, when it is written, and kept on the file itself as an extended
# attribute with the size and modification time it had then and the sha256 of a sample of its bytes: a later
# reader whose file still has that size and time takes the recorded hash instead of reading gigabytes again.
# Snakemake touches every output when its job ends (dag.check_and_touch_output), so the time recorded at
# writing is stale before anyone reads the file. A touch sets the access and modification times to one same
# instant, where writing moves the modification time alone; a file of the recorded size whose two times are
# equal, not older than the recorded one, and whose sample is unchanged was touched, and its record is renewed
# (the sample catches a read and a write within one tick of the file clock, which look like a touch). Replacing
# the file (a rebuild writes a new one) or writing to it makes the next reader hash it whole, a copy does not
# carry the attribute, and where the filesystem keeps no attributes every read hashes the file, as before.
_VERIFIED_XATTR = "user.lpgemm.sha256"
_SAMPLE_BLOCKS, _SAMPLE_BLOCK = 16, 1 << 16


def _sample_sha256(path: str | os.PathLike, size: int) -> str:
    """sha256 of 16 blocks of 64 KiB spread evenly over the file, first and last included (all of a smaller one)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _SAMPLE_BLOCKS * _SAMPLE_BLOCK:
            h.update(f.read())
        else:
            step = (size - _SAMPLE_BLOCK) / (_SAMPLE_BLOCKS - 1)
            for i in range(_SAMPLE_BLOCKS):
                f.seek(round(i * step))
                h.update(f.read(_SAMPLE_BLOCK))
    return h.hexdigest()


def _set_record(path: str | os.PathLike, sha: str, st: os.stat_result, sample: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setxattr(path, _VERIFIED_XATTR, f"{sha} {st.st_size} {st.st_mtime_ns} {sample}".encode())


def remember_sha256(path: str | os.PathLike, sha: str) -> None:
    """Record on ``path`` that its bytes, as they are now, hash to ``sha`` (skipped where not supported)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        _set_record(path, sha, st, _sample_sha256(path, st.st_size))


def _record_holds(path: str | os.PathLike) -> tuple[str, bool] | None:
    """(the sha256 recorded on ``path``, whether its bytes are still those hashed then), None where nothing is
    recorded; a touched file's record is renewed (see above)."""
    try:
        sha, size, mtime_ns, *sample = os.getxattr(path, _VERIFIED_XATTR).decode().split(" ")
        st = os.stat(path)  # before the sample is read, which may move the access time
        if st.st_size != int(size):
            return sha, False
        if st.st_mtime_ns == int(mtime_ns):
            return sha, True
        touched = (len(sample) == 1 and st.st_atime_ns == st.st_mtime_ns >= int(mtime_ns)
                   and _sample_sha256(path, st.st_size) == sample[0])
    except (OSError, AttributeError, ValueError):
        return None
    if touched:
        _set_record(path, sha, st, sample[0])
    return sha, touched


def recorded_sha256(path: str | os.PathLike) -> str | None:
    """The sha256 recorded on ``path`` while its bytes are still those hashed then (see above), else None."""
    held = _record_holds(path)
    return held[0] if held is not None and held[1] else None


def changed_since_hashed(path: str | os.PathLike) -> bool:
    """Whether ``path`` was hashed on this host and has changed since (False where it never was, or is gone)."""
    held = _record_holds(path)
    return held is not None and not held[1]


def verified_file_sha256(path: str | os.PathLike) -> str:
    """``file_sha256``, read from the file's record when it still holds, else computed and recorded."""
    if (sha := recorded_sha256(path)) is None:
        sha = file_sha256(path)
        remember_sha256(path, sha)
    return sha


class CorruptInput(DamagedFile):
    """An input file that is missing, unreadable or not the one recorded; the message names the file,
    says what is wrong and how to rebuild it (a DamagedFile: harness/records.py)."""


def _rebuild(path: str | os.PathLike) -> str:
    return f"rebuild it with: {recompute_command(path)}"


def _corrupt(path: Path, what: str) -> CorruptInput:
    return CorruptInput(path, what, _rebuild(path))


def _compact(t: torch.Tensor) -> torch.Tensor:
    # torch.save writes a tensor's whole storage: copy views so a file holds only its tensors
    t = t.detach().cpu().contiguous()
    if t.storage_offset() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def save_operands(ops: Operands, path: str | os.PathLike) -> dict:
    """Write tensors to ``path`` atomically (harness/atomic.py: a reader sees the old file or the new one,
    never a part); returns the manifest of shapes, dtypes, sha256."""
    tensors = {k: _compact(v) for k, v in ops.items()}
    # through a file object: saved by name, torch would name the archive inside after the temporary file
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(tensors, f)
    return manifest(tensors)


def _first_line(e: BaseException) -> str:
    # the first line of torch's message, except that a damaged pickle shows up as a "Weights only load
    # failed ... re-run with weights_only=False" essay whose one telling line names the garbled global
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", s).strip() for s in str(e).splitlines()]
    lines = [s for s in lines if s]
    line = next((s for s in lines if s.startswith("WeightsUnpickler error:")), lines[0] if lines else "")
    return f"{type(e).__name__}: {line}"[:300].rstrip(": ")


def load_operands(path: str | os.PathLike, expected: dict | None = None,
                  expected_file_sha256: str | None = None) -> Operands:
    """Load tensors saved by save_operands. With ``expected_file_sha256`` (file_sha256 at build time) verify
    the file's bytes, else with ``expected`` (a manifest) every tensor's sha256, so a run proves its inputs;
    with ``expected`` the tensors it names must be there.
    Raises CorruptInput for a missing, damaged or mismatching file. Zip-format files are memory-mapped."""
    path = Path(path)
    if not path.is_file():
        raise _corrupt(path, "input file is missing")
    if expected_file_sha256 is not None:
        got = verified_file_sha256(path)
        if got != expected_file_sha256:
            raise _corrupt(path, f"file sha256 {got} does not match the recorded {expected_file_sha256} "
                                 "(damaged or replaced since it was written)")
    try:
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"  # torch.load can mmap only the zip format
        ops = torch.load(path, weights_only=True, mmap=zipped)
    except Exception as e:  # a damaged zip can fail anywhere, often with a misleading weights_only message
        raise _corrupt(path, f"unreadable: {_first_line(e)}") from e
    if not isinstance(ops, dict) or not all(isinstance(v, torch.Tensor) for v in ops.values()):
        raise _corrupt(path, f"unreadable: holds a {type(ops).__name__}, not a dict of tensors")
    if expected is not None:
        missing = [k for k in expected if k not in ops]
        if missing:
            raise _corrupt(path, f"tensors {missing} are missing")
        # a file whose bytes matched holds exactly the tensors hashed when it was written: hashing them
        # again would read a gigabyte-sized input twice for nothing
        if expected_file_sha256 is None:
            got = manifest(ops)
            bad = [k for k in expected if got[k]["sha256"] != expected[k]["sha256"]]
            if bad:
                raise _corrupt(path, f"tensors {bad} do not match their recorded sha256")
    return ops


def read_manifest(path: str | os.PathLike) -> dict:
    """An input set's manifest, checked for the entries every run reads, or CorruptInput naming it."""
    return read_json(path, MANIFEST, fix=f"rebuild the input set: {recompute_command(path)}", error=CorruptInput)


def load_point(fp32: str | os.PathLike, fmt_file: str | os.PathLike, manifest_file: str | os.PathLike,
               fmt_name: str) -> tuple[Operands, Operands, dict[str, str]]:
    """One shape's inputs, each file verified against its manifest: the unquantized A and B, the operands
    of format ``fmt_name``, and those operands' sha256 (recorded with every result)."""
    m = read_manifest(manifest_file)
    raw = load_operands(Path(fp32), m["fp32"]["tensors"], m["fp32"]["file_sha256"])
    return raw, *load_format(fmt_file, m, fmt_name, manifest_file)


def format_entry(manifest: dict, fmt_name: str, manifest_file: str | os.PathLike = "manifest.json") -> dict:
    """The manifest's entry of format ``fmt_name``, or CorruptInput naming the manifest, the missing or
    malformed entry and the command that rebuilds the input set (which writes every format it needs)."""
    fix = f"rebuild the input set: {recompute_command(manifest_file)}"
    formats = manifest.get("formats")
    if not isinstance(formats, dict) or fmt_name not in formats:
        have = ", ".join(sorted(formats)) if isinstance(formats, dict) and formats else "none"
        raise CorruptInput(manifest_file, f"no entry formats.{fmt_name} (it has: {have})", fix)
    if (p := shape_problem(formats[fmt_name], MANIFEST_FORMAT, f"formats.{fmt_name}")) is not None:
        raise CorruptInput(manifest_file, f"wrong shape: {p}", fix)
    return formats[fmt_name]


def load_format(fmt_file: str | os.PathLike, manifest: str | os.PathLike | dict,
                fmt_name: str, manifest_file: str | os.PathLike | None = None) -> tuple[Operands, dict[str, str]]:
    """The operands of format ``fmt_name`` alone, verified against the manifest (a path, or one already
    read: then ``manifest_file`` names it in errors), and their sha256: what needs no unquantized A and B
    (a peer, a profile) loads only this."""
    if isinstance(manifest, dict):
        m, where = manifest, manifest_file if manifest_file is not None else Path(fmt_file).parent.parent / "manifest.json"
    else:
        m, where = read_manifest(manifest), manifest
    fmt = format_entry(m, fmt_name, where)
    ops = load_operands(Path(fmt_file), fmt["tensors"], fmt["file_sha256"])
    return ops, {k: v["sha256"] for k, v in fmt["tensors"].items()}
