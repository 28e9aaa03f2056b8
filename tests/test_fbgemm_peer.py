"""fbgemm-gpu-genai's CUTLASS DeepSeek-recipe GEMM (torch.ops.fbgemm.f8f8bf16_groupwise) as a second library peer of the
block-scaled family (fbgemm_groupwise_fp8 on format deepseek_1x128_128x128): the scales its prepare makes are in the
layouts FBGEMM's CUTLASS kernels read, its shape rule names the problem, its registration and config entry, the
library imported only when a GPU run prepares it with a clear reason where it cannot be, and the offline sm_90a bundle
(envs/fbgemm-bundle, envs/fatbin_prune.py). CPU only, but for one test that compiles a small CUDA library with nvcc
(no GPU) and the last tests (a GPU with fbgemm-gpu-genai installed)."""
import importlib.util
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, module_level_imports

from harness.runner import classify_run_error, run_emulated
from kernels import blockscaled as bs
from kernels import blockscaled_formats as bsf
from kernels import peers
from kernels.formats import MissingOperand, OperandTypeError
from kernels.registry import FORMATS, VARIANTS, load_all
from kernels.tiles import EMULATED

load_all()
NAME, CUBLAS, FORMAT = "fbgemm_groupwise_fp8", "cublas_blockwise_fp8", "deepseek_1x128_128x128"
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


def _uneven(rows: int, cols: int, seed: int, row_block: int, col_block: int) -> torch.Tensor:
    """N(0,1) with each (row_block x col_block) block scaled by its own power of ten: a scale read from the wrong block
    shows up as a large error, never as a rounding."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    mags = 10.0 ** torch.randint(-3, 4, (-(-rows // row_block), -(-cols // col_block)), generator=g).float()
    return x * mags.repeat_interleave(row_block, 0).repeat_interleave(col_block, 1)[:rows, :cols]


def _ops(M: int, N: int, K: int, seed: int = 3):
    A, B = _uneven(M, K, seed, 1, 128), _uneven(N, K, seed + 1, 128, 128)
    return A, B, FORMATS[FORMAT].quantize(A, B)


# ---------------------------------------------------------------- the scales, in the layouts CUTLASS reads

# shapes with several K blocks and several 128-row blocks of B, a partial last block of B's rows, M % 4 != 0 (the
# stored SFA_t is padded: a copy) and M % 4 == 0 (a view), M <= 16 and above
SCALE_SHAPES = [(20, 328, 384), (13, 256, 512), (1, 136, 256), (200, 328, 256), (16, 129, 128)]


@pytest.mark.parametrize("M,N,K", SCALE_SHAPES)
def test_the_scales_are_at_the_offsets_cutlass_reads_them(M, N, K):
    """CUTLASS's Sm90BlockwiseScaleConfig<1, 128, 128> (MN-major, as FBGEMM 1.6.0 instantiates it): x_scale element
    (m, kb) at kb·M + m, w_scale element (nb, kb) at kb·⌈N/128⌉ + nb, from the tensors' data pointers."""
    _, _, ops = _ops(M, N, K)
    x_scale, w_scale = peers.fbgemm_groupwise_scales(ops)
    kb, nb = -(-K // 128), -(-N // 128)
    assert x_scale.dtype == w_scale.dtype == torch.float32 and x_scale.is_contiguous() and w_scale.is_contiguous()
    assert x_scale.shape == (kb, M) and w_scale.shape == (kb, nb)  # as FBGEMM's quantize_fp8_*(k_major=False) makes them
    x_mem, w_mem = x_scale.flatten(), w_scale.flatten()
    for k in range(kb):
        for m in range(M):
            assert x_mem[k * M + m] == ops["SFA"][m, k], (k, m)
        for n in range(nb):
            assert w_mem[k * nb + n] == ops["SFB"][n, k], (k, n)
    # no copy where the stored M-major scales already have pitch M; one copy where their rows are padded to 4
    assert (x_scale.data_ptr() == ops["SFA_t"].data_ptr()) == (M % 4 == 0)


def _through_cutlass_layouts(ops, x_mem: torch.Tensor, w_mem: torch.Tensor) -> torch.Tensor:
    """The DeepSeek recipe as FBGEMM's kernels run it, each scale read at its CUTLASS offset in the flat memory of
    x_scale and w_scale: per 128-K block, fp8 products summed in fp32, times x_scale·w_scale (fp32), added to the fp32
    accumulator in one rounding; bf16 at the end."""
    a, b = ops["A"].float(), ops["B"].float()
    (M, K), N = a.shape, b.shape[0]
    kb, nb = -(-K // 128), -(-N // 128)
    acc = torch.zeros(M, N)
    rows, cols = torch.arange(M), torch.arange(N) // 128
    for k in range(kb):
        part = a[:, 128 * k:128 * (k + 1)] @ b[:, 128 * k:128 * (k + 1)].T
        s = x_mem[k * M + rows][:, None] * w_mem[k * nb + cols][None, :]
        acc = (acc.double() + part.double() * s.double()).float()
    return acc.to(torch.bfloat16)


@pytest.mark.parametrize("M,N,K", SCALE_SHAPES)
def test_the_recipe_through_those_layouts_is_the_emulation_bit_for_bit(M, N, K):
    _, _, ops = _ops(M, N, K, seed=7)
    x_scale, w_scale = peers.fbgemm_groupwise_scales(ops)
    out = _through_cutlass_layouts(ops, x_scale.flatten(), w_scale.flatten())
    assert torch.equal(out, VARIANTS[NAME].emulate(ops))
    # and a transposed w_scale (the K-major layout FBGEMM's other block-scaled ops take) is not: the test can fail
    if N > 128 and K > 128:
        wrong = _through_cutlass_layouts(ops, x_scale.flatten(), ops["SFB"].contiguous().flatten())
        assert not torch.equal(wrong, out)


def test_the_scales_refuse_operands_fbgemm_would_misread():
    _, _, ops = _ops(20, 256, 384)
    with pytest.raises(OperandTypeError, match=r"A and B must be torch\.float8_e4m3fn .* got torch\.float8_e5m2"):
        peers.fbgemm_groupwise_scales(ops | {"A": ops["A"].view(torch.float8_e5m2)})
    with pytest.raises(OperandTypeError, match=r"SFB must be fp32 \(⌈N/128⌉, ⌈K/128⌉\) = \(2, 3\), got torch\.float32 \(3, 2\)"):
        peers.fbgemm_groupwise_scales(ops | {"SFB": ops["SFB"].T.contiguous()})
    with pytest.raises(OperandTypeError, match=r"SFA_t must be fp32 \(⌈K/128⌉, ≥ M\) = \(3, ≥ 20\)"):
        peers.fbgemm_groupwise_scales(ops | {"SFA_t": ops["SFA"]})
    with pytest.raises(MissingOperand, match="needs operand 'SFA_t'"):
        peers.fbgemm_groupwise_scales({k: v for k, v in ops.items() if k != "SFA_t"})


def test_the_launch_is_the_op_on_the_prepared_tensors_and_nothing_else():
    _, _, ops = _ops(20, 256, 384)
    x_scale, w_scale = peers.fbgemm_groupwise_scales(ops)
    calls = []

    def fake_op(*args):
        calls.append(args)
        return "out"

    run_ops = ops | {peers.FBGEMM_OP: fake_op, peers.FBGEMM_X_SCALE: x_scale, peers.FBGEMM_W_SCALE: w_scale}
    assert VARIANTS[NAME].launch(None, run_ops) == "out"
    (args,) = calls
    assert all(a is b for a, b in zip(args, (ops["A"], ops["B"], x_scale, w_scale), strict=True))
    with pytest.raises(KeyError, match=peers.FBGEMM_OP):  # the launch needs what prepare makes
        VARIANTS[NAME].launch(None, ops)


# ---------------------------------------------------------------- what it cannot run


def test_the_shape_limit_names_each_problem_and_the_emulation_honours_it():
    limit = VARIANTS[NAME].shape_limit
    assert limit is peers.fbgemm_groupwise_fp8_shape_limit
    head = "fbgemm f8f8bf16_groupwise cannot run this shape: "
    assert limit(64, 128, 192) == head + "K=192 must be a multiple of 128 (whole scale blocks: one per K tile of its kernels)"
    assert limit(64, 124, 256) == head + "N=124 must be a multiple of 8 (the TMA store of its bf16 output needs 16-byte rows)"
    assert limit(333, 256, 256) == head + ("M=333 must be a multiple of 4 when M > 16 (its 128x128 kernel loads the 1x128 "
                                           "scales with TMA: the pitch between their K blocks, M floats, must be 16 bytes)")
    assert limit(333, 100, 200).count("must be a multiple") == 3
    for shape in ((1, 8, 128), (13, 7168, 2048), (16, 8192, 8192), (17 * 4, 2112, 7168), (3000, 5000, 4096)):
        assert limit(*shape) is None, shape
    A, B, ops = _ops(333, 256, 256)
    rows = run_emulated(VARIANTS[NAME], A, B, ops, {})
    assert rows == [{"tile": EMULATED, "status": "unsupported", "reason": limit(333, 256, 256)}]


def test_a_gpu_other_than_hopper_is_refused_by_name():
    assert peers.fbgemm_groupwise_gpu_problem((9, 0)) is None
    for cc in ((10, 0), (8, 9), (12, 0)):
        assert peers.fbgemm_groupwise_gpu_problem(cc) == (
            f"fbgemm-gpu-genai 1.6.0's f8f8bf16_groupwise has CUTLASS sm90 (sm_90a) kernels only; this GPU is compute "
            f"capability {cc[0]}.{cc[1]}")


# ---------------------------------------------------------------- registration and configuration


def test_registered_as_a_second_library_peer_of_the_family_on_the_deepseek_operands():
    v, cublas = VARIANTS[NAME], VARIANTS[CUBLAS]
    assert (v.family, v.precision, v.input_format, v.kernel, v.min_cc) == ("blockscaled", "fp8", FORMAT, None, 90)
    assert v.baseline == CUBLAS and v.second_baseline is None and v.emulate is bs.emulate_blockscaled_sm90 is cublas.emulate
    assert v.prepare is peers.prepare_fbgemm_groupwise_fp8 and v.launch is peers.launch_fbgemm_groupwise_fp8
    assert v.run_refusals == () and v.tile_space is None
    assert peers.FBGEMM_SCALE_BLOCK == bsf.PROMOTION_K  # its scale blocks are the format's
    # cuBLAS stays the matched peer of the TileLang variants: no variant is timed against fbgemm
    assert all(NAME not in (u.baseline, u.second_baseline) for u in VARIANTS.values())
    assert f"{peers.FBGEMM_DIST} {peers.FBGEMM_VERSION} torch.ops.fbgemm.f8f8bf16_groupwise" in v.description
    assert "DeepSeek recipe" in v.description and "sm_90a" in v.description


def test_config_times_it_beside_cublas_blockwise_with_its_shapes_and_tolerance():
    variants = CONFIG["variants"]
    names = list(variants)
    assert names.index(NAME) == names.index(CUBLAS) + 1
    entry, cublas = variants[NAME], variants[CUBLAS]
    assert entry == cublas and set(entry) == {"shapes", "tolerance"}  # no tiles, the global distributions
    assert entry["shapes"] == variants["blockscaled_sm90"]["shapes"]
    for kind, shapes in [("gpu", entry["shapes"]["gpu"]), ("cpu", CONFIG["sweeps"]["cpu"])]:
        for s in shapes:
            assert VARIANTS[NAME].shape_limit(*map(int, s.split("x"))) is None, (kind, s)
    # a peer row, not a zoo entry: peers join the zoo as a zoo entry's baseline or second baseline only
    assert NAME not in CONFIG["zoo"]["entries"]


def test_the_extra_pins_the_version_the_peer_names():
    extras = re.search(r"^fbgemm = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    assert extras and extras[1] == f'"{peers.FBGEMM_DIST}=={peers.FBGEMM_VERSION}"'


# ---------------------------------------------------------------- fbgemm is imported by a GPU run only


def test_no_module_imports_fbgemm_at_import_time():
    for module in ("peers", "blockscaled", "blockscaled_formats"):
        imported = module_level_imports(REPO / "kernels" / f"{module}.py")
        assert not any(n.split(".")[0] == "fbgemm_gpu" for n in imported), (module, imported)


@pytest.fixture
def fbgemm_modules(monkeypatch):
    """sys.modules as it was, before and after: a test may import (fake) fbgemm_gpu packages."""
    for name in [n for n in sys.modules if n.split(".")[0] == "fbgemm_gpu"]:
        monkeypatch.delitem(sys.modules, name)
    yield monkeypatch
    for name in [n for n in sys.modules if n.split(".")[0] == "fbgemm_gpu"]:
        del sys.modules[name]


class _NotInstalled:
    """A meta path finder that finds no fbgemm_gpu, whatever this host has installed."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] == "fbgemm_gpu":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_a_host_without_fbgemm_gets_a_failed_row_saying_so(fbgemm_modules):
    fbgemm_modules.setattr(sys, "meta_path", [_NotInstalled, *sys.meta_path])
    _, _, ops = _ops(20, 256, 384)
    expected = (r"^fbgemm-gpu-genai is not installed on this host: the fbgemm peer needs fbgemm-gpu-genai==1\.6\.0 "
                r"\(pip install '\.\[fbgemm\]', or the offline sm_90a bundle of docs/operations\.md; no module 'fbgemm_gpu'\)")
    with pytest.raises(RuntimeError, match=expected) as e:
        peers.prepare_fbgemm_groupwise_fp8(ops)
    status, reason = classify_run_error(VARIANTS[NAME], e.value)
    assert status == "failed" and reason.startswith("RuntimeError: fbgemm-gpu-genai is not installed on this host")


def _fake_fbgemm(root: Path, gen_ai_init: str) -> None:
    """A package fbgemm_gpu.experimental.gen_ai under ``root`` whose __init__ is ``gen_ai_init``."""
    pkg = root / "fbgemm_gpu/experimental/gen_ai"
    pkg.mkdir(parents=True)
    (root / "fbgemm_gpu/__init__.py").write_text("")
    (root / "fbgemm_gpu/experimental/__init__.py").write_text("")
    (pkg / "__init__.py").write_text(gen_ai_init)


@pytest.mark.parametrize("init, expected", [
    ("import lpgemm_no_such_dependency\n",
     r"^fbgemm-gpu-genai cannot be imported, a module it needs is missing: No module named 'lpgemm_no_such_dependency'$"),
    ("raise OSError('libtorch_cuda.so: cannot open shared object file')\n",
     r"^fbgemm-gpu-genai cannot be imported: OSError: libtorch_cuda\.so: cannot open shared object file$"),
    ("", r"^fbgemm-gpu-genai is installed but registers no torch\.ops\.fbgemm\.f8f8bf16_groupwise: "),
])
def test_a_broken_install_says_what_is_wrong(fbgemm_modules, tmp_path, init, expected):
    _fake_fbgemm(tmp_path, init)
    fbgemm_modules.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=expected):
        peers.import_fbgemm_groupwise()


def test_an_installed_op_on_cpu_operands_is_refused_before_any_call(monkeypatch):
    monkeypatch.setattr(peers, "import_fbgemm_groupwise", lambda: lambda *args: pytest.fail("the op was called"))
    _, _, ops = _ops(20, 256, 384)
    with pytest.raises(RuntimeError, match=r"^fbgemm's f8f8bf16_groupwise runs on the GPU only; the operands are on cpu$"):
        peers.prepare_fbgemm_groupwise_fp8(ops)


# ---------------------------------------------------------------- the offline sm_90a bundle


def _fatbin_prune():
    """envs/fatbin_prune.py, a script beside envs/fbgemm-bundle rather than a package module, imported from its path."""
    spec = importlib.util.spec_from_file_location("lpgemm_envs_fatbin_prune", REPO / "envs/fatbin_prune.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


FP = _fatbin_prune()


def _entry(arch: int, payload: bytes, kind: int = 2) -> bytes:
    payload += bytes(-len(payload) % 8)
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x0101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FP.FATBIN_MAGIC, 1, 16, len(body)) + body


def _elf(fatbin: bytes, host: bytes = b"host code and data" * 3) -> bytes:
    """A 64-bit little-endian ELF file with a .nv_fatbin section (and its section name table)."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    host += bytes(-(64 + len(host)) % 8)
    fat_off = 64 + len(host)
    names_off = fat_off + len(fatbin)
    shoff = names_off + len(names) + (-(names_off + len(names)) % 8)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)
    sections = bytes(64)  # the null section
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, fat_off, len(fatbin), 0, 0, 8, 0)
    sections += struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, names_off, len(names), 0, 0, 1, 0)
    return bytes(header) + host + fatbin + names + bytes(shoff - names_off - len(names)) + sections


def _payload(tag: str, n: int) -> bytes:
    return b"\x7fELF" + (tag.encode() * n)[: n - 4]


def test_prune_keeps_each_containers_sm90_entries_unchanged_and_zeroes_the_rest(tmp_path):
    first = _container(_entry(80, _payload("a80", 300)), _entry(90, _payload("a90", 333)), _entry(100, _payload("a100", 500)))
    second = _container(_entry(90, _payload("b90", 64)), _entry(80, _payload("b80", 128)))
    data = _elf(first + second)
    lib = tmp_path / "lib.so"
    lib.write_bytes(data)
    report = FP.prune_file(lib, 90)
    out = lib.read_bytes()
    assert len(out) == len(data) and report["containers"] == 2
    assert report["removed_bytes"] == {"elf sm_80": 64 + 304 + 64 + 128, "elf sm_100": 64 + 504}
    start, size = FP.elf_section(out, ".nv_fatbin")
    assert out[:start] == data[:start] and out[start + size:] == data[start + size:]
    # each container where it was, holding only its sm_90 entry (moved to its front), the rest of its bytes zero
    for old, c in zip(FP.containers(data, start, size), FP.containers(out, start, size), strict=True):
        (kept,) = [e for e in old.entries if e.arch == 90]
        assert c.offset == old.offset and [e.arch for e in c.entries] == [90]
        assert out[c.entries[0].offset:c.end] == data[kept.offset:kept.end] and c.end == c.entries[0].end
        assert not any(out[c.end:old.end])
    assert FP.cubins(out, 90) == FP.cubins(data, 90) and FP.cubins(out, 80) == FP.cubins(out, 100) == []
    # a second run changes nothing
    assert FP.prune_file(lib, 90)["removed_bytes"] == {} and lib.read_bytes() == out


def test_prune_refuses_a_container_without_the_kept_architecture(tmp_path, capsys):
    lib = tmp_path / "lib.so"
    data = _elf(_container(_entry(90, _payload("a90", 64))) + _container(_entry(80, _payload("b80", 64))))
    lib.write_bytes(data)
    assert FP.main(["--keep-arch", "90", str(lib)]) == 1
    assert "has no sm_90 entry (only [80])" in capsys.readouterr().err and lib.read_bytes() == data
    lib.write_bytes(b"not an ELF file")
    with pytest.raises(FP.FatbinError, match="not a 64-bit little-endian ELF file"):
        FP.prune_file(lib, 90)


@pytest.mark.compile
def test_prune_on_a_library_nvcc_built_for_three_architectures(tmp_path):
    """The real format: a shared library nvcc builds for sm_80, sm_90a and sm_100a (no GPU needed). After the prune
    cuobjdump lists only sm_90a cubins and extracts them byte for byte; zeroing the other payloads while keeping their
    headers (the idea the prune replaces) leaves a file cuobjdump refuses."""
    nvcc = shutil.which("nvcc")
    cuobjdump = next(REPO.glob(".venv/lib/python*/site-packages/nvidia/cu13/bin/cuobjdump"), None) or shutil.which("cuobjdump")
    if nvcc is None or cuobjdump is None:
        pytest.skip("needs nvcc and cuobjdump")
    (tmp_path / "k.cu").write_text("__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }\n"
                                   'extern "C" void launch(float* x) { add_one<<<1, 32>>>(x); }\n')
    archs = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ("80", "90a", "100a")]
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", *archs, "-o", "lib.so", "k.cu"], cwd=tmp_path, check=True)

    def listing(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(cuobjdump), "-lelf", name], cwd=tmp_path, capture_output=True, text=True)

    def extracted(name: str, into: str) -> list[bytes]:
        (tmp_path / into).mkdir()
        subprocess.run([str(cuobjdump), "-xelf", "all", f"../{name}"], cwd=tmp_path / into, check=True, capture_output=True)
        files = sorted((tmp_path / into).glob("*.sm_90a.cubin"), key=lambda p: int(p.name.split(".")[1]))
        return [p.read_bytes() for p in files]

    assert {"sm_80", "sm_90a", "sm_100a"} <= set(re.findall(r"\.(sm_\w+)\.cubin", listing("lib.so").stdout))
    shutil.copy(tmp_path / "lib.so", tmp_path / "pruned.so")
    FP.prune_file(tmp_path / "pruned.so", 90)
    arches = re.findall(r"\.(sm_\w+)\.cubin", listing("pruned.so").stdout)
    assert arches and set(arches) == {"sm_90a"}
    assert extracted("pruned.so", "after") == extracted("lib.so", "before")
    blanked = bytearray((tmp_path / "lib.so").read_bytes())
    start, size = FP.elf_section(blanked, ".nv_fatbin")
    for c in FP.containers(bytes(blanked), start, size):
        for e in c.entries:
            if e.arch != 90:
                blanked[e.offset + e.header_size:e.end] = bytes(e.payload_size)
    (tmp_path / "blanked.so").write_bytes(blanked)
    refused = listing("blanked.so")
    assert refused.returncode != 0 and "Invalid ELF" in refused.stderr


def test_the_bundle_script_pins_the_wheel_and_packs_the_pruned_tree():
    """envs/fbgemm-bundle: the wheel the peer names, checked by its sha256, binary for the GPU host's CPython 3.12,
    no dependencies pulled; pruned to sm_90a by envs/fatbin_prune.py; packed reproducibly with xz's x86 filter; and
    docs/operations.md builds and installs what it writes."""
    script = (REPO / "envs/fbgemm-bundle").read_text()
    assert f"version={peers.FBGEMM_VERSION}\n" in script and '"fbgemm-gpu-genai==$version"' in script
    assert re.search(r"^wheel_sha256=[0-9a-f]{64}$", script, re.M) and "sha256sum --check" in script
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version 3.12", "--platform manylinux_2_28_x86_64",
                 'fatbin_prune.py" --keep-arch 90', "xz -T1 --x86 --lzma2=preset=9e", "--sort=name", "--mtime=@0"):
        assert flag in script, flag
    assert "bundle=fbgemm-gpu-genai-$version-sm90a.tar.xz" in script
    ops_doc = (REPO / "docs/operations.md").read_text()
    assert "bash envs/fbgemm-bundle .gpu/fbgemm" in ops_doc
    assert f"tar -xJf .gpu/fbgemm/fbgemm-gpu-genai-{peers.FBGEMM_VERSION}-sm90a.tar.xz -C /tmp/site" in ops_doc


# ---------------------------------------------------------------- on a GPU with fbgemm-gpu-genai


def _fbgemm_on_gpu() -> str:
    if not torch.cuda.is_available():
        return "no GPU"
    if why := peers.fbgemm_groupwise_gpu_problem(torch.cuda.get_device_capability()):
        return why
    try:
        peers.import_fbgemm_groupwise()
    except RuntimeError as e:
        return str(e)
    return ""


ON_GPU = pytest.mark.skipif(bool(_fbgemm_on_gpu()), reason=f"needs an sm_90 GPU with fbgemm-gpu-genai: {_fbgemm_on_gpu()}")


@ON_GPU
@pytest.mark.parametrize("shape", [(1, 2112, 1024), (16, 4096, 2048), (200, 328, 256), (128, 2112, 7168), (256, 1024, 4096)])
def test_on_the_gpu_fbgemm_computes_the_recipe_as_the_emulation_does(shape):
    from harness.metrics import error_metrics, rel_fro

    M, N, K = shape
    _, _, ops = _ops(M, N, K, seed=11)
    dev = {k: t.cuda() for k, t in ops.items()}
    run_ops = dev | peers.prepare_fbgemm_groupwise_fp8(dev)
    assert run_ops[peers.FBGEMM_X_SCALE].shape == (-(-K // 128), M) and run_ops[peers.FBGEMM_X_SCALE].is_cuda
    out = peers.launch_fbgemm_groupwise_fp8(None, run_ops)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    a, b = FORMATS[FORMAT].dequantize(ops)
    m = error_metrics(out.cpu(), a @ b.T, "kernel")
    assert m["kernel_rel_fro"] < 0.005 and m["kernel_calc_diff"] < 1e-4, m  # config.yaml's kernel tolerances
    # the same recipe: apart from the tensor core's own sums within a K block, a few bf16 roundings at most
    emulated = VARIANTS[NAME].emulate(ops)
    assert rel_fro(out.cpu().double(), emulated.double()) < 3e-3


@ON_GPU
def test_on_the_gpu_the_harness_runs_it_beside_cublas():
    from harness.runner import run_gpu

    M, N, K = 128, 2112, 7168
    A, B, ops = _ops(M, N, K, seed=12)
    tol = CONFIG["variants"][NAME]["tolerance"]
    (row,) = run_gpu(VARIANTS[NAME], A, B, ops, [], "sm_90a", tol, reps=3, warmup=1)
    assert row["status"] == "ok", row
