"""Keep one GPU architecture's device code in a CUDA shared library: every fat binary container of its ``.nv_fatbin``
section is rewritten in place to hold only the entries of that architecture (for fbgemm-gpu-genai's library: its
sm_90a cubins), the bytes freed zeroed. Used by envs/fbgemm-bundle; Python's standard library only.

    python3 envs/fatbin_prune.py --keep-arch 90 path/to/library.so

The layout it relies on, as nvcc writes it (and as cuobjdump reads it):
- ``.nv_fatbin`` holds one container per translation unit, back to back. A container is a 16-byte header (magic
  0xBA55ED50, u16 version, u16 header size, u64 size of the entries that follow) and its entries, each an entry
  header (u16 kind: 1 PTX, 2 ELF cubin; u16 version; u32 header size; u64 payload size, padded; u32 at offset 28
  the architecture, e.g. 90) followed by its payload.
- ``.nvFatBinSegment`` holds one wrapper per container whose pointer (a relocation of the library) names the
  container's first byte; the CUDA runtime registers each container through it and reads the container's own size.

Each container keeps its first byte (so no pointer or relocation changes); its kept entries move, unchanged, to just
after its header, its size field shrinks to theirs, and the rest of its old extent becomes zeros. Nothing outside
``.nv_fatbin`` changes. Each container then reads as nvcc writes one for a build of that architecture alone,
followed by zeros: cuobjdump lists and extracts the kept cubins, byte for byte the originals. Zeroing only the
payloads of the other entries and keeping their headers, the first idea, leaves a file that cuobjdump refuses
("Invalid ELF"), so that is not done. A container without an entry of the kept architecture is refused: pruning it
would remove its kernels from every GPU, not only from the others.
"""
from __future__ import annotations

import argparse
import hashlib
import struct
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
CONTAINER_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, padded payload size
ENTRY_ARCH_OFFSET = 28  # u32 in the entry header: the architecture (80, 90, 100, ...)
KINDS = {1: "ptx", 2: "elf"}


class FatbinError(ValueError):
    """A file or section that is not laid out as this tool expects; nothing is written."""


@dataclass(frozen=True)
class Entry:
    offset: int  # of its header, in the file
    kind: int
    header_size: int
    payload_size: int  # padded
    arch: int

    @property
    def end(self) -> int:
        return self.offset + self.header_size + self.payload_size


@dataclass(frozen=True)
class Container:
    offset: int
    header_size: int
    entries_size: int
    entries: tuple[Entry, ...]

    @property
    def end(self) -> int:
        return self.offset + self.header_size + self.entries_size


def elf_section(data: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of section ``name`` of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FatbinError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        name_off, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name_off, offset, size

    _, strtab, _ = header(shstrndx)
    for i in range(shnum):
        name_off, offset, size = header(i)
        end = data.index(b"\0", strtab + name_off)
        if data[strtab + name_off:end].decode() == name:
            return offset, size
    raise FatbinError(f"no section {name}")


def read_container(data: bytes, offset: int, limit: int) -> Container:
    magic, _, header_size, entries_size = CONTAINER_HEADER.unpack_from(data, offset)
    if magic != FATBIN_MAGIC:
        raise FatbinError(f"no fat binary container at {offset:#x} (magic {magic:#x})")
    entries, pos, end = [], offset + header_size, offset + header_size + entries_size
    if end > limit:
        raise FatbinError(f"the container at {offset:#x} runs past its section ({end:#x} > {limit:#x})")
    while pos < end:
        kind, _, entry_header, payload = ENTRY_HEADER.unpack_from(data, pos)
        arch, = struct.unpack_from("<I", data, pos + ENTRY_ARCH_OFFSET)
        if kind not in KINDS or entry_header < ENTRY_ARCH_OFFSET + 4:
            raise FatbinError(f"an entry at {pos:#x} of kind {kind} with a {entry_header}-byte header")
        entries.append(Entry(pos, kind, entry_header, payload, arch))
        pos = entries[-1].end
    if pos != end:
        raise FatbinError(f"the entries of the container at {offset:#x} end at {pos:#x}, not at {end:#x}")
    return Container(offset, header_size, entries_size, tuple(entries))


def containers(data: bytes, start: int, size: int) -> list[Container]:
    """The containers of a ``.nv_fatbin`` section, in order (zero padding between them is skipped)."""
    out, pos, end = [], start, start + size
    while pos < end:
        if data[pos:pos + 4] != MAGIC_BYTES:  # zeros up to the next container: padding, or what a prune freed
            following = data.find(MAGIC_BYTES, pos, end)
            gap = data[pos:end if following < 0 else following]
            if any(gap):
                raise FatbinError(f"bytes other than zeros between containers at {pos:#x}")
            if following < 0:
                break
            pos = following
        out.append(read_container(data, pos, end))
        pos = out[-1].end
    return out


def prune(data: bytearray, keep_arch: int) -> dict:
    """Rewrite ``data`` (a whole library) to keep only ``keep_arch``'s entries; what was kept and removed."""
    start, size = elf_section(data, ".nv_fatbin")
    found = containers(data, start, size)
    if not found:
        raise FatbinError("the .nv_fatbin section holds no container")
    kept, removed = Counter(), Counter()
    for c in found:
        keep = [e for e in c.entries if e.arch == keep_arch]
        if not keep:
            archs = sorted({e.arch for e in c.entries})
            raise FatbinError(f"the container at {c.offset:#x} has no sm_{keep_arch} entry (only {archs}): pruning it "
                              "would remove its kernels from every GPU")
        blob = b"".join(bytes(data[e.offset:e.end]) for e in keep)
        for e in c.entries:
            (kept if e.arch == keep_arch else removed)[f"{KINDS[e.kind]} sm_{e.arch}"] += e.end - e.offset
        struct.pack_into("<Q", data, c.offset + 8, len(blob))
        body = c.offset + c.header_size
        data[body:c.end] = blob + bytes(c.end - body - len(blob))
    return {"containers": len(found), "kept_bytes": dict(kept), "removed_bytes": dict(removed)}


def cubins(data: bytes, arch: int) -> list[str]:
    """sha256 of each ``arch`` entry (header and payload), in file order: what a prune must leave unchanged."""
    start, size = elf_section(data, ".nv_fatbin")
    return [hashlib.sha256(data[e.offset + e.header_size:e.end]).hexdigest()
            for c in containers(data, start, size) for e in c.entries if e.arch == arch]


def prune_file(path: Path, keep_arch: int) -> dict:
    """Prune ``path`` in place, after checking on the result that every kept payload is the original's, that
    nothing outside ``.nv_fatbin`` changed and that each container now holds ``keep_arch`` entries only."""
    original = path.read_bytes()
    data = bytearray(original)
    report = prune(data, keep_arch)
    start, size = elf_section(original, ".nv_fatbin")
    if data[:start] != original[:start] or data[start + size:] != original[start + size:]:
        raise FatbinError("bytes outside .nv_fatbin changed")  # never: a bug in this tool
    if cubins(bytes(data), keep_arch) != cubins(original, keep_arch):
        raise FatbinError(f"the sm_{keep_arch} entries changed")
    after = containers(bytes(data), start, size)
    if [c.offset for c in after] != [c.offset for c in containers(original, start, size)] or any(
            e.arch != keep_arch for c in after for e in c.entries):
        raise FatbinError("the pruned section does not read back as expected")
    path.write_bytes(data)
    return report | {"sha256_before": hashlib.sha256(original).hexdigest(), "sha256_after": hashlib.sha256(data).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-arch", type=int, required=True, help="the architecture to keep, e.g. 90 for sm_90a")
    ap.add_argument("library", type=Path)
    args = ap.parse_args(argv)
    try:
        report = prune_file(args.library, args.keep_arch)
    except FatbinError as e:
        print(f"fatbin_prune: {args.library}: {e}", file=sys.stderr)
        return 1
    print(f"{args.library}: {report['containers']} containers; kept {report['kept_bytes']}; "
          f"removed {report['removed_bytes']}; sha256 {report['sha256_before']} -> {report['sha256_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
