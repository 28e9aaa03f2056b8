"""Tile selection: which tile a run times for a (platform, variant, shape), chosen without a GPU.

Three sources, in this order (``choose``):

1. **config overrides**: tiles listed for the target in config.yaml (``variants.<v>.tiles.<target>``), kept
   for experiments;
2. **the tuned table**: the winner of a ``tune`` job for exactly this (variant, shape, arch, GPU, TileLang,
   nvcc, kernel source), from this checkout's results/<platform>/tuning/ or the committed
   results/published/<platform>/tuning/; a record whose key no longer matches is stale and not used;
3. **the model**: the variant's tiles for the shape (kernels/tile_space.py) ranked by ``predict_us``, a
   cost model of the platform (SM count, shared memory, wave quantization, per-SM tensor rate, latency
   and bandwidth), whose per-variant constants are fitted to that platform's measurements (``calibrate``).

Design and numbers: docs/design/tile_selection.md.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness.records import CALIBRATION, TUNE, DamagedFile, read_json
from kernels.formats import ceil_div
from kernels.registry import Variant, bytes_per_element
from kernels.tile_space import candidates
from kernels.tiles import Tile, parse_shape, parse_tile

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the cost model
@dataclass(frozen=True)
class Constants:
    """A variant's fitted constants on one platform (``calibrate``), each with a physical meaning:

    - ``mma_eff``: fraction of the datasheet tensor rate a wide tile's wgmma stream reaches;
    - ``n_half``: the block_N at which that rate halves (per-instruction overhead of narrow wgmma);
    - ``one_consumer``: rate of a 64-row tile (one consumer warpgroup) relative to two;
    - ``latency_us``: the load latency the ring's stages in flight hide (Little's law: a K block per
      latency/stages in flight);
    - ``sm_GBps``: the most one SM pulls from L2/HBM;
    - ``tile_us``: per-tile cost outside the K loop (ring fill after the epilogue, the store);
    - ``hbm_eff``: fraction of the datasheet HBM bandwidth the kernel streams its unique bytes at;
    - ``kblock_us``: per K block, the ring's barrier round trip and the wgmma batch's issue and wait (in a
      kernel of resident CTAs: the latency of one CTA's chain of a K block, load wait, decode, wgmma and its
      wait, which other CTAs on the SM hide but the CTA itself does not);
    - ``kblock_issue_us``: per K block of a kernel of resident CTAs, the issue time of what does not scale with
      the block (scale loads, addresses, barriers, the wgmma fence and wait), which every CTA on the SM spends;
    - ``held_stages``: ring stages the consumers hold, not in flight (a warp-specialized consumer: two, one
      wgmma batch retiring and one running; fewer where a kernel has a second, deeper ring, as int4_ws's
      packed one);
    - ``split_us``: per CTA of a K split (a kernel of resident CTAs), the cluster's reduction (its barrier waits
      and the exchange of partial sums), spent while the CTA holds its place on the SM, so CTAs sharing an SM
      pay it in turn;
    - ``launch_us``: launch and tail, once per call;
    - ``decode_Gps``: weights one SM decodes per second, in G (a kernel that decodes its weight in registers:
      the W4A16 kernels; about 5 instructions per pair of weights at 128 lanes per clock)."""

    mma_eff: float = 0.80
    n_half: float = 12.0
    one_consumer: float = 0.90
    latency_us: float = 1.2
    sm_GBps: float = 60.0
    tile_us: float = 0.8
    hbm_eff: float = 0.85
    kblock_us: float = 0.05
    held_stages: float = 2.0
    launch_us: float = 4.0
    decode_Gps: float = 100.0
    kblock_issue_us: float = 0.07
    split_us: float = 0.0

    FITTED = ("mma_eff", "n_half", "one_consumer", "latency_us", "sm_GBps", "tile_us", "hbm_eff", "kblock_us",
              "held_stages")
    # a kernel of resident CTAs (``TileSpace.ctas_per_sm``: the W4A16 kernels) has no 64-row consumer rate but
    # a decode rate
    FITTED_RESIDENT = ("mma_eff", "n_half", "latency_us", "sm_GBps", "tile_us", "hbm_eff", "kblock_us",
                       "held_stages", "decode_Gps", "kblock_issue_us", "split_us")


def resident(variant: Variant) -> bool:
    """Whether a variant's kernel runs resident CTAs (``TileSpace.ctas_per_sm``), modelled by ``predict_resident_us``."""
    return variant.tile_space is not None and variant.tile_space.ctas_per_sm is not None


def fitted_constants(variant: Variant) -> tuple[str, ...]:
    """The constants ``calibrate`` fits for a variant: those its kernel's model reads."""
    return Constants.FITTED_RESIDENT if resident(variant) else Constants.FITTED


# A kernel of resident CTAs before any fit of its own: ``calibrate`` fitted to 48 tiles of dequant_w4_int4_sym_g128
# (panel-arranged weight) at 1x8192x8192, 1x4096x14336, 16x8192x8192 and 16x28672x8192, timed by harness.tryout on
# an H200 on 2026-12-07 (docs/design/dequant_w4.md), with hbm_eff held at its default: median |log error| 0.07,
# worst 0.23, and the fastest timed tile picked at two of the four shapes, within 1.11x at the others. split_us came
# later, with the others held: the value that best gives the measured ratios of eight pairs of tiles with and without
# a split (rounds 10-12, H100 and H200; docs/design/dequant_w4.md, round 15).
RESIDENT_DEFAULTS = dict(mma_eff=0.81, n_half=10.1, latency_us=0.66, sm_GBps=102.0, tile_us=0.58, kblock_us=0.24,
                         held_stages=0.64, decode_Gps=141.0, kblock_issue_us=0.044, split_us=0.7)


def default_constants(variant: Variant) -> Constants:
    """A variant's constants before any fit: the physical defaults, or for a kernel of resident CTAs those fitted
    to the W4A16 kernel on an H200 (``RESIDENT_DEFAULTS``)."""
    return Constants(**RESIDENT_DEFAULTS) if resident(variant) else Constants()


@dataclass(frozen=True)
class PlatformModel:
    """What the model knows of a GPU platform (config ``platforms.<slug>``): SMs, datasheet peaks, HBM, arch."""

    slug: str
    arch: str
    sms: int
    peak: dict
    hbm_TBps: float
    constants: dict = field(default_factory=dict)  # variant -> Constants
    cluster_sms: int | None = None  # SMs clusters of 4 or more CTAs fill (None: all of them)

    @classmethod
    def from_config(cls, slug: str, spec: dict, calibration: dict | None = None) -> PlatformModel:
        fitted = {v: Constants(**c) for v, c in (calibration or {}).get("constants", {}).items()}
        return cls(slug, spec["arch"], spec["sms"], dict(spec["peak"]), spec["hbm_TBps"], fitted,
                   spec.get("cluster_sms"))

    def resident_clusters(self, split: int, ctas_per_sm: int) -> int:
        """Clusters of ``split`` CTAs the GPU holds at once at ``ctas_per_sm`` CTAs per SM: a cluster's CTAs run in
        one GPC, and clusters of 4 or more fill only ``cluster_sms`` of the SMs (config ``platforms.<slug>.
        cluster_sms``, from Nsight Compute's Max Active Clusters)."""
        sms = self.cluster_sms if split >= 4 and self.cluster_sms else self.sms
        return max(1, sms * ctas_per_sm // split)

    def of(self, variant: Variant) -> Constants:
        return self.constants.get(variant.name) or default_constants(variant)


def predict_us(variant: Variant, M: int, N: int, K: int, tile: Tile, platform: PlatformModel,
               c: Constants | None = None) -> float:
    """Predicted time of one call, in µs: the slowest SM's tiles (waves of the persistent grid) each a K
    loop bounded by the tensor rate, the SM's load bandwidth or the ring's latency, and at least the
    unique bytes at HBM speed."""
    c = c or platform.of(variant)
    if resident(variant):
        return predict_resident_us(variant, M, N, K, tile, platform, c)
    a_bytes, b_bytes, c_bytes = bytes_per_element(variant.name)
    if tile.swap_ab:
        M, N, a_bytes, b_bytes = N, M, b_bytes, a_bytes
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    tiles = ceil_div(M, bM) * ceil_div(N, bN)
    k_blocks = ceil_div(K, bK)
    grid = min(tiles, platform.sms)
    waves = ceil_div(tiles, grid)
    peak = (platform.peak.get(variant.precision) or 1.0) * 1e12 / platform.sms  # ops/s per SM
    rate = peak * c.mma_eff * bN / (bN + c.n_half) * (c.one_consumer if bM == 64 else 1.0)
    t_mma = 2.0 * bM * bN * bK / rate
    stage_bytes = bM * bK * a_bytes + bN * bK * b_bytes
    bandwidth = min(c.sm_GBps * 1e9, platform.hbm_TBps * 1e12 * c.hbm_eff * 4 / grid)  # L2 serves ~4x HBM
    t_load = stage_bytes / bandwidth
    # stages in flight: those the consumers do not hold; a ring no deeper than that hardly prefetches
    # (fp8_e4m3_ws's 2-stage rings ran 1.4-2x slower than 4-6 stages of the same block)
    t_latency = c.latency_us * 1e-6 / max(tile.num_stages - c.held_stages, 0.25)
    t_k = _soft_max(t_mma, t_load, t_latency) + c.kblock_us * 1e-6
    t_tile = k_blocks * t_k + c.tile_us * 1e-6 + bM * bN * c_bytes / bandwidth
    unique = M * K * a_bytes + N * K * b_bytes + M * N * c_bytes
    dram = unique / (platform.hbm_TBps * 1e12 * c.hbm_eff)
    return (_soft_max(waves * t_tile, dram) + c.launch_us * 1e-6) * 1e6


def predict_resident_us(variant: Variant, M: int, N: int, K: int, tile: Tile, platform: PlatformModel,
                        c: Constants) -> float:
    """Predicted time of one call of a kernel of resident CTAs (``TileSpace.ctas_per_sm``; the W4A16 kernels),
    in µs. One CTA per output tile and K split (a split's CTAs are one thread-block cluster); an SM holds
    ``ctas_per_sm`` of them, which share its tensor cores, decoders and load bandwidth.

    Per K block, a CTA waits for the slowest of: the SM's issue of every resident CTA's decode, wgmma and fixed
    per-block instructions (the decode's instructions are the cost: ``decode_Gps`` per SM, and
    ``kblock_issue_us`` per block, so small K blocks cost more per weight); its own chain, the same work plus ``kblock_us``
    of latency that only other CTAs hide (alone on an SM, a CTA of 64-wide K blocks is mostly that latency); its
    share of the load bandwidth; the ring's latency. A form that overlaps its K blocks (``TileSpace.overlaps``: the
    decode of the next block under this block's wgmma) costs the slower of decode and wgmma per block, with no
    exposed chain latency, and holds one ring stage more (the block under its wgmma). Before its first block a CTA
    waits for about half of what every resident CTA's prologue (``stages`` - 1 blocks) asks of HBM at once, so deep
    rings on short K ranges cost. After its last block a split's CTA spends ``split_us`` on the cluster's
    reduction, which the CTAs sharing its SM pay in turn, so a split pays only where it brings idle SMs work
    (where the output tiles fill the SMs without it, it lost 15-20 %). The GPU holds
    ``PlatformModel.resident_clusters`` clusters at once; CTAs past that run in a later round on emptier SMs. The
    whole is at least the unique bytes at HBM speed. Here the tile's rows of A are the wgmma's N, so narrow wgmma
    lose by ``block_M/(block_M + n_half)``."""
    from kernels.smem import kernel_smem_bytes

    a_bytes, b_bytes, c_bytes = bytes_per_element(variant.name)
    bM, bN, bK, split = tile.block_M, tile.block_N, tile.block_K, tile.split_k
    ctas = ceil_div(M, bM) * ceil_div(N, bN) * split
    per_sm = variant.tile_space.ctas_per_sm(tile, kernel_smem_bytes(variant.kernel, tile))
    held = platform.resident_clusters(split, per_sm) * split  # CTAs resident at once
    stage_bytes = bM * bK * a_bytes + bN * bK * b_bytes
    hbm = platform.hbm_TBps * 1e12 * c.hbm_eff
    peak = (platform.peak.get(variant.precision) or 1.0) * 1e12 / platform.sms
    t_mma = 2.0 * bM * bN * bK / (peak * c.mma_eff * bM / (bM + c.n_half))
    t_decode = bN * bK / (c.decode_Gps * 1e9)
    held_stages = c.held_stages
    if variant.tile_space.overlaps is not None and variant.tile_space.overlaps(tile):
        # the decode of block k + 1 runs under the wgmma of block k: a block costs the slower of the two, and no
        # chain latency is left exposed (the ring's producer and the wgmma in flight hide it); but a consumer keeps
        # block k's stage until block k + 1's wgmma is issued, one stage more than the other forms hold
        t_work = _soft_max(t_decode, t_mma) + c.kblock_issue_us * 1e-6
        t_chain = t_work
        held_stages += 1
    else:
        # one CTA's block at the SM's full issue rate: the decode, the wgmma and the block's fixed instructions,
        # and alone on an SM the block's latency on top
        t_work = t_decode + t_mma + c.kblock_issue_us * 1e-6
        t_chain = t_work + c.kblock_us * 1e-6
    t_latency = c.latency_us * 1e-6 / max(tile.num_stages - held_stages, 0.25)

    def t_cta(resident: int) -> float:
        """One CTA's time while ``resident`` CTAs of the kernel run at once."""
        sharing = min(per_sm, ceil_div(resident, platform.sms))  # CTAs on the busiest SM at once
        bandwidth = min(c.sm_GBps * 1e9, hbm * 4 / min(resident, platform.sms)) / sharing  # L2 serves ~4x HBM
        t_k = _soft_max(sharing * t_work, t_chain, stage_bytes / bandwidth, t_latency)
        t_prologue = resident * (tile.num_stages - 1) * stage_bytes / (2 * hbm)
        # the output block, and a split's partial sums gathered by its first CTA
        t_out = (bM * bN * c_bytes + (split - 1) * bM * bN * 4) / bandwidth
        # an uneven split's CTAs all run the longer count (the shorter load a block they do not add)
        # a split's cluster reduction holds every CTA's place on the SM (its barrier waits for the partners)
        t_split = sharing * c.split_us * 1e-6 if split > 1 else 0.0
        return t_prologue + ceil_div(K // bK, split) * t_k + c.tile_us * 1e-6 + t_out + t_split

    rounds, rest = divmod(ctas, held)
    t_rounds = rounds * t_cta(held) + (t_cta(rest) if rest else 0.0)
    unique = M * K * a_bytes + N * K * b_bytes + M * N * c_bytes
    return (_soft_max(t_rounds, unique / hbm) + c.launch_us * 1e-6) * 1e6


def _soft_max(*times: float, p: float = 4.0) -> float:
    """A smooth maximum: bounds that are close overlap imperfectly (two equal bounds cost 19 % more than
    one), and under a dominant bound (decode's HBM floor) the others still order the tiles."""
    return sum(t ** p for t in times) ** (1 / p)


# registers a consumer thread keeps besides its accumulators (addresses, counters, fragments): measured
# on the tune of 2026-12-04, fp8_e4m3_ws_promoted at block_N 208 (2 x 104 accumulator registers) built
# without spills under the 232-register budget and at 224 spilled 20 registers' worth
RESERVED_REGISTERS = 24


def register_problem(tile: Tile) -> str | None:
    """Why a warp-specialized tile's accumulators cannot stay in its consumers' registers, or None: each
    consumer thread holds 64·block_N/128 accumulators, twice when the tile promotes (``_p``: the wgmma's
    partial sum and the fp32 total); spilled accumulators cost 1.3-3x (fp8_e4m3_ws_promoted, 8192³)."""
    from kernels.warp_specialized import ROWS_PER_CONSUMER, TMA_PRODUCER, WARPGROUP

    consumers = tile.block_M // ROWS_PER_CONSUMER
    budget = TMA_PRODUCER.consumer.get(consumers)
    need = (2 if tile.promote else 1) * ROWS_PER_CONSUMER * tile.block_N // WARPGROUP + RESERVED_REGISTERS
    if budget is not None and need > budget:
        return f"{tile.name}: {need} registers per consumer thread for accumulators, more than the {budget} it has"
    return None


def rank(variant: Variant, M: int, N: int, K: int, platform: PlatformModel) -> list[tuple[Tile, float]]:
    """The variant's tiles at M x N x K on the platform, fastest predicted first (ties: by name)."""
    tiles = candidates(variant, M, N, K, platform.arch)
    if variant.tile_space is not None and variant.tile_space.persistent:
        tiles = [t for t in tiles if register_problem(t) is None]
    scored = [(t, predict_us(variant, M, N, K, t, platform)) for t in tiles]
    return sorted(scored, key=lambda x: (round(x[1], 3), x[0].name))


# ---------------------------------------------------------------- calibration
# weight of the prior that keeps each log-constant near its physical default, against the mean squared log error
PRIOR = 0.002
def calibrate(variant: Variant, points: list[tuple[int, int, int, Tile, float]], platform: PlatformModel,
              steps: int = 300) -> tuple[Constants, dict]:
    """Fit a variant's ``Constants`` to measured (M, N, K, tile, µs) on the platform: least squares on log
    time, each constant kept near its physical default (a weak prior), by Adam on log-constants (torch).
    Returns the constants and the fit's quality: median and worst |log error| before and after."""
    import torch

    base = default_constants(variant)
    names = fitted_constants(variant)
    x0 = torch.tensor([math.log(getattr(base, n)) for n in names], dtype=torch.float64)
    x = x0.clone().requires_grad_(True)
    measured = torch.tensor([math.log(p[4]) for p in points], dtype=torch.float64)

    def consts(v):
        return replace(base, **{n: float(math.exp(v[i])) for i, n in enumerate(names)})

    def loss_of(v):
        # the model is piecewise (max of bounds): a finite-difference gradient per constant
        return _log_errors(variant, points, platform, consts(v), measured)

    best, best_loss = x0.clone(), None
    opt = torch.optim.Adam([x], lr=0.05)
    for _ in range(steps):
        with torch.no_grad():
            err = loss_of(x.detach().tolist())
            loss = float((err ** 2).mean() + PRIOR * ((x - x0) ** 2).sum())
            if best_loss is None or loss < best_loss:
                best, best_loss = x.detach().clone(), loss
            grad = torch.zeros_like(x)
            for i in range(len(names)):
                y = x.detach().clone()
                y[i] += 1e-3
                e2 = loss_of(y.tolist())
                grad[i] = (float((e2 ** 2).mean() + PRIOR * ((y - x0) ** 2).sum()) - loss) / 1e-3
        opt.zero_grad()
        x.grad = grad
        opt.step()
    fitted = consts(best.tolist())
    before = _log_errors(variant, points, platform, base, measured).abs()
    after = _log_errors(variant, points, platform, fitted, measured).abs()
    if float((after ** 2).mean()) > float((before ** 2).mean()):  # the prior pulled it off: keep the defaults
        fitted, after = base, before
    quality = {"points": len(points), "median_abs_log_error_default": float(before.median()),
               "median_abs_log_error": float(after.median()), "worst_abs_log_error": float(after.max())}
    return fitted, quality


def _log_errors(variant, points, platform, c: Constants, measured):
    import torch

    pred = torch.tensor([math.log(predict_us(variant, M, N, K, t, platform, c)) for M, N, K, t, _ in points],
                        dtype=torch.float64)
    return pred - measured


def calibration_points(tidy, variant: str) -> list[tuple[int, int, int, Tile, float]]:
    """(M, N, K, tile, µs) of every timed tile of ``variant`` in tidy rows (a run's or a tune's)."""
    rows = tidy[(tidy["variant"] == variant) & (tidy["status"] == "ok") & tidy["time_ms_median"].notna()]
    rows = rows[rows["tile"].str.match(r"m[0-9]+n")]
    best = rows.groupby(["M", "N", "K", "tile"])["time_ms_median"].min().reset_index()
    return [(int(r.M), int(r.N), int(r.K), parse_tile(r.tile), float(r.time_ms_median) * 1e3) for r in best.itertuples()]


# ---------------------------------------------------------------- the tuned table
def tool_versions() -> dict:
    """The TileLang and nvcc versions this host compiles with ("unknown" where it has none)."""
    return {"tilelang": _tilelang_version(), "nvcc": _nvcc_version()}


@functools.cache
def _tilelang_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tilelang")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "unknown"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"release ([0-9.]+)", out)
    return m.group(1) if m else "unknown"


def kernel_sources(module: str, read=None) -> list[str]:
    """The repo files a kernel module's code is made of: it and every kernels/ module it imports at module
    level, transitively (imports inside functions are rules and helpers, not the kernel: kernels/smem.py
    reaches every kernel module that way), with the .cuh files beside them. ``read``: path -> source text
    (default: this checkout's file; a commit's, to recompute a key)."""
    import ast

    read = read or (lambda path: (REPO / path).read_text())
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = name.replace(".", "/") + ".py"
        if path in seen:
            continue
        seen.add(path)
        for node in ast.parse(read(path)).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            todo += [n for n in names if n.startswith("kernels.") and (REPO / (n.replace(".", "/") + ".py")).exists()]
    stems = {Path(p).stem for p in seen}
    cuda = [str(c.relative_to(REPO)) for c in sorted((REPO / "kernels").glob("*.cuh"))
            if any(c.stem == s or c.stem.startswith(s + "_") for s in stems)]
    return sorted(seen | {"kernels/__init__.py"} | set(cuda))


def registering_module(variant_name: str) -> str:
    """The family module that registers a variant (its kernel factory's arguments, pass configs, tile rule
    and tile space are set there), as a dotted name; it imports the kernel's module."""
    from kernels.registry import registration_sites

    return registration_sites()[variant_name].partition(":")[0].removesuffix(".py").replace("/", ".")


@functools.cache
def kernel_source_sha256(variant_name: str) -> str:
    """sha256 over what builds the variant's kernel: ``kernel_sources`` of the module that registers it (so
    the kernel's own module and what it imports), by path and content. A tuned record of other sources is stale."""
    return sources_sha256(kernel_sources(registering_module(variant_name)))


def sources_sha256(files: list[str], read_bytes=None) -> str:
    read_bytes = read_bytes or (lambda path: (REPO / path).read_bytes())
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.encode() + b"\0" + read_bytes(f) + b"\0")
    return h.hexdigest()


def tune_key(variant: str, shape: str, arch: str, gpu_name: str, versions: dict | None = None) -> dict:
    """Everything that decides a tuned winner: the kernel (variant, its sources), the problem, the
    machine (arch, GPU) and the compilers (TileLang, nvcc)."""
    return {"variant": variant, "shape": shape, "arch": arch, "gpu_name": gpu_name,
            **(versions or tool_versions()), "source_sha256": kernel_source_sha256(variant)}


def tune_record(key: dict, dist: str, input_sha256, candidates: list, rows: list[dict], compiled: dict | None = None,
                env: dict | None = None) -> dict:
    """A tune job's record of one shape: its key, every candidate (the model's rank and prediction, the
    compile's registers and spills, the run's status and times), the winner (the fastest within tolerance,
    None if none passed) and the model's regret (its first pick's time over the winner's)."""
    by_tile = {r["tile"]: r for r in rows}
    out = []
    for rank_, (tile, predicted) in enumerate(candidates, 1):
        r, c = by_tile.get(tile, {}), (compiled or {}).get(tile, {})
        out.append({"tile": tile, "model_rank": rank_, "predicted_us": predicted, "status": r.get("status", "failed"),
                    "reason": r.get("reason", "not run"), "time_ms_median": r.get("time_ms_median"),
                    "time_ms_p20": r.get("time_ms_p20"), "time_ms_p80": r.get("time_ms_p80"),
                    "kernel_calc_diff": r.get("kernel_calc_diff"), "registers": c.get("registers"),
                    "spills": (c.get("sass_local_loads") or 0) + (c.get("sass_local_stores") or 0) if c else None})
    timed = [c for c in out if c["status"] == "ok" and c["time_ms_median"]]
    best = min(timed, key=lambda c: c["time_ms_median"]) if timed else None
    first = out[0] if out else None
    regret = (first["time_ms_median"] / best["time_ms_median"]
              if best and first and first["status"] == "ok" and first["time_ms_median"] else None)
    return {"key": key, "dist": dist, "input_sha256": input_sha256, "winner": best["tile"] if best else None,
            "model_pick": first["tile"] if first else None, "regret": regret, "candidates": out, "env": env or {}}


def tune_stamp(key: dict, candidates: list, dist: str, manifest_file: str | Path, fmt: str, tolerance: dict,
               timing: dict) -> str | None:
    """What a finished shape of a tune job was measured under, beyond its key: the candidates in the model's
    order, the distribution, the inputs (the sha256 of the unquantized tensors and of format ``fmt``'s, from the
    input set's manifest: the same on any host that builds them), the tolerance and the timing. A kept record
    is reused only under the same stamp; None where the manifest cannot be read (the shape is tuned again)."""
    from harness.inputs import CorruptInput, format_entry, read_manifest

    try:
        m = read_manifest(manifest_file)
        inputs = {"fp32": m["fp32"]["tensors"], "format": format_entry(m, fmt, manifest_file)["tensors"]}
    except (CorruptInput, OSError, KeyError, TypeError):
        return None
    given = {"key": key, "candidates": candidates, "dist": dist, "inputs": inputs, "tolerance": tolerance,
             "timing": timing}
    return hashlib.sha256(json.dumps(given, sort_keys=True, default=str).encode()).hexdigest()


def kept_tune_record(path: str | Path, stamp: str | None) -> dict | None:
    """The record a stopped tune job kept for one shape (``kept_tune_path``), if it was made under ``stamp``;
    None if there is none, it is unreadable or anything it was measured under has changed."""
    try:
        kept = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return kept.get("record") if stamp and isinstance(kept, dict) and kept.get("stamp") == stamp else None


def staleness(record: dict, variant: str, shape: str, arch: str, gpu_match: str) -> str | None:
    """Why a tuned record cannot be trusted for (variant, shape) on a platform of ``arch`` whose GPU name
    matches ``gpu_match``, or None. Compiler versions this host cannot tell ("unknown") are not compared."""
    key = record.get("key", {})
    want = {"variant": variant, "shape": shape, "arch": arch, "source_sha256": kernel_source_sha256(variant)}
    for name, value in want.items():
        if key.get(name) != value:
            return f"{name} differs (tuned: {str(key.get(name))[:16]}, now: {value[:16]})"
    if not re.search(gpu_match, str(key.get("gpu_name", ""))):
        return f"tuned on {key.get('gpu_name')!r}, not a GPU matching {gpu_match!r}"
    for tool, now in tool_versions().items():
        if now != "unknown" and key.get(tool) != now:
            return f"{tool} differs (tuned: {key.get(tool)}, now: {now})"
    if not record.get("winner"):
        return "no candidate passed"
    # a winner that spills won among spilling candidates: the model ranks tiles that hold their accumulators
    # in registers, and a record must never pin a run to a spilling tile (fp8_e4m3_ws_promoted at 8192³: 0.74x)
    won = next((c for c in record.get("candidates", []) if c.get("tile") == record["winner"]), {})
    if won.get("spills"):
        return f"its winner {record['winner']} spills ({won['spills']} local loads and stores in its SASS)"
    return None


def tuning_record_paths(platform: str, entry: str, shape: str, root: Path | None = None) -> list[Path]:
    """Where a tuned record may be, first found first: this checkout's tune output, then the committed table."""
    root = REPO if root is None else root
    return [root / f"results/{platform}/tuning/{entry}/{shape}.json",
            *sorted((root / f"results/published/{platform}/tuning").glob(f"*/{entry}/{shape}.json"))]


@dataclass(frozen=True)
class Choice:
    """The tiles a run times at one shape and where they come from: "config", "tuned" or "model"
    (``why``: a tuned record passed over, and why)."""

    tiles: list[str]
    source: str
    why: str = ""
    record: str = ""


def tuned(platform: str, entry: str, variant: str, shape: str, arch: str, gpu_match: str,
          root: Path | None = None) -> tuple[dict | None, str, str]:
    """(the fresh tuned record, its path, "") or (None, "", why none is used)."""
    root = REPO if root is None else root
    why = "no tuned record"
    for path in tuning_record_paths(platform, entry, shape, root):
        if not path.exists():
            continue
        try:
            rec = read_json(path, TUNE)
        except DamagedFile as e:  # a damaged record is passed over, saying why (the model's pick runs)
            why = f"{path.relative_to(root)}: {e.problem}"
            continue
        if (stale := staleness(rec, variant, shape, arch, gpu_match)) is None:
            return rec, str(path.relative_to(root)), ""
        why = f"{path.relative_to(root)} is stale: {stale}"
    return None, "", why


def model_picks(variant: Variant, shape: str, platform: PlatformModel, n: int) -> list[str]:
    M, N, K = parse_shape(shape)
    return [t.name for t, _ in rank(variant, M, N, K, platform)[:n]]


def calibration_path(platform: str, root: Path | None = None) -> Path:
    return (REPO if root is None else root) / f"results/published/{platform}/tuning/calibration.json"


def load_calibration(platform: str, root: Path | None = None) -> dict | None:
    """The committed fit of a platform's constants ({"constants": {variant: {...}}, ...}), or None (defaults)."""
    path = calibration_path(platform, root)
    return read_json(path, CALIBRATION, fix=f"remake it: python -m harness.selection calibrate {platform}") \
        if path.exists() else None


def to_json(c: Constants) -> dict:
    return asdict(c)


def tune_rows(platform: str, root: Path | None = None):
    """Every timed candidate of the committed table's records (and this checkout's), as tidy rows."""
    import pandas as pd

    root = REPO if root is None else root
    rows = []
    for path in sorted({*root.glob(f"results/published/{platform}/tuning/*/*/*.json"), *root.glob(f"results/{platform}/tuning/*/*.json")}):
        rec = read_json(path, TUNE)
        M, N, K = parse_shape(rec["key"]["shape"])
        rows += [{"variant": rec["key"]["variant"], "M": M, "N": N, "K": K, "tile": c["tile"], "status": c["status"],
                  "time_ms_median": c.get("time_ms_median")} for c in rec["candidates"]]
    return pd.DataFrame(rows, columns=["variant", "M", "N", "K", "tile", "status", "time_ms_median"])


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.selection calibrate <platform>``: fit every selected variant's constants to the
    platform's published measurements (tidy.csv: the timed tiles of its runs) and tune records, and write
    results/published/<platform>/tuning/calibration.json. ``rank <platform> <variant> <MxNxK>``: the model's
    ranking of a shape, best first."""
    import argparse
    import sys

    import pandas as pd

    from harness.atomic import write_json
    from harness.plan import load_config
    from kernels.registry import VARIANTS, get_variant, load_all

    p = argparse.ArgumentParser(prog="python -m harness.selection", description=main.__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("platform")
    c.add_argument("--steps", type=int, default=300, help="optimizer steps per variant")
    c.add_argument("--variants", nargs="+", metavar="VARIANT",
                   help="fit only these; every other variant keeps its committed constants")
    r = sub.add_parser("rank")
    r.add_argument("platform")
    r.add_argument("variant")
    r.add_argument("shape")
    r.add_argument("--top", type=int, default=10)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config()
    spec = cfg["platforms"][args.platform]
    load_all()
    if args.cmd == "rank":
        model = PlatformModel.from_config(args.platform, spec, load_calibration(args.platform))
        for tile, us in rank(get_variant(args.variant), *parse_shape(args.shape), model)[:args.top]:
            print(f"{tile.name:40} {us:10.1f} us")
        return 0
    tidy = pd.read_csv(REPO / f"results/published/{args.platform}/tidy.csv", low_memory=False)
    data = pd.concat([tidy[["variant", "M", "N", "K", "tile", "status", "time_ms_median"]], tune_rows(args.platform)])
    model = PlatformModel.from_config(args.platform, spec)
    out = {"platform": args.platform, "constants": {}, "fit": {},
           "how": "harness.selection.calibrate on the timed tiles of results/published/<platform>/tidy.csv and tuning/"}
    if args.variants:
        for name in args.variants:
            get_variant(name)  # an unknown name is refused, with the known ones
        kept = load_calibration(args.platform) or {}
        for part in ("constants", "fit"):
            out[part] = {n: c for n, c in kept.get(part, {}).items() if n not in args.variants}
    for name, v in sorted(VARIANTS.items()):
        if args.variants and name not in args.variants:
            continue
        points = calibration_points(data, name) if v.tile_space is not None else []
        if v.tile_space is not None and v.tile_space.persistent:  # spilled accumulators are ranked out, not modelled
            points = [p for p in points if register_problem(p[3]) is None]
        if len(points) < 4:
            continue
        constants, quality = calibrate(v, points, model, steps=args.steps)
        out["constants"][name], out["fit"][name] = to_json(constants), quality
        print(name, quality)
    out["constants"], out["fit"] = dict(sorted(out["constants"].items())), dict(sorted(out["fit"].items()))
    write_json(calibration_path(args.platform), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
