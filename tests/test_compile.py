"""Cross-compilation without a GPU: instructions (SASS and source), resources, unsupported targets."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CANONICAL_SHAPE

from harness import sass
from harness.compile import TILELANG_REFUSALS, compile_record, error_summary, known_refusal
from kernels.fp8 import FP8_QGMMA
from kernels.registry import get_variant
from kernels.tiles import parse_tile

# fp8_e4m3's tiles in config.yaml: sm_90a's wgmma tile, and the default (sm_89, sm_100a), which the main
# job compiles at CANONICAL_SHAPE too
HOPPER_TILE, DEFAULT_TILE = "m64n64k128_s4_t128", "m128n128k128_s3_t128"


@pytest.mark.compile
@pytest.mark.parametrize("variant,tag", [("fp8_e4m3", "kFloat8_e4m3"), ("fp8_e5m2", "kFloat8_e5m2")])
def test_hopper_fp8_kernel_uses_wgmma(kernels, variant, tag):
    k = kernels(variant, HOPPER_TILE, "sm_90a")
    rec = k.record
    assert rec["status"] == "ok", rec
    assert "wgmma" in rec["instructions"] and "mma_sync" not in rec["instructions"]
    assert tag in k.source
    assert (k.dir / "kernel.ptx").stat().st_size > 0
    assert rec["registers"] > 0 and rec["smem_dynamic_bytes"] > 0
    # the SASS of the cubin, beside the source and PTX, with what it shows
    ops = rec["sass_mma"]
    assert ops and all(op.startswith("QGMMA.64x") and op.endswith(f".F32.{variant[4:].upper()}.{variant[4:].upper()}")
                       for op in ops), ops
    assert sass.tensor_core_ops(sass.opcodes(k.sass)) == ops
    assert (k.dir / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    assert rec["sass_local_loads"] == rec["sass_local_stores"] == 0 and rec["sass_functions"] == ["main_kernel"]
    assert rec["smem_static_bytes"] >= 0 and rec["local_bytes"] == 0 and rec["sass_tool"].startswith("cuobjdump ")


@pytest.mark.compile
def test_fp8_without_qgmma_in_its_sass_fails_whatever_its_source_says(kernels, tmp_path):
    # the sm_100a build is fp8 mma.sync in the source, which ptxas turns into fp16 HMMA: a variant that
    # demands fp8 tensor-core instructions there is failed by the SASS check, before the source check
    v = get_variant("fp8_e4m3")
    strict = dataclasses.replace(v, sass={**v.sass, "sm_100a": FP8_QGMMA["e4m3"]})
    rec = compile_record(strict, *CANONICAL_SHAPE, parse_tile(DEFAULT_TILE), "sm_100a", tmp_path)
    assert rec["status"] == "failed" and "not in the SASS" in rec["reason"] and "HMMA.16816.F32 x" in rec["reason"]
    assert rec["instructions"] == ["mma_sync"]  # the source check alone would have passed
    assert kernels("fp8_e4m3", DEFAULT_TILE, "sm_100a").record["status"] == "ok"


def path_without(folder: Path, *names: str) -> str:
    """A PATH of one folder linking every program of this PATH except ``names``."""
    folder.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        for exe in sorted(Path(entry).iterdir()) if Path(entry).is_dir() else []:
            link = folder / exe.name
            if exe.name not in names and not link.exists() and os.access(exe, os.X_OK):
                link.symlink_to(exe)
    return str(folder)


@pytest.mark.compile
@pytest.mark.parametrize("cached", [False, True], ids=["fresh", "cached"])
def test_without_a_disassembler_the_instruction_check_fails(tmp_path, monkeypatch, cached):
    """Whether the kernel is built now or comes from TileLang's cache (on disk, or in memory after an
    earlier build in this process), the record names the missing tool."""
    # a tile no other test builds: "fresh" compiles it here, "cached" builds its own first and asks again
    tile = parse_tile("m64n64k64_s3_t128" if cached else "m64n64k64_s4_t128")
    if cached:
        compile_record(get_variant("fp8_e4m3"), *CANONICAL_SHAPE, tile, "sm_90a", tmp_path / "first")
    monkeypatch.setattr(sass, "_wheel_binary", lambda dist, name: None)
    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", "cuobjdump", "nvdisasm"))
    sass.tools.cache_clear()
    try:
        rec = compile_record(get_variant("fp8_e4m3"), *CANONICAL_SHAPE, tile, "sm_90a", tmp_path / "checked")
    finally:
        sass.tools.cache_clear()
    assert rec["status"] == "failed" and "no SASS" in rec["reason"] and "cuobjdump not found" in rec["reason"], rec
    assert "nvidia-cuda-cuobjdump==13.5.37" in rec["reason"]


@pytest.mark.compile
def test_the_cubin_read_is_the_one_nvcc_built(tmp_path):
    """Compiles anew, in a process of its own with an empty TileLang cache: what is checked is a fresh build.
    The cubin taken from the kernel's host library is, byte for byte, the one TileLang's compile step stored
    (cuda-binaries/<key>/kernel.cubin)."""
    code = (
        "import json, sys\n"
        "from harness import sass\n"
        "from harness.compile import build\n"
        "from kernels.registry import get_variant\n"
        "from kernels.tiles import parse_tile\n"
        "k = build(get_variant('int8_tilelang'), 128, 128, 256, parse_tile('m64n64k64_s2_t128'), 'sm_90a')\n"
        "open(sys.argv[1], 'wb').write(sass.kernel_cubin(k))\n"
    )
    env = dict(os.environ, TILELANG_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "taken.cubin")], check=True, env=env, cwd=tmp_path)
    stored = list((tmp_path / "cache").rglob("cuda-binaries/*/kernel.cubin"))
    assert len(stored) == 1 and json.loads((stored[0].parent / "metadata.json").read_text())["size"] > 0
    assert (tmp_path / "taken.cubin").read_bytes() == stored[0].read_bytes()


@pytest.mark.compile
def test_embedded_cubins_finds_cuda_elf_images_only(kernels):
    cubin = (kernels("int8_tilelang", "m128n256k128_s3_t256_wrow_z8").dir / "kernel.cubin").read_bytes()
    host_elf = Path(sys.executable).resolve().read_bytes()[:4096]  # an x86-64 ELF header, no CUDA image
    assert sass.embedded_cubins(b"junk" + cubin + b"more junk") == [cubin]
    assert sass.embedded_cubins(host_elf) == [] and sass.embedded_cubins(b"") == []
    assert sass.embedded_cubins(cubin) == [cubin]


def test_sass_opcodes_and_labels():
    text = """
        /*0560*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR4], RZ, !UPT ;    /* 0x01e0 */
        /*0640*/              @!P0 QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR8], R88 ;         /* 0x01e0 */
        /*11f0*/                   @UP3 UTCQMMA gdesc[UR28], gdesc[UR30], tmem[UR50], idesc[UR25] ;  /* 0x0034 */
        /*1200*/                   STL [R1+0x4], R2 ;  /* 0x0034 */
        /*1210*/                   LDL.LU R2, [R1+0x4] ;  /* 0x0034 */
        /*1220*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;  /* 0x0034 */
    """
    ops = sass.opcodes(text)
    assert sass.tensor_core_ops(ops) == {"HMMA.16816.F32.BF16": 1, "QGMMA.64x128x32.F32.E4M3.E4M3": 2, "UTCQMMA": 1}
    rec = sass.summarize(text, {"main_kernel": {"registers": 90, "stack_bytes": 8, "smem_static_bytes": 0, "local_bytes": 0}})
    assert (rec["sass_local_loads"], rec["sass_local_stores"], rec["registers"]) == (1, 1, 90)
    assert sass.check(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", rec["sass_mma"]) == ""
    assert "not in the SASS" in sass.check(r"QGMMA\.64x\d+x32\.F32\.E5M2\.E5M2", rec["sass_mma"])
    assert sass.check(r"HMMA\.16816\.F32", rec["sass_mma"])  # matched in full: .BF16 is another opcode


@pytest.mark.compile
def test_a_silent_fallback_fails_loudly(tmp_path):
    # sm_89 has no wgmma: a variant that demands it there must be marked failed, not ok
    strict = dataclasses.replace(get_variant("fp8_e4m3"), instructions={"sm_89": "wgmma"})
    rec = compile_record(strict, *CANONICAL_SHAPE, parse_tile(DEFAULT_TILE), "sm_89", tmp_path)
    assert rec["status"] == "failed" and "wgmma" in rec["reason"]
    assert rec["instructions"] == ["mma_sync"]


def test_declared_unsupported_target_is_recorded_not_raised(tmp_path):
    v = dataclasses.replace(get_variant("fp8_e4m3"), unsupported={"sm_90a": "no reason at all"})
    rec = compile_record(v, *CANONICAL_SHAPE, parse_tile(HOPPER_TILE), "sm_90a", tmp_path)
    assert (rec["status"], rec["reason"]) == ("unsupported", "no reason at all")


@pytest.mark.compile
def test_register_overflow_is_failed_with_reason_and_traceback(tmp_path, capsys):
    # 3 consumer warpgroups of 64x256 fp32 accumulators do not fit the register file: a tile mistake
    rec = compile_record(get_variant("fp8_e4m3"), 384, 512, 256, parse_tile("m192n256k128_s3_t384_wrow"), "sm_90a", tmp_path)
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("RuntimeError: ") and "Insufficient registers" in rec["reason"]
    assert "#include" not in rec["reason"] and len(rec["reason"]) < 700  # not the CUDA source nvcc was given
    assert "Traceback (most recent call last)" in capsys.readouterr().out  # the rule's log


# ---- known refusals: each rule recognises TileLang's real message and nothing else ---------------

# TileLang 0.1.15's messages, as raised (int4_mma on sm_90a without its pass config; blockscaled_sm100
# on sm_90a without its declared rule)
INT4_TMA = "Check failed: (0) is false: int4"
_BLOCKSCALED = (
    "Block-scaled GEMM requires either Blackwell SM100 TCGEN5MMA (A/B in shared memory, C in tensor memory) or "
    "SM120 mma.sync (A in shared memory or a fragment, B in shared memory, C in a fragment), but got "
    'target={{"kind":"cuda","tag":"","keys":["cuda","gpu"],"host":{{"kind":"c","tag":"","keys":["cpu"]}},'
    '"max_num_threads":1024,"thread_warp_size":32,"arch":"{arch}"}}, A scope=shared.dyn, B scope=shared.dyn, '
    "C scope=shared.tmem, M=128, N=128, K=128.\n  --> /work/main/kernels/blockscaled.py:431:1\n      |\n"
    " 431 |             A_s = T.alloc_shared((bM, bK), fp8)\n      |             ^"
)
NVCC_ARCH = (
    "#include <tl_templates/cuda/gemm.h>\nextern \"C\" __global__ void main_kernel() {}\n\n"
    "Compilation error:\nnvcc fatal   : Unsupported gpu architecture 'sm_75'\n\n"
    "Command: /usr/local/bin/nvcc -ccbin=/usr/bin/g++ --cubin -O3 -lineinfo -arch=sm_75 -std=c++20 "
    "-o /tmp/tmp_6djp0mf/tvm_kernels.cubin /tmp/tmp_6djp0mf/tvm_kernels.cu\n"
)
PTXAS_REGISTERS = (
    "#include <cuda.h>\n\nCompilation error:\n"
    "/x/cuda_fp8.h(139): warning #20012-D: __device__ annotation is ignored on a non-virtual function\n"
    "ptxas fatal   : (C7602) Insufficient registers (128) to compile instruction at line 1282 in function "
    "main_kernel. Try to compile with register target of 154 or higher.\n"
    "ptxas fatal   : Ptx assembly aborted due to errors\n\nCommand: nvcc -arch=sm_90a\n"
)
WGMMA_GEMM = (
    "T.wgmma_gemm() requires Hopper WGMMA lowering, but constraints were not satisfied. Got target="
    '{"kind":"cuda","arch":"sm_89"}, A(scope=local.fragment, dtype=int8), B(scope=shared.dyn, dtype=int8)'
)
REAL_REFUSALS = {"int4_tma": INT4_TMA, "blockscaled_mma_target": _BLOCKSCALED.format(arch="sm_90a")}
NOT_REFUSALS = {
    "nvcc: unknown arch": RuntimeError(NVCC_ARCH),
    "ptxas: register overflow": RuntimeError(PTXAS_REGISTERS),
    "a tile that does not fit": ValueError("blockscaled_g128: block_K must be 128 (the promotion interval), got 64"),
    "the TMA refusal of another dtype": RuntimeError("Check failed: (0) is false: int4x2"),
    # on sm_100a the block-scaled MMA exists: the same text there means the kernel put A, B or C in the
    # wrong scope, a bug
    "block-scaled GEMM on sm_100a": RuntimeError(_BLOCKSCALED.format(arch="sm_100a")),
    "wgmma_gemm constraints (the declared rule covers it)": RuntimeError(WGMMA_GEMM),
    "a Python bug": NameError("name 'bM' is not defined"),
    "empty": RuntimeError(""),
}


def test_every_refusal_rule_has_its_real_message():
    assert {r.name for r in TILELANG_REFUSALS} == set(REAL_REFUSALS)


@pytest.mark.parametrize("name", sorted(REAL_REFUSALS))
def test_refusal_rule_recognises_its_real_message_only(name):
    rule = known_refusal(RuntimeError(REAL_REFUSALS[name]))
    assert rule is not None and rule.name == name
    others = [n for n in REAL_REFUSALS if n != name]
    assert all(known_refusal(RuntimeError(REAL_REFUSALS[o])).name != name for o in others)
    # the arch rule applies to every target below sm_100 it can be raised for
    if name == "blockscaled_mma_target":
        assert known_refusal(RuntimeError(_BLOCKSCALED.format(arch="sm_89"))) is rule


@pytest.mark.parametrize("what", sorted(NOT_REFUSALS))
def test_other_errors_are_no_known_refusal(what):
    assert known_refusal(NOT_REFUSALS[what]) is None


def test_error_summary_keeps_nvcc_errors_not_the_source():
    assert error_summary(RuntimeError(NVCC_ARCH)) == "RuntimeError: nvcc fatal : Unsupported gpu architecture 'sm_75'"
    summary = error_summary(RuntimeError(PTXAS_REGISTERS))
    assert "Insufficient registers (128)" in summary and "warning" not in summary and "#include" not in summary
    assert error_summary(ValueError("a\n  b")) == "ValueError: a b"
    assert error_summary(ValueError("x" * 900)).endswith("x ...")


# ---- the three statuses from real compiles ---------------------------------------------------------

SHAPE = (256, 256, 512)


@pytest.mark.compile
def test_int4_tma_refusal_is_unsupported(tmp_path):
    # without its pass config (warp specialization off) int4_mma's T.int4 copies go through TMA
    v = dataclasses.replace(get_variant("int4_mma"), pass_configs={})
    rec = compile_record(v, *SHAPE, parse_tile("m128n128k128_s3_t128"), "sm_90a", tmp_path)
    assert rec["status"] == "unsupported" and "int4_tma" in rec["reason"] and INT4_TMA in rec["reason"]


@pytest.mark.compile
def test_blockscaled_mma_refusal_is_unsupported(tmp_path):
    v = dataclasses.replace(get_variant("blockscaled_sm100"), unsupported={})
    rec = compile_record(v, *SHAPE, parse_tile("m128n128k128_s1_t128"), "sm_90a", tmp_path)
    assert rec["status"] == "unsupported" and "blockscaled_mma_target" in rec["reason"]


@pytest.mark.compile
@pytest.mark.parametrize("arch,reason", [
    ("sm_75", "no instruction check for sm_75"),  # builds, but nothing proves it uses a tensor core
    ("sm_999", "RuntimeError: nvcc fatal : Unsupported gpu architecture 'sm_999'"),
    ("bogus", "AssertionError: Target {'kind': 'cuda', 'arch': 'bogus'} is not supported"),
])
def test_unknown_target_is_failed_not_unsupported(tmp_path, arch, reason):
    rec = compile_record(get_variant("fp8_e4m3"), *CANONICAL_SHAPE, parse_tile(DEFAULT_TILE), arch, tmp_path)
    assert rec["status"] == "failed" and reason in rec["reason"], rec


def test_tile_that_does_not_fit_is_failed_with_its_message(tmp_path, capsys):
    rec = compile_record(get_variant("blockscaled_g128"), *SHAPE, parse_tile("m128n128k64_s3_t256"), "sm_90a", tmp_path)
    assert rec["status"] == "failed"
    assert rec["reason"] == "ValueError: blockscaled_g128: block_K must be 128 (the promotion interval), got 64"
    assert "Traceback (most recent call last)" in capsys.readouterr().out


@pytest.mark.parametrize("variant,tile,K,words", [
    ("blockscaled_sm90", "m128n128k128_s3_t384", 200, "must be a multiple of 128"),
    ("int4_unpack_s8", "m128n256k128_s3_t256_wrow_z8", 48, "K divisible by 32"),
])
def test_declared_shape_limit_is_unsupported(tmp_path, variant, tile, K, words):
    v = get_variant(variant)
    assert v.shape_limit(256, 256, K)  # the same rule the variant declares
    rec = compile_record(v, 256, 256, K, parse_tile(tile), "sm_90a", tmp_path)
    assert rec["status"] == "unsupported" and words in rec["reason"], rec


def test_a_compile_stopped_by_the_jobs_interrupt_records_nothing(tmp_path, monkeypatch):
    """nvcc killed by the same interrupt as its job makes TileLang fail with an ordinary error first: that is no
    outcome of the kernel, so no failed record (it would skip the tile in every run); a real failure is one."""
    from harness import compile as kcompile
    from harness import jobs

    def nvcc_killed(*args, **kwargs):
        raise RuntimeError("")

    monkeypatch.setattr(kcompile, "build", nvcc_killed)
    variant, tile = get_variant("fp8_e4m3"), parse_tile("m64n64k64_s2_t128")
    rec = compile_record(variant, 64, 64, 64, tile, "sm_90a", tmp_path)
    assert rec["status"] == "failed" and rec["reason"].startswith("RuntimeError")
    monkeypatch.setattr(jobs, "_interrupts", [2])
    with pytest.raises(KeyboardInterrupt):
        compile_record(variant, 64, 64, 64, tile, "sm_90a", tmp_path)
