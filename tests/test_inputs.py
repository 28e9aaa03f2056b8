"""Input matrices are bit-identical on every machine, and their files are stored atomically and verified."""
import ast
import hashlib
import math
import os
import threading
import zipfile

import numpy as np
import pytest
import torch
from conftest import REPO

import harness.inputs as inputs
from harness.inputs import (
    CorruptInput,
    file_sha256,
    load_operands,
    make_matrix,
    make_operands,
    manifest,
    normal_quantile,
    save_operands,
    tensor_sha256,
)

# sha256 of A (M,K) and B (N,K) as computed on the development machine (x86-64, numpy 2.4, torch 2.13 CPU).
# Any other CPU, OS, numpy or torch must reproduce them bit for bit: that is the point of the generator.
GOLDEN = {
    ("normal", "8x16x32", 20261130): ("d0762731c6589009f38c7bcda29169ada4f439430f9aa0b7b8f4d5becf9bcff2",
                                      "44f0b9df212842c474e3e53e629879ebea1b72eb7a0a7501b0a7bd24cdd2e8bd"),
    ("normal", "200x328x256", 20261130): ("6a60b82e054cbba9c50b826549d013a4e1eb060c81505b340a59c93899350d0d",
                                          "9ea5ebd81b617a8ceea861ce3fa749f342088d5c5f6a22c8be1d6dc51bdb555a"),
    ("student_t3", "8x16x32", 20261130): ("3b54d71a7f68a781b8a465ca3eb98e5ab2b20405596a811879b026775cf75c22",
                                          "dfafee4388f080582585943c383f556e9f2474966e1a91f4824dadc8d0c064e9"),
    ("student_t3", "200x328x256", 20261130): ("dbe8fe885de3dc7deaa8e9915315f502884fabb501ac169535f94c252e574bba",
                                              "d0c5b8a021d7712c66c907fa7b3c3617fb3597629f06db4ec364056636ed2d49"),
    ("normal", "8x16x32", 7): ("a98ff17f0f1ba75496124be4989233e24b36696394e1797f68ec76c0236e7c0b",
                               "8979217d7e42bb7346d383f59a2b4d1c36fd8809f2f2361329ebf97840af8c37"),
    ("normal", "200x328x256", 7): ("b06e7615a30a225dede448ddc9972aea291f5e317094f8fa8083db0a75cf80a3",
                                   "f5e0fccf8ac3f90c396673c77294d47a042847d3a219ed9c41428524670525e2"),
    ("student_t3", "8x16x32", 7): ("c72d62aba7fef5e628d25957ff8987cf0c0aa43e24168ff66feaa7a6c3da7dc8",
                                   "076b7aea633311934f681e5bcfade7e9a952831dd35bfa43ea4b4186d92b9640"),
    ("student_t3", "200x328x256", 7): ("3ccd96c0110d9936c443e26ea4724b9421967ea0e0e284906129a8ae94ce5b91",
                                       "56192d6e6f51146fbaa4d2e5ecf273fdaee1e71dd5377e8d46899008f8ed0b8f"),
}
# a weight spanning 8 chunks of the default size, and the quantile on an exact grid reaching 2^-1022
GOLDEN_BIG_B = ("student_t3", 4096, 1024, 20261130, "b8fdc2e1604ef564cc681a76e2e87967ce4d437ca9117f7da2225184050dae14")
GOLDEN_QUANTILE_GRID = "466c3d219072b83d2f14f5a667201d79162a58094065bcd22fe4ccfa86d828e9"


def _shape(s):
    return tuple(int(x) for x in s.split("x"))


@pytest.mark.parametrize("dist,shape,seed", list(GOLDEN))
def test_golden_hashes(dist, shape, seed):
    M, N, K = _shape(shape)
    A, B = make_operands(dist, M, N, K, seed)
    assert A.dtype == B.dtype == torch.float32 and A.shape == (M, K) and B.shape == (N, K)
    got = (tensor_sha256(A), tensor_sha256(B))
    assert got == GOLDEN[dist, shape, seed], f"first values A {A.flatten()[:4].tolist()} B {B.flatten()[:4].tolist()}"


def test_golden_hash_of_a_many_chunk_weight():
    dist, rows, cols, seed, sha = GOLDEN_BIG_B
    assert rows * cols >= 8 * inputs.CHUNK
    assert tensor_sha256(make_matrix(dist, rows, cols, seed, "B")) == sha


def _quantile_grid():
    odd = np.arange(1, 1 << 20, 2, dtype=np.float64)
    return np.concatenate([np.ldexp(odd, -20), np.ldexp(1.0, -np.arange(2, 1023)), 1 - np.ldexp(1.0, -np.arange(2, 54)),
                           np.ldexp(3.0, -np.arange(3, 1000, 7))])  # every point exact


def test_golden_quantile_grid_covers_every_branch():
    p = _quantile_grid()
    q = np.minimum(p, 1 - p)
    assert (q > 0.075).any() and ((q < 0.075) & (q > 1.4e-11)).any() and (q < 1e-300).any()
    assert hashlib.sha256(normal_quantile(p).tobytes()).hexdigest() == GOLDEN_QUANTILE_GRID


# ---------------------------------------------------------------- an independent scalar reference

_M64 = (1 << 64) - 1


def _ref_keys(n, seed, dist, rows, cols, name):
    base = hashlib.sha256(repr((seed, dist, rows, cols, name)).encode()).digest()
    return [int.from_bytes(hashlib.sha256(base + s.to_bytes(4, "little")).digest()[:8], "little") for s in range(n)]


def _ref_uniform(key, i):
    z = (key + (i + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return ((z >> 12) + 0.5) / 2**52


def _ref_poly(c, x):
    acc = x * c[0] + c[1]
    for ci in c[2:]:
        acc = acc * x + ci
    return acc


def _ref_ln(x):
    m, e = math.frexp(x)
    if m < 0.7071067811865476:
        m, e = m + m, e - 1
    s = (m - 1.0) / (m + 1.0)
    return _ref_poly(tuple(1.0 / (2 * k + 1) for k in reversed(range(11))), s * s) * (s + s) + e * 0.6931471805599453


def _ref_quantile(p):
    q = p - 0.5
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        return _ref_poly(inputs._A, r) * q / _ref_poly(inputs._B, r)
    s = math.sqrt(-_ref_ln(p if q < 0 else 1.0 - p))
    z = _ref_poly(inputs._C, s - 1.6) / _ref_poly(inputs._D, s - 1.6) if s <= 5.0 else \
        _ref_poly(inputs._E, s - 5.0) / _ref_poly(inputs._F, s - 5.0)
    return -z if q < 0 else z


def _ref_element(dist, keys, i):
    z = [_ref_quantile(_ref_uniform(k, i)) for k in keys]
    if dist == "normal":
        return z[0]
    return z[0] / math.sqrt((z[1] * z[1] + z[2] * z[2] + z[3] * z[3]) / 3.0)


@pytest.mark.parametrize("dist,streams", [("normal", 1), ("student_t3", 4)])
def test_elements_match_a_plain_python_scalar_evaluation(dist, streams, monkeypatch):
    monkeypatch.setattr(inputs, "CHUNK", 50_000)  # chunk boundaries inside the matrix
    # plain CPython floats (one IEEE rounding per operation) give the very same bits as the numpy chunks
    rows, cols, seed = 300, 517, 3
    X = make_matrix(dist, rows, cols, seed, "B").flatten()
    keys = _ref_keys(streams, seed, dist, rows, cols, "B")
    for i in [0, 1, 2, 999, inputs.CHUNK - 1, inputs.CHUNK, 100_000, rows * cols - 1]:
        assert X[i].item() == np.float32(_ref_element(dist, keys, i)).item(), i
    # the tail branches too
    for p in [1e-300, 3e-200, 1e-12, 1e-11, 0.001, 0.07, 0.5 - 2**-40, 0.93, 1 - 1e-10, 1 - 2**-53]:
        assert normal_quantile(np.array([p]))[0] == _ref_quantile(p), p


# ---------------------------------------------------------------- determinism

def test_values_do_not_depend_on_chunk_size_or_threads(monkeypatch):
    want = {d: tensor_sha256(make_matrix(d, 200, 419, 5, "A200")) for d in ("normal", "student_t3")}
    for chunk, threads in [(1000, 3), (7, 2), (1 << 22, 1), (4096, 1)]:
        monkeypatch.setattr(inputs, "CHUNK", chunk)
        monkeypatch.setattr(inputs, "THREADS", threads)
        for d, sha in want.items():
            assert tensor_sha256(make_matrix(d, 200, 419, 5, "A200")) == sha, (d, chunk, threads)


def test_every_argument_changes_the_matrix_except_M_for_the_weight():
    base = make_matrix("normal", 16, 32, 1, "B")
    for other in [make_matrix("normal", 16, 32, 2, "B"), make_matrix("normal", 16, 32, 1, "A16"),
                  make_matrix("student_t3", 16, 32, 1, "B"), make_matrix("normal", 32, 16, 1, "B").reshape(16, 32)]:
        assert not torch.equal(base, other)
    assert torch.equal(make_operands("normal", 4, 16, 32, 1)[1], make_operands("normal", 64, 16, 32, 1)[1])
    assert make_matrix("normal", 0, 8, 1, "B").shape == (0, 8)


# ---------------------------------------------------------------- statistics

N_STAT = 1 << 20


def test_normal_moments_quantiles_and_independence():
    z = make_matrix("normal", 1024, 1024, 11, "stat").double().flatten().numpy()
    se = 1 / math.sqrt(N_STAT)
    assert abs(z.mean()) < 5 * se and abs(z.std() - 1) < 5 * se / math.sqrt(2)
    zs = np.sort(z)
    for level in [0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999]:
        expect = normal_quantile(np.array([level]))[0]
        sd = math.sqrt(level * (1 - level) / N_STAT) / (math.exp(-expect * expect / 2) / math.sqrt(2 * math.pi))
        assert abs(zs[int(level * N_STAT)] - expect) < 5 * sd, level
    assert np.abs(z).max() < 6.5 and (np.abs(z) > 4).mean() < 2e-4  # P(|Z| > 4) = 6.3e-5
    # neighbours and the operand of another name are uncorrelated
    other = make_matrix("normal", 1024, 1024, 11, "other").double().flatten().numpy()
    for a, b in [(z[1:], z[:-1]), (z, other)]:
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 * se


def test_student_t3_has_its_heavy_tails():
    t = make_matrix("student_t3", 1024, 1024, 11, "stat").double().flatten().numpy()
    x = 4 / math.sqrt(3)  # P(|T3| > 4) from the closed-form CDF of t with 3 degrees of freedom
    p4 = 1 - 2 * (x / (1 + x * x) + math.atan(x)) / math.pi
    assert abs((np.abs(t) > 4).mean() - p4) < 5 * math.sqrt(p4 / N_STAT)  # 0.028, vs 6.3e-5 for a normal
    assert abs(np.median(np.abs(t)) - 0.7648923284) < 0.005  # the 0.75 quantile of t3
    assert abs(np.median(t)) < 0.005
    kurt = ((t - t.mean()) ** 4).mean() / t.var() ** 2
    assert kurt > 10  # a normal has 3; t3's is infinite


def test_quantile_matches_torch_ndtri_into_both_tails():
    p = np.concatenate([np.logspace(-300, np.log10(0.5), 100_001), 1 - np.logspace(-16, np.log10(0.5), 50_001),
                        np.linspace(1e-4, 1 - 1e-4, 100_001)])
    z = normal_quantile(p)
    ref = torch.special.ndtri(torch.from_numpy(p)).numpy()
    assert np.abs(z[0] - ref[0]) < 1e-13 and z[0] < -37  # p = 1e-300
    rel = np.abs(z - ref) / np.maximum(np.abs(ref), 1e-3)
    assert rel.max() < 1e-14 and np.abs(z - ref).max() < 1e-12


def test_log_from_arithmetic_is_accurate():
    x = np.concatenate([np.logspace(-307, 0, 100_001), np.linspace(0.5, 2.0, 10_001), [2.0**-1022, 1.0]])
    ref = np.log(x)
    assert np.all(np.abs(inputs._ln(x) - ref) <= 4e-16 * np.maximum(np.abs(ref), 1.0))


def test_uniforms_are_exact_and_in_the_open_interval():
    bits = np.array([0, 1, (1 << 12) - 1, 1 << 12, (1 << 64) - 1, 0x8000000000000000], dtype=np.uint64)
    u = inputs._uniform(bits)
    assert u[0] == u[1] == u[2] == 2.0**-53 and u[3] == 3 * 2.0**-53 and u[4] == 1 - 2.0**-53 and u[5] == 0.5 + 2.0**-53
    assert np.all((u > 0) & (u < 1))


# ---------------------------------------------------------------- no transcendental in the generator

FORBIDDEN = {"log", "log1p", "log2", "log10", "exp", "expm1", "exp2", "pow", "power", "float_power", "cbrt",
             "sin", "cos", "tan", "tanh", "arctanh", "atanh", "erf", "erfc", "erfinv", "ndtri", "lgamma",
             "randn", "rand", "randint", "random", "normal", "Generator", "manual_seed", "default_rng", "seed"}


def test_generator_uses_no_transcendental_or_library_random():
    tree = ast.parse((REPO / "harness" / "inputs.py").read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in FORBIDDEN:
                bad.append(f"line {node.lineno}: call of {name}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            bad.append(f"line {node.lineno}: ** (libm pow)")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad += [f"line {node.lineno}: import {m}" for m in mods if m.split(".")[0] in {"math", "cmath", "random", "scipy"}]
    assert not bad, bad
    # in the generator functions torch and float32 appear only for the output: no float32 arithmetic, no torch RNG
    gen = {"_stream_keys", "_bits", "_uniform", "_horner", "_ln", "normal_quantile", "_normal", "_student_t3", "make_matrix"}
    uses = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in gen):
        for node in (n for stmt in fn.body for n in ast.walk(stmt)):  # the code, not the annotations
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    (node.value.id == "torch" or "float32" in node.attr or "float16" in node.attr):
                uses.add((fn.name, f"{node.value.id}.{node.attr}"))
    assert uses == {("make_matrix", "np.float32"), ("make_matrix", "torch.from_numpy")}, uses


# ---------------------------------------------------------------- storage

@pytest.fixture
def saved(tmp_path):
    A, B = make_operands("student_t3", 64, 96, 128, 1)
    path = tmp_path / "inputs" / "fp32.pt"
    man = save_operands({"A": A, "B": B}, path)
    return path, man, file_sha256(path), (A, B)


def test_save_load_round_trip_with_both_hashes(saved):
    path, man, fsha, (A, B) = saved
    assert man == manifest({"A": A, "B": B}) and man["A"] == {"shape": [64, 128], "dtype": "float32", "sha256": tensor_sha256(A)}
    assert fsha == hashlib.sha256(path.read_bytes()).hexdigest() == file_sha256(str(path), block=1000)
    ops = load_operands(path, man, expected_file_sha256=fsha)
    assert torch.equal(ops["A"], A) and torch.equal(ops["B"], B)
    assert sorted(os.listdir(path.parent)) == ["fp32.pt"]  # no temp file left behind
    ops["A"] += 1  # a loaded (memory-mapped) tensor is private: writing to it leaves the file alone
    assert file_sha256(path) == fsha and torch.equal(load_operands(path)["A"], A)


def test_save_writes_only_the_tensor_not_its_base(tmp_path):
    big = torch.zeros(1 << 20)
    save_operands({"x": big[:16]}, tmp_path / "v.pt")
    assert (tmp_path / "v.pt").stat().st_size < 10_000
    assert torch.equal(load_operands(tmp_path / "v.pt")["x"], torch.zeros(16))


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


def _assert_names_file_and_fix(err, path):
    msg = str(err.value)
    assert str(path) in msg and f"snakemake --cores 1 -f {path}" in msg, msg  # as printed, it runs
    assert isinstance(err.value, ValueError)


def test_flipped_byte_in_the_middle_is_caught(saved):
    path, man, fsha, _ = saved
    _flip(path, path.stat().st_size // 2)  # inside a tensor's data: torch.load alone does not notice
    with pytest.raises(CorruptInput, match="sha256 .* does not match the recorded " + fsha) as err:
        load_operands(path, man, expected_file_sha256=fsha)
    _assert_names_file_and_fix(err, path)
    with pytest.raises(CorruptInput, match=r"tensors \['B'\] do not match their recorded sha256") as err:
        load_operands(path, man)
    _assert_names_file_and_fix(err, path)


def test_a_file_is_hashed_once_on_a_host_even_after_snakemake_touches_it(saved, monkeypatch):
    """The build job records the hash on the file; snakemake then touches its outputs (atime = mtime = now).
    A reader takes the recorded hash without reading the file; a write since makes it hash the file again."""
    path, man, fsha, _ = saved
    if inputs.verified_file_sha256(path) != fsha or inputs.recorded_sha256(path) != fsha:
        pytest.skip("this filesystem keeps no extended attributes")
    st = path.stat()
    later = st.st_mtime_ns + 5_000_000_000
    os.utime(path, ns=(later, later))  # what snakemake's touch does when the job ends
    hashed = []
    monkeypatch.setattr(inputs, "file_sha256", lambda p, *a, **k: hashed.append(p) or fsha)
    assert inputs.verified_file_sha256(path) == fsha and hashed == []
    assert load_operands(path, man, expected_file_sha256=fsha) and hashed == []
    monkeypatch.undo()

    mid = st.st_size // 2
    flipped = bytes([path.read_bytes()[mid] ^ 0x20])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 1))  # set back: a copy of older times, not a touch
    assert inputs.recorded_sha256(path) is None
    inputs.remember_sha256(path, fsha)
    with open(path, "r+b") as f:  # written in place, same size: the modification time alone moves
        f.seek(mid)
        f.write(flipped)
    assert inputs.recorded_sha256(path) is None
    now = path.stat().st_mtime_ns
    os.utime(path, ns=(now, now))  # a read and a write within one tick of the file clock look like a touch
    assert inputs.recorded_sha256(path) is None  # the sample (here the whole file) tells them apart
    with pytest.raises(CorruptInput, match="does not match the recorded " + fsha):
        load_operands(path, man, expected_file_sha256=fsha)


def test_the_sample_of_a_large_file_holds_its_first_and_last_blocks(tmp_path):
    big = tmp_path / "big.bin"
    data = bytearray(os.urandom(4 << 20))
    big.write_bytes(bytes(data))
    sample = inputs._sample_sha256(big, len(data))
    for offset in (0, len(data) - 1):
        changed = bytearray(data)
        changed[offset] ^= 1
        big.write_bytes(bytes(changed))
        assert inputs._sample_sha256(big, len(data)) != sample, offset


def test_flipped_byte_in_the_pickle_is_unreadable_not_a_weights_only_puzzle(saved):
    path, man, _, _ = saved
    _flip(path, path.read_bytes().index(b"_rebuild_tensor") + 3)
    with pytest.raises(CorruptInput, match="unreadable: UnpicklingError: WeightsUnpickler error") as err:
        load_operands(path)
    _assert_names_file_and_fix(err, path)
    assert "weights_only` set to `False`" not in str(err.value)


@pytest.mark.parametrize("keep", [0, 3, 100, "half", -22])
def test_truncated_file_is_unreadable(saved, keep):
    path, man, fsha, _ = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep == "half" else keep])
    with pytest.raises(CorruptInput, match="unreadable: ") as err:
        load_operands(path, man)
    _assert_names_file_and_fix(err, path)
    with pytest.raises(CorruptInput, match="sha256"):
        load_operands(path, man, expected_file_sha256=fsha)


def test_missing_file(tmp_path):
    path = tmp_path / "results" / "inputs" / "normal" / "8x8x8" / "fp32.pt"
    with pytest.raises(CorruptInput, match="missing") as err:
        load_operands(path, expected_file_sha256="0" * 64)
    _assert_names_file_and_fix(err, path)


def test_missing_tensor_and_wrong_content(saved, tmp_path):
    path, man, _, (A, _) = saved
    with pytest.raises(CorruptInput, match=r"\['C'\]"):
        load_operands(path, {**man, "C": man["A"]})
    torch.save([A], tmp_path / "list.pt")
    with pytest.raises(CorruptInput, match="not a dict of tensors"):
        load_operands(tmp_path / "list.pt")


def test_legacy_format_loads_without_mmap(tmp_path):
    t = torch.arange(6.0)
    torch.save({"t": t}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(tmp_path / "old.pt")
    assert torch.equal(load_operands(tmp_path / "old.pt", manifest({"t": t}))["t"], t)


def test_a_failed_save_leaves_the_old_file_and_no_temp(saved, monkeypatch):
    path, man, fsha, _ = saved

    def broken_save(obj, f):
        f.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_operands({"A": torch.ones(3)}, path)
    assert sorted(os.listdir(path.parent)) == ["fp32.pt"] and file_sha256(path) == fsha


def _race(path, versions):
    barrier, errors, mans = threading.Barrier(len(versions)), [], {}

    def write(i):
        try:
            barrier.wait()
            mans[i] = save_operands(versions[i], path)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return mans, errors


def test_two_concurrent_writers_to_one_path(tmp_path):
    path = tmp_path / "shared.pt"
    versions = {i: {"A": make_matrix("normal", 256, 512, i, "A")} for i in range(2)}
    for _ in range(5):
        mans, errors = _race(path, versions)
        assert not errors and sorted(mans) == [0, 1]
        got = manifest(load_operands(path))
        assert got in (mans[0], mans[1])  # one writer's complete file, never a mix
        assert sorted(os.listdir(tmp_path)) == ["shared.pt"]
