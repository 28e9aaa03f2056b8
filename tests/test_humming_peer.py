"""humming-kernels as a library peer of the W4A16 family (humming_w4_int4_g128 on format w4_humming_int4_g128): the
format holds w4_int4_sym_g128's very codes and scales in humming's layout, its shape rule names the problem, the
variant's registration and config entry, and the library imported only when a GPU run prepares it, with a clear
reason where it cannot be. CPU only, but for the last test (a GPU with humming-kernels installed)."""
import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, module_level_imports

from harness.runner import classify_run_error, run_emulated
from kernels import dequant_formats as dqf
from kernels import peers
from kernels.formats import OperandTypeError, unpack_int4
from kernels.registry import FORMATS, VARIANTS, bytes_per_element, load_all
from kernels.tiles import EMULATED

load_all()
NAME, INT4 = "humming_w4_int4_g128", "dequant_w4_int4_sym_g128"
FORMAT = dqf.HUMMING_FORMAT


def _inputs(M=8, N=192, K=512, seed=5, heavy=False):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    if heavy:  # Student's t, 3 degrees of freedom: a few huge weights per group
        B = B / torch.sqrt(torch.distributions.Chi2(3.0).sample((N, K)) / 3)
    return A, B


def _both(**kw):
    A, B = _inputs(**kw)
    return FORMATS[FORMAT].quantize(A, B), FORMATS["w4_int4_sym_g128"].quantize(A, B)


# ---------------------------------------------------------------- the format: int4_sym's codes in humming's words


@pytest.mark.parametrize("heavy", [False, True])
def test_words_hold_the_int4_sym_codes_plus_8_eight_per_int32_along_k(heavy):
    ops, int4 = _both(heavy=heavy)
    B, scales = ops["B"], ops["scales"]
    assert B.dtype == torch.int32 and B.shape == (192, 512 // 8)
    assert scales.dtype == torch.bfloat16 and scales.shape == (192, 512 // 128) and scales.is_contiguous()
    # humming's pack_weight: element 8j + t of a row at bits [4t, 4t + 4) of word j
    nibbles = torch.stack([(B >> (4 * t)) & 15 for t in range(8)], dim=-1).reshape(192, 512)
    assert torch.equal(nibbles, unpack_int4(int4["B"]).long() + 8)
    assert int(B[0, 0]) == sum(int(nibbles[0, t]) << (4 * t) for t in range(8)) - (1 << 32) * (int(nibbles[0, 7]) >= 8)
    assert torch.equal(scales, int4["scales"].T)
    # amax/7 scales give q in [-7, 7]: code 0 (q = -8) never occurs, so humming's transform may take the codes
    # as sign-magnitude e0m3 values (convert_symmetric_integer_weight); either way it decodes (c - 8)·s
    assert int(nibbles.min()) >= 1 and int(nibbles.max()) <= 15
    assert torch.equal(ops["A"], int4["A"])


def test_dequantize_and_emulation_equal_int4_syms_bit_for_bit():
    ops, int4 = _both(M=5, N=256, K=384)
    a, w = FORMATS[FORMAT].dequantize(ops)
    a_ref, w_ref = FORMATS["w4_int4_sym_g128"].dequantize(int4)
    assert torch.equal(a, a_ref) and torch.equal(w, w_ref) and w.dtype == torch.float64
    back = dqf.humming_as_int4_sym(ops)
    assert torch.equal(back["B"], int4["B"]) and torch.equal(back["scales"], int4["scales"])
    assert torch.equal(VARIANTS[NAME].emulate(ops), VARIANTS[INT4].emulate(int4))
    assert torch.equal(dqf.humming_words(back["B"]), ops["B"])


def test_the_format_refuses_what_humming_cannot_hold_by_name():
    with pytest.raises(ValueError, match=rf"^{FORMAT}: K=192 must be a multiple of 128"):
        FORMATS[FORMAT].quantize(torch.randn(4, 192), torch.randn(64, 192))
    with pytest.raises(ValueError, match=rf"^{FORMAT}: operand B .*NaN"):
        FORMATS[FORMAT].quantize(torch.randn(4, 128), torch.full((64, 128), float("nan")))
    ops, _ = _both()
    with pytest.raises(OperandTypeError, match=r"emulate_humming: B must hold humming's int32 words .* got torch\.int8"):
        VARIANTS[NAME].emulate(ops | {"B": ops["B"].view(torch.int8)})


def test_the_shape_limit_names_the_problem_and_the_emulation_honours_it():
    limit = VARIANTS[NAME].shape_limit
    assert limit is peers.humming_shape_limit
    for shape in ((1, 8192, 8192), (16, 28672, 8192), (4096, 8192, 28672), (200, 64, 128)):
        assert limit(*shape) is None, shape
    reason = limit(200, 328, 256)  # the CPU sweep's N = 328
    assert reason == "humming: N=328 must be a multiple of 64 (its weight layout's row tiles)"
    A, B = _inputs(M=200, N=328, K=256)
    rows = run_emulated(VARIANTS[NAME], A, B, FORMATS[FORMAT].quantize(A, B), {})
    assert rows == [{"tile": EMULATED, "status": "unsupported", "reason": reason}]


# ---------------------------------------------------------------- registration and configuration


def test_registered_as_a_library_peer_of_the_family_on_int4_syms_weights():
    v = VARIANTS[NAME]
    assert (v.family, v.input_format, v.kernel, v.baseline, v.min_cc) == ("dequant", FORMAT, None, "cublas_bf16", 80)
    assert v.prepare is peers.prepare_humming and v.launch is peers.launch_humming and v.second_baseline is None
    assert FORMATS[FORMAT].reads == ("A", "B", "scales")
    assert bytes_per_element(NAME) == bytes_per_element(INT4)  # the same bytes of weight and scales
    # tinygemm stays the second column of the TileLang variants; humming is a peer row of the family
    assert all(u.second_baseline != NAME for u in VARIANTS.values())


def test_config_times_it_beside_tinygemm_with_int4_syms_tolerance():
    variants = yaml.safe_load((REPO / "config.yaml").read_text())["variants"]
    names = list(variants)
    assert names.index(NAME) == names.index("tinygemm_w4_g128") + 1
    entry, tinygemm, int4 = variants[NAME], variants["tinygemm_w4_g128"], variants[INT4]
    assert entry["distributions"] == tinygemm["distributions"] and entry["shapes"] == tinygemm["shapes"]
    assert entry["tolerance"] == int4["tolerance"] and "tiles" not in entry
    assert all(VARIANTS[NAME].shape_limit(*map(int, s.split("x"))) is None for s in entry["shapes"]["gpu"])


# ---------------------------------------------------------------- humming is imported by a GPU run only


def test_no_module_imports_humming_at_import_time():
    for module in ("peers", "dequant", "dequant_formats"):
        imported = module_level_imports(REPO / "kernels" / f"{module}.py")
        assert not any(n == "humming" or n.startswith("humming.") for n in imported), (module, imported)


@pytest.fixture
def humming_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HUMMING_TMP_DIR", str(tmp_path / "tmp"))
    return tmp_path


def test_a_host_without_humming_gets_a_failed_row_saying_so(monkeypatch, humming_dirs):
    monkeypatch.setitem(sys.modules, "humming", None)  # import humming raises ModuleNotFoundError
    ops, _ = _both()
    with pytest.raises(RuntimeError, match=r"^humming-kernels is not installed on this host: the humming peer needs "
                                           r"humming-kernels==0\.1\.20 \(pip install '\.\[humming\]', or the offline"):
        peers.prepare_humming(ops)
    try:
        peers.prepare_humming(ops)
    except RuntimeError as e:
        status, reason = classify_run_error(VARIANTS[NAME], e)
    assert status == "failed" and reason.startswith("RuntimeError: humming-kernels is not installed on this host")
    with pytest.raises(KeyError, match="humming_layer"):  # the launch needs what prepare makes
        peers.launch_humming(None, ops)


def test_compiling_ahead_without_humming_says_so_as_prepare_does(monkeypatch, humming_dirs):
    # run_variant.py prints this and goes on: each shape's prepare then fails its rows with the same reason
    monkeypatch.setitem(sys.modules, "humming", None)
    assert VARIANTS[NAME].precompile is peers.precompile_humming and VARIANTS[NAME].prepare_compiles
    with pytest.raises(RuntimeError, match=r"^humming-kernels is not installed on this host"):
        peers.precompile_humming([(16, 192, 512)])


def test_a_broken_install_names_the_missing_module(monkeypatch, humming_dirs):
    monkeypatch.setitem(sys.modules, "humming", types.ModuleType("humming"))  # not a package: no humming.layer
    with pytest.raises(RuntimeError, match=r"^humming-kernels cannot be imported, a module it needs is missing: "
                                           r"No module named 'humming\.layer'"):
        peers.import_humming()


def test_hummings_caches_go_under_the_checkout_unless_set(monkeypatch):
    monkeypatch.delenv("HUMMING_CACHE_DIR", raising=False)
    monkeypatch.delenv("HUMMING_TMP_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "humming", None)
    with pytest.raises(RuntimeError):
        peers.import_humming()
    import os
    assert os.environ["HUMMING_CACHE_DIR"] == str(REPO / ".cache/humming/cache")
    assert os.environ["HUMMING_TMP_DIR"] == str(REPO / ".cache/humming/tmp") and Path(os.environ["HUMMING_TMP_DIR"]).is_dir()


def test_a_failed_jit_compile_shows_the_compilers_errors(tmp_path):
    (tmp_path / "stderr.log").write_text("kernel.cu(12): warning: unused\nkernel.cu(40): error: identifier \"x\" is undefined\n")
    e = RuntimeError(f"NVRTCCompiler failed with exit code 1; source and compiler logs: {tmp_path}")
    msg = str(peers._with_compiler_errors(e))
    assert msg == f'humming\'s JIT compile failed: kernel.cu(40): error: identifier "x" is undefined (logs: {tmp_path})'
    other = RuntimeError("CUDA error: out of memory")
    assert peers._with_compiler_errors(other) is other


def test_the_bundle_script_pins_the_wheels_the_docs_install():
    """docs/operations.md's offline bundle: humming-kernels at the version the peer names, cuda-bindings of CUDA 13.0
    with the cuda-pathfinder it needs, binary wheels only for the GPU host's CPython 3.12, no dependencies pulled."""
    script = (REPO / "envs/humming-bundle").read_text()
    assert f"{peers.HUMMING_DIST}=={peers.HUMMING_VERSION}" in script
    pins = dict(re.findall(r"\b(cuda-bindings|cuda-pathfinder|safetensors)==([\d.]+)", script))
    assert pins["cuda-bindings"].startswith("13.0.") and pins["cuda-pathfinder"].startswith("1.")
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version 3.12", "--platform manylinux_2_28_x86_64"):
        assert flag in script
    assert "bash envs/humming-bundle .gpu/humming" in (REPO / "docs/operations.md").read_text()


# ---------------------------------------------------------------- on a GPU with humming-kernels


def _humming_on_gpu() -> str:
    if not torch.cuda.is_available():
        return "no GPU"
    try:
        peers.import_humming()
    except RuntimeError as e:
        return str(e)
    return ""


@pytest.mark.skipif(bool(_humming_on_gpu()), reason=f"needs a GPU with humming-kernels: {_humming_on_gpu()}")
@pytest.mark.parametrize("shape", [(1, 256, 1024), (16, 8192, 8192), (64, 512, 2048), (333, 1024, 4096)])
def test_on_the_gpu_humming_multiplies_int4_syms_weights_as_the_emulation_does(shape):
    from harness.metrics import error_metrics

    M, N, K = shape
    ops, _ = _both(M=M, N=N, K=K)
    dev = {k: t.cuda() for k, t in ops.items()}
    run_ops = dev | peers.prepare_humming(dev)
    assert isinstance(json.loads(run_ops[peers.HUMMING_TUNING]), dict)  # one kernel, chosen for this M
    out = peers.launch_humming(None, run_ops)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    a, w = FORMATS[FORMAT].dequantize(ops)
    m = error_metrics(out.cpu(), a @ w.T, "kernel")
    assert m["kernel_rel_fro"] < 0.005 and m["kernel_calc_diff"] < 2e-5, m  # config.yaml's kernel tolerances
    # a few bf16 roundings apart: stream-K adds partial sums in the bf16 output (H200: up to 0.0066 of the largest)
    emulated = VARIANTS[NAME].emulate(ops).float()
    assert (out.float().cpu() - emulated).abs().max() <= 2 ** -6 * emulated.abs().max()


@pytest.mark.skipif(bool(_humming_on_gpu()), reason=f"needs a GPU with humming-kernels: {_humming_on_gpu()}")
def test_on_the_gpu_after_compiling_ahead_prepare_compiles_nothing(humming_dirs):
    shapes = [(2, 384, 1024), (24, 384, 1024), (48, 640, 2048), (200, 1280, 4096)]  # none compiled before here
    cubins = humming_dirs / "cache"
    peers.precompile_humming(shapes)
    ahead = sorted(cubins.rglob("kernel.cubin"))
    assert ahead
    for M, N, K in shapes:
        ops, _ = _both(M=M, N=N, K=K)
        dev = {k: t.cuda() for k, t in ops.items()}
        peers.prepare_humming(dev)
    assert sorted(cubins.rglob("kernel.cubin")) == ahead  # each shape's kernel was there already
