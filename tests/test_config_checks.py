"""Issue 30: bad configs refused at planning (harness.plan.validate), each message naming the key and the fix.
Unit tier: nothing compiles, no Snakemake starts (the compiled-resource check is fed a fake kernel)."""
import copy
import math

import pandas as pd
import pytest
import yaml
from conftest import REPO, tiny_config

from harness import compile as kcompile
from harness.metrics import TOLERANCE_KEYS, gated_metrics
from harness.plan import (
    ConfigError,
    Plan,
    emulation_peak_bytes,
    load_config_text,
    reference_signature,
    validate,
)
from kernels.registry import VARIANTS, get_variant, load_all
from kernels.smem import kernel_smem_bytes
from kernels.tiles import SMEM_LIMIT_BYTES, parse_shape, parse_tile

FP8_TOL = {"total_rel_fro": 0.05, "total_calc_diff": 1.5e-3, "kernel_rel_fro": 0.005, "kernel_calc_diff": 1.0e-4}


def refused(cfg: dict) -> str:
    with pytest.raises(ConfigError) as e:
        Plan(validate(cfg, root=REPO))
    assert str(e.value).startswith("invalid config:\n  ")
    return str(e.value)


def default_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_the_default_and_tiny_configs_pass():
    for cfg in (default_config(), tiny_config()):
        Plan(validate(cfg, root=REPO))


# ---------------------------------------------------------------- 1. one spelling per tile and shape


@pytest.mark.parametrize("name,fix", [
    ("m0128n128k128_s3_t128", "write 'm128n128k128_s3_t128'"),
    ("m128n128k128_s03_t128", "write 'm128n128k128_s3_t128'"),
    ("m128n128k128_s3_t128_z0", "write 'm128n128k128_s3_t128'"),
    ("m128n192k128_s4_t384_p0", "write 'm128n192k128_s4_t384'"),
    ("m128n128k128_s3_t128_wsq", "write 'm128n128k128_s3_t128'"),  # Square is the default policy
    ("m128n128k128_s3_t128_wrwo", "unknown or misplaced suffix '_wrwo'"),
    ("m64n64k64_s2_t128\n", "unknown or misplaced suffix '\\n'"),
    ("m64n16k256_s10_t256_swapab_p2", "unknown or misplaced suffix '_swapab_p2'"),
    ("m128n128k128_s3_t2048", "threads must be at most 1024"),
])
def test_a_tile_name_has_one_spelling(name, fix):
    with pytest.raises(ValueError, match="bad tile name") as e:
        parse_tile(name)
    assert fix in str(e.value)


def test_canonical_tile_names_parse_and_render_back():
    for name in ("m128n256k128_s3_t256_wrow_z8", "m64n16k256_s10_t256_p2_swapab", "m128n128k128_s3_t128_wcol"):
        assert parse_tile(name).name == name


@pytest.mark.parametrize("name,fix", [
    ("064x64x128", "write '64x64x128'"),
    ("64x064x128", "write '64x64x128'"),
    ("64x64x128\n", "expected MxNxK"),
    ("6\u0664x64x128", "expected MxNxK"),  # an Arabic-Indic digit, which int() reads
])
def test_a_shape_name_has_one_spelling(name, fix):
    with pytest.raises(ValueError, match="bad shape") as e:
        parse_shape(name)
    assert fix in str(e.value)


def test_config_refuses_a_non_canonical_tile_in_any_tile_list():
    cfg = tiny_config()
    cfg["variants"]["fp8_e4m3"]["tiles"]["default"] = ["m64n64k64_s2_t128_z0"]
    msg = refused(cfg)
    assert "variants.fp8_e4m3.tiles.default.0: bad tile name 'm64n64k64_s2_t128_z0'" in msg
    assert "write 'm64n64k64_s2_t128'" in msg
    cfg = default_config()
    cfg["variants"]["fp8_e4m3_ws"]["tiles"]["sm_90a"] = {c["name"]: ["m64n16k256_s10_t256_swapab"]
                                                          for c in cfg["shape_classes"]}
    cfg["variants"]["fp8_e4m3_ws"]["tiles"]["sm_90a"]["m16"] = ["m064n16k256_s10_t256_swapab"]
    assert "variants.fp8_e4m3_ws.tiles.sm_90a.m16.0: bad tile name" in refused(cfg)


@pytest.mark.parametrize("edit,key", [
    (lambda c: c["sweeps"].update(cpu=["64x128x128\n"]), "sweeps.cpu.0: bad shape"),
    (lambda c: c["variants"]["fp8_e4m3"].update(shapes={"cpu": ["64x128x128", "48x64x128\n"]}),
     "variants.fp8_e4m3.shapes.cpu.1: bad shape"),
    (lambda c: c["timing"]["pairing"].update(aa_shapes=["64x128x128\n"]), "timing.pairing.aa_shapes.0: bad shape"),
])
def test_config_refuses_a_non_canonical_shape(edit, key):
    cfg = tiny_config()
    edit(cfg)
    assert key in refused(cfg)


# ---------------------------------------------------------------- 2. each tile once per list


def test_a_tile_listed_twice_is_refused():
    cfg = tiny_config()
    cfg["variants"]["fp8_e4m3"]["tiles"]["default"] = ["m64n64k64_s2_t128", "m128n128k128_s3_t128", "m64n64k64_s2_t128"]
    assert ("variants.fp8_e4m3.tiles.default.2: tile m64n64k64_s2_t128 is listed twice "
            "(also at variants.fp8_e4m3.tiles.default.0)") in refused(cfg)
    cfg = default_config()
    cfg["variants"]["int4_ws"]["tiles"]["sm_90a"] = {c["name"]: ["m64n64k128_s8_t256"] for c in cfg["shape_classes"]}
    cfg["variants"]["int4_ws"]["tiles"]["sm_90a"]["m64"] = ["m64n64k128_s8_t256", "m64n64k128_s8_t256"]
    assert "variants.int4_ws.tiles.sm_90a.m64.1: tile m64n64k128_s8_t256 is listed twice" in refused(cfg)


def test_one_tile_in_two_shape_classes_is_fine():
    cfg = default_config()
    cfg["variants"]["int4_ws"]["tiles"]["sm_90a"] = {c["name"]: ["m64n64k128_s8_t256"] for c in cfg["shape_classes"]}
    validate(cfg, root=REPO)


# ---------------------------------------------------------------- 3. shared memory (and registers) per arch


def test_a_tile_over_the_shared_memory_of_its_target_is_refused():
    cfg = tiny_config()
    cfg["variants"]["fp8_e4m3"]["tiles"] = {"default": ["m64n64k64_s2_t128"], "sm_90a": ["m512n512k256_s4_t128"]}
    msg = refused(cfg)
    assert "variants.fp8_e4m3.tiles.sm_90a: tile m512n512k256_s4_t128 on sm_90a: needs 1048576" in msg
    assert "more than the 232448 a block can have on sm_90a" in msg
    # the default list is checked for every target it covers: 147456 bytes fit sm_90a, not sm_89's 99 KB
    cfg = tiny_config() | {"targets": ["sm_89", "sm_90a"]}
    cfg["variants"]["fp8_e4m3"]["tiles"] = {"default": ["m128n256k128_s3_t128"]}
    assert "variants.fp8_e4m3.tiles.default: tile m128n256k128_s3_t128 on sm_89: needs 147456 bytes" in refused(cfg)
    cfg["variants"]["fp8_e4m3"]["tiles"]["sm_89"] = ["m128n128k128_s3_t128"]  # sm_89 listed: default is sm_90a's only
    validate(cfg, root=REPO)


def test_a_target_the_variant_declares_unsupported_is_not_size_checked():
    cfg = tiny_config() | {"targets": ["sm_89", "sm_90a"]}
    # fp8_e4m3_ws is declared unsupported on sm_89: its default tile is recorded there, not compiled
    cfg["variants"] = {"fp8_e4m3_ws": {"tiles": {"default": ["m128n256k128_s3_t384_z16"]}, "tolerance": FP8_TOL}}
    validate(cfg, root=REPO)


def test_every_tilelang_kernel_has_a_shared_memory_rule():
    load_all()
    tile = parse_tile("m128n128k128_s3_t256")
    tilelang = [v for v in VARIANTS.values() if v.kernel is not None]
    assert tilelang
    for v in tilelang:
        assert kernel_smem_bytes(v.kernel, tile) > 0, v.name
    assert set(SMEM_LIMIT_BYTES) >= {"sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"}
    assert SMEM_LIMIT_BYTES["sm_89"] == 101376 and SMEM_LIMIT_BYTES["sm_90a"] == SMEM_LIMIT_BYTES["sm_100a"] == 232448


def test_shared_memory_estimates_match_the_compiled_kernels():
    """Each estimate against what TileLang compiled (the committed H200 run's compile matrix): at most
    1 KB under (buffer alignment), never over."""
    cm = pd.read_csv(REPO / "results/published/h200/compile_matrix.csv")
    cm = cm[(cm["status"] == "ok") & cm["smem_dynamic_bytes"].notna()].drop_duplicates(["variant", "target", "tile"])
    assert len(cm) > 50
    for r in cm.itertuples():
        est = kernel_smem_bytes(get_variant(r.variant).kernel, parse_tile(r.tile))
        assert 0 <= r.smem_dynamic_bytes - est <= 1024, (r.variant, r.target, r.tile, est, r.smem_dynamic_bytes)


def test_ws_register_budgets_must_fit_the_register_file(monkeypatch):
    from kernels import warp_specialized as ws

    tile = parse_tile("m128n256k128_s3_t384_z16")
    assert ws.tile_problem(tile, 0) is None
    problem = ws.tile_problem(tile, 0, ws.RegisterBudget("too generous", 40, {1: 240, 2: 240}))
    assert "setmaxnreg budgets 40 + 2 x 240" in problem and "65536" in problem and "too generous" in problem


class FakeKernel:
    compile_flags = None

    def get_kernel_source(self):
        # what the fp8_e4m3 instruction check looks for on sm_90a (kernels/fp8.py FP8_WGMMA_SS)
        return ("extern __shared__ uchar buf_dyn_shmem[]; "
                "tl::wgmma_ss<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32>")


def _compile_with(monkeypatch, tmp_path, resources: dict, variant="fp8_e4m3", tile="m64n64k64_s2_t128", arch="sm_90a"):
    monkeypatch.setattr(kcompile, "build", lambda *a, **k: FakeKernel())
    monkeypatch.setattr(kcompile, "export_ptx", lambda kernel, path: None)
    monkeypatch.setattr(kcompile, "sass_record", lambda kernel, artifacts: {
        "sass_mma": {"QGMMA.64x64x32.F32.E4M3.E4M3": 8}, "registers": resources.get("registers", 90),
        "smem_static_bytes": resources.get("static", 2048)})
    monkeypatch.setattr(kcompile, "dynamic_smem_bytes", lambda kernel: resources["dynamic"])
    return kcompile.compile_record(get_variant(variant), 256, 256, 512, parse_tile(tile), arch, tmp_path)


def test_a_compiled_kernel_over_the_targets_shared_memory_fails(monkeypatch, tmp_path):
    rec = _compile_with(monkeypatch, tmp_path, {"dynamic": 1 << 20})
    assert rec["status"] == "failed" and rec["smem_dynamic_bytes"] == 1 << 20
    assert "needs 1048576 + 2048 static bytes of shared memory, more than the 232448 a block can have on sm_90a" in rec["reason"]
    # at the limit exactly: ok
    assert _compile_with(monkeypatch, tmp_path, {"dynamic": 232448 - 2048})["status"] == "ok"


def test_a_compiled_kernel_over_the_register_file_fails(monkeypatch, tmp_path):
    rec = _compile_with(monkeypatch, tmp_path, {"dynamic": 65536, "registers": 168}, tile="m128n128k128_s3_t512")
    assert rec["status"] == "failed" and "168 registers x 512 threads = 86016, more than the 65536" in rec["reason"]


def test_resource_check_reads_a_record():
    assert kcompile.resource_check("sm_89", {"smem_dynamic_bytes": 101376, "smem_static_bytes": 0}, 128) == ""
    why = kcompile.resource_check("sm_89", {"smem_dynamic_bytes": 101376, "smem_static_bytes": 16}, 128)
    assert "more than the 101376 a block can have on sm_89" in why
    assert "no shared-memory limit known for sm_88" in kcompile.resource_check("sm_88", {"smem_dynamic_bytes": 1}, 128)
    assert kcompile.resource_check("sm_90a", {"smem_dynamic_bytes": None}, 128) == ""  # unknown: the estimate stands


# ---------------------------------------------------------------- 4. tolerances per family


@pytest.mark.parametrize("entry,tolerance,key", [
    ("fp8_e5m2", {}, "variants.fp8_e5m2.tolerance.total_rel_fro: missing"),
    ("fp8_e5m2", {k: v for k, v in FP8_TOL.items() if k != "kernel_calc_diff"}, "variants.fp8_e5m2.tolerance.kernel_calc_diff: missing"),
    ("cublas_bf16", {"kernel_rel_fro": 0.005}, "variants.cublas_bf16.tolerance.total_rel_fro: missing"),
    ("int4_mma", {"kernel_rel_fro": 1e-9, "total_rel_fro": 0.3}, "variants.int4_mma.tolerance.total_rel_fro: not a metric int4"),
    ("int4_mma", {}, "variants.int4_mma.tolerance.kernel_rel_fro: missing"),
    ("fp8_e5m2", FP8_TOL | {"total_rel_fro": 0}, "variants.fp8_e5m2.tolerance.total_rel_fro: 0 is less than or equal"),
])
def test_every_entry_has_a_tolerance_for_each_metric_it_is_gated_on(entry, tolerance, key):
    cfg = default_config()
    cfg["variants"][entry]["tolerance"] = tolerance
    assert key in refused(cfg)


def test_an_integer_gemm_is_gated_on_its_kernel_error_only():
    """Its product is checked bit for bit; its total error is its format's (reported, not gated)."""
    load_all()
    for v in VARIANTS.values():
        assert gated_metrics(v) == (("kernel_rel_fro",) if v.exact_reference else TOLERANCE_KEYS), v.name
    assert gated_metrics(get_variant("int4_ws")) == ("kernel_rel_fro",)


# ---------------------------------------------------------------- 5. compare_with: existing result sets only


def test_compare_with_a_folder_that_does_not_exist_is_refused():
    cfg = tiny_config()
    cfg["report"]["compare_with"] = ["results/published/h200", "results/h100"]
    msg = refused(cfg)
    assert "report.compare_with.1: results/h100 does not exist" in msg
    assert "snakemake results/<platform>/tidy.parquet" in msg and "results/published/<platform>/points/<family>" in msg


def test_compare_with_takes_a_published_or_a_collected_folder(tmp_path):
    cfg = tiny_config()
    (tmp_path / "results/published").mkdir(parents=True)
    (tmp_path / "results/published/h200").symlink_to(REPO / "results/published/h200", target_is_directory=True)
    (tmp_path / "results/h100").mkdir()
    cfg["report"]["compare_with"] = ["results/published/h200", "results/h100"]
    with pytest.raises(ConfigError, match="report.compare_with.1: results/h100 holds neither points"):
        validate(copy.deepcopy(cfg), root=tmp_path)
    for f in ("tidy.parquet", "compile_matrix.csv"):
        (tmp_path / "results/h100" / f).write_bytes(b"")
    validate(cfg, root=tmp_path)
    signature = reference_signature(cfg["report"]["compare_with"], root=tmp_path)
    assert {"results/h100/tidy.parquet", "results/h100/compile_matrix.csv"} < set(signature)
    assert any(k.startswith("results/published/h200/points/") for k in signature)


# ---------------------------------------------------------------- 6. shape classes that can never match


@pytest.mark.parametrize("classes,key", [
    ([{"name": "m256", "M_max": 256}, {"name": "m16", "M_max": 16}, {"name": "any"}],
     "shape_classes.1: class m16 never matches: every shape within its bounds is within those of m256 (shape_classes.0)"),
    ([{"name": "small", "MN_max": 1 << 20}, {"name": "tiny", "M_max": 64, "N_max": 64}, {"name": "any"}],
     "shape_classes.1: class tiny never matches"),
    ([{"name": "m64", "M_max": 64}, {"name": "thin", "MN_max": 64}, {"name": "any"}],
     "shape_classes.1: class thin never matches"),
    ([{"name": "all"}, {"name": "m16", "M_max": 16}, {"name": "any"}], "shape_classes.1: class m16 never matches"),
])
def test_a_shape_class_shadowed_by_an_earlier_one_is_refused(classes, key):
    cfg = tiny_config() | {"shape_classes": classes}
    assert key in refused(cfg)


def test_narrower_classes_first_pass():
    cfg = tiny_config() | {"shape_classes": [{"name": "m16", "M_max": 16}, {"name": "k", "K_max": 1024},
                                             {"name": "small", "MN_max": 1 << 24}, {"name": "m64n64", "M_max": 64, "N_max": 1 << 30},
                                             {"name": "any"}]}
    validate(cfg, root=REPO)


# ---------------------------------------------------------------- 7. the CPU sweep's memory


def test_a_cpu_shape_beyond_the_memory_bound_is_refused():
    cfg = tiny_config()
    cfg["sweeps"]["cpu"] = ["64x128x128", "65536x65536x4096"]
    msg = refused(cfg)
    need = emulation_peak_bytes(65536, 65536, 4096) / 2**30
    assert need > 64
    assert f"sweeps.cpu.1: shape 65536x65536x4096: its CPU emulation needs about {need:.1f} GiB" in msg
    assert "more than cpu_memory_gib 16" in msg
    cfg = tiny_config()
    cfg["variants"]["cublas_bf16"]["shapes"] = {"cpu": ["16384x16384x16384"]}
    assert "variants.cublas_bf16.shapes.cpu.0: shape 16384x16384x16384" in refused(cfg)
    cfg["cpu_memory_gib"] = 64  # the bound is the config's to raise
    validate(cfg, root=REPO)
    assert math.isclose(emulation_peak_bytes(256, 256, 256), 16 * 2 * 256 * 256 + 64 * 256 * 256)


# ---------------------------------------------------------------- 8. messages: schema alternatives, YAML syntax


def test_a_bad_tile_list_says_which_forms_are_allowed():
    cfg = tiny_config()
    cfg["variants"]["fp8_e4m3"]["tiles"]["default"] = ["m64n64k64_s2"]
    msg = refused(cfg)
    assert "is not valid under any of the given schemas" not in msg
    assert "variants.fp8_e4m3.tiles.default: allowed: a list of tile names for every shape" in msg
    assert "or a mapping shape class -> list of tile names" in msg
    assert "variants.fp8_e4m3.tiles.default.0: bad tile name 'm64n64k64_s2': expected m<M>n<N>k<K>_s<stages>_t<threads>" in msg
    cfg["variants"]["fp8_e4m3"]["tiles"]["default"] = "m64n64k64_s2_t128"
    assert "(got 'm64n64k64_s2_t128')" in refused(cfg)


def test_an_any_of_failure_names_the_alternatives():
    cfg = tiny_config()
    cfg["platforms"]["h100"]["cluster"].pop("gpu_model")
    msg = refused(cfg)
    assert "platforms.h100.cluster: allowed: gpu_model (--gpus=<model>:1); or constraint (a node feature, sbatch -C)" in msg


@pytest.mark.parametrize("text,where", [
    ("seed: 1\nrun_on: [cpu\ntargets: [sm_90a]\n", ":3:8: while parsing a flow sequence expected ',' or ']'"),
    ("seed: 1\n  run_on: [cpu]\n", ":2:9: mapping values are not allowed here"),
    ("seed: 1\nvariants:\n  fp8_e4m3: {}\n  fp8_e4m3: {}\n",
     ":4:3: while constructing a mapping found duplicate key 'fp8_e4m3' (first at line 3)"),
    ("- seed\n", ":1:1: the config must be a mapping"),
])
def test_a_yaml_error_gives_file_line_and_column(tmp_path, text, where):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config_text(path)
    assert f"{path}{where}" in str(e.value)


def test_load_config_text_reads_the_default_config():
    assert load_config_text(REPO / "config.yaml") == default_config()
