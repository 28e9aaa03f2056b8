"""What ptxas really emitted: the cubin of a compiled TileLang kernel, its SASS, and what it uses.

TileLang (tvm_ffi backend) embeds the device cubin, as it came from nvcc, in the host library it
loads; ``kernel_cubin`` takes it from there, so the SASS is that of the binary that runs, whether the
kernel was just compiled or loaded from TileLang's cache. Disassembly needs NVIDIA's ``cuobjdump``
and ``nvdisasm``: the pinned PyPI wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) on any host,
else a CUDA toolkit's on PATH.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections import Counter
from importlib import metadata
from pathlib import Path

EM_CUDA = 190  # ELF e_machine of a CUDA cubin
INSTALL_HINT = ("pip install nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37 (lpgemm's pins), or put a "
                "CUDA toolkit's bin/ on PATH")

# one SASS instruction line: /*0560*/  [@predicate] OPCODE.MODIFIERS operands ;
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
_RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


class SassUnavailable(RuntimeError):
    """No disassembler on this host: the SASS check cannot be made."""


def _wheel_binary(dist: str, name: str) -> Path | None:
    try:
        files = metadata.files(dist) or []
    except metadata.PackageNotFoundError:
        return None
    found = [f for f in files if f.name == name and f.parent.name == "bin"]
    return Path(found[0].locate()) if found else None


@functools.cache
def tools() -> tuple[Path, Path]:
    """(cuobjdump, nvdisasm): the pinned wheels' first, else the ones on PATH."""
    found = []
    for dist, name in (("nvidia-cuda-cuobjdump", "cuobjdump"), ("nvidia-cuda-nvdisasm", "nvdisasm")):
        path = _wheel_binary(dist, name) or (Path(p) if (p := shutil.which(name)) else None)
        if path is None or not os.access(path, os.X_OK):
            raise SassUnavailable(f"{name} not found: the SASS of a kernel cannot be read; {INSTALL_HINT}")
        found.append(path)
    return found[0], found[1]


def _run(args: list[str]) -> str:
    cuobjdump, nvdisasm = tools()
    # cuobjdump calls nvdisasm by name
    env = dict(os.environ, PATH=f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(cuobjdump), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"cuobjdump {' '.join(args)} failed (rc {proc.returncode}): {(proc.stderr or proc.stdout).strip()[:300]}")
    return proc.stdout


@functools.cache
def tool_version() -> str:
    """``cuobjdump <release>`` and where it came from, for the compile record."""
    cuobjdump, _ = tools()
    m = re.search(r"V(\d+\.\d+\.\d+)", subprocess.run([str(cuobjdump), "--version"], capture_output=True, text=True).stdout)
    return f"cuobjdump {m.group(1) if m else '?'} ({cuobjdump})"


def embedded_cubins(blob: bytes) -> list[bytes]:
    """The CUDA ELF images stored whole inside a host library (or a cubin itself)."""
    out = []
    i = blob.find(b"\x7fELF")
    while i >= 0:
        if len(blob) >= i + 64 and struct.unpack_from("<H", blob, i + 18)[0] == EM_CUDA:
            phoff, shoff = struct.unpack_from("<QQ", blob, i + 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, i + 0x36)
            end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
            for k in range(shnum):  # section contents may lie past both header tables
                sh = i + shoff + k * shentsize
                sh_type = struct.unpack_from("<I", blob, sh + 4)[0]
                offset, size = struct.unpack_from("<QQ", blob, sh + 0x18)
                if sh_type != 8:  # SHT_NOBITS occupies no file bytes
                    end = max(end, offset + size)
            out.append(blob[i:i + end])
        i = blob.find(b"\x7fELF", i + 1)
    return out


def kernel_cubin(kernel) -> bytes:
    """The cubin a compiled TileLang kernel runs (taken from the host library TileLang built)."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "kernel.so"
        kernel.export_library(str(lib))
        cubins = embedded_cubins(lib.read_bytes())
    if len(cubins) != 1:
        raise RuntimeError(f"expected one cubin in the kernel's host library, found {len(cubins)}")
    return cubins[0]


def disassemble(cubin: Path) -> str:
    return _run(["--dump-sass", str(cubin)])


def resource_usage(cubin: Path) -> dict[str, dict[str, int]]:
    """{function: registers, stack, static shared and local bytes} as ptxas allotted them."""
    text = _run(["--dump-resource-usage", str(cubin)])
    return {m[0]: {"registers": int(m[1]), "stack_bytes": int(m[2]), "smem_static_bytes": int(m[3]),
                   "local_bytes": int(m[4])} for m in _RESOURCES.findall(text)}


def opcodes(sass: str) -> Counter:
    """Every instruction's opcode with its modifiers (``QGMMA.64x128x32.F32.E4M3.E4M3``), counted."""
    return Counter(_INSTRUCTION.findall(sass))


def tensor_core_ops(ops: Counter) -> dict[str, int]:
    """The tensor-core MMAs among ``ops``: HMMA/IMMA/QMMA (mma.sync), HGMMA/IGMMA/QGMMA (wgmma), UTC*MMA
    (tcgen05), ..., keyed by the full opcode."""
    return {op: n for op, n in sorted(ops.items()) if op.split(".")[0].endswith("MMA")}


def summarize(sass: str, usage: dict[str, dict[str, int]]) -> dict:
    """The compile record's SASS fields: tensor-core opcode counts, spill instructions and resources (the
    largest over the cubin's functions)."""
    ops = opcodes(sass)
    rec = {"sass_mma": tensor_core_ops(ops),
           "sass_local_loads": sum(n for op, n in ops.items() if op.split(".")[0] == "LDL"),
           "sass_local_stores": sum(n for op, n in ops.items() if op.split(".")[0] == "STL"),
           "sass_functions": sorted(usage)}
    for key in ("registers", "stack_bytes", "smem_static_bytes", "local_bytes"):
        rec[key] = max((u[key] for u in usage.values()), default=None)
    return rec


def short_name(opcode: str) -> str:
    """An opcode without its shape: ``QGMMA.64x128x32.F32.E4M3.E4M3`` -> ``QGMMA F32.E4M3.E4M3`` (accumulator,
    then operand types), ``HMMA.16816.F32`` -> ``HMMA F32`` (fp16 operands)."""
    base, *mods = opcode.split(".")
    types = [m for m in mods if not re.fullmatch(r"\d+(x\d+)*", m)]
    return " ".join([base, ".".join(types)]) if types else base


def mma_label(sass_mma: dict[str, int]) -> str:
    """A short label of the tensor-core instructions, e.g. ``QGMMA.64x128x32.F32.E4M3.E4M3 x32``; "none"."""
    return "; ".join(f"{op} x{n}" for op, n in sass_mma.items()) or "none"


def check(pattern: str, sass_mma: dict[str, int]) -> str:
    """"" if some tensor-core opcode matches ``pattern`` in full, else why the SASS check fails."""
    if any(re.fullmatch(pattern, op) for op in sass_mma):
        return ""
    return f"expected tensor-core instruction /{pattern}/ not in the SASS (tensor-core instructions: {mma_label(sass_mma)})"
