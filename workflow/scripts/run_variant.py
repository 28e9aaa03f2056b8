# Run one variant on one input set per shape: GPU (correctness, then timing) or CPU emulation (numerics
# only). A shape that cannot be run (a corrupt input, a crash) gets failed rows with the reason; the
# other shapes' results are still written.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import gpu_lock, job_started, restore_missing, setup

setup(snakemake)
import time  # noqa: E402
import traceback  # noqa: E402

from harness.compile import error_summary  # noqa: E402
from harness.device import check_landed, environment_tags  # noqa: E402
from harness.inputs import load_format, load_point  # noqa: E402
from harness.power import open_nvml  # noqa: E402
from harness.records import RUN, DamagedFile, compile_outcomes, read_json, utc  # noqa: E402
from harness.runner import Pairing, Peer, run_emulated, run_gpu  # noqa: E402
from harness.stats import StoppingRule  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import EMULATED, LIBRARY, parse_shape, parse_tile  # noqa: E402

# when this job's process started (a warm start's: the client's) and when its imports were done (each
# record's cost; its host is env.node)
READY, STARTED = time.time(), job_started()


wc, p = snakemake.wildcards, snakemake.params
variant = get_variant(p.variant)
if p.arch is not None:  # a GPU platform: first make sure this node has its GPU
    check_landed(wc.platform, p.platform_spec)
# shape -> its tiles (its shape class's, when the config gives them per class)
tiles = {shape: [parse_tile(t) for t in names] for shape, names in p.tiles.items()}


def tile_names(shape):
    """The rows a shape has when it cannot be run at all."""
    if p.arch is None:
        return [EMULATED]
    return [t.name for t in tiles[shape]] if variant.kernel is not None else [LIBRARY]


# {shape: {tile: (status, reason)}} from this platform's compile records (GPU platforms only); a damaged
# record fails its own tile at every shape, naming the file and the fix, and the other tiles still run
COMPILED = compile_outcomes(snakemake.input.get("compiled", []), p.shapes) if p.arch is not None else {}


def peer(role: str, planned: dict | None, manifest_file) -> Peer | None:
    """A peer of this point as its own run found it: the tile it timed fastest within tolerance there, on
    operands loaded from the same inputs (its record must be of them); or the reason it cannot be paired."""
    if planned is None:
        name = getattr(variant, role)
        return Peer(role, get_variant(name), skip="no config entry times it at this point") if name else None
    pv = get_variant(planned["variant"])
    try:
        rec = read_json(planned["record"], RUN)
    except DamagedFile as e:
        return Peer(role, pv, skip=f"its run record is damaged: {e}")
    ok = [r for r in rec["rows"] if r.get("status") == "ok" and r.get("time_ms_median")]
    if not ok:
        why = "; ".join(sorted({f"{r.get('status')}: {r.get('reason', '')}"[:160] for r in rec["rows"]}))
        return Peer(role, pv, skip=f"its run has no timed row within tolerance here ({why}; {planned['record']})")
    ops, sha = load_format(planned["format_file"], manifest_file, pv.input_format)
    if rec["point"].get("input_sha256") != sha:
        return Peer(role, pv, skip=f"its run ({planned['record']}) timed other inputs than these; rerun it")
    best = min(ok, key=lambda r: r["time_ms_median"])["tile"]
    return Peer(role, pv, ops, None if best == LIBRARY else parse_tile(best))


NVML = open_nvml() if p.arch is not None else (None, "")


def pairing(shape, manifest_file) -> Pairing | None:
    """How this shape's fastest tile is timed against its peers (config timing.pairing, timing.sustained)."""
    if variant.baseline is None and variant.second_baseline is None:
        return None  # a library peer itself: nothing to pair it with

    def peers():  # loaded only when a tile of the variant passed (a large format file takes seconds)
        return [x for role in ("baseline", "second_baseline")
                if (x := peer(role, p.peers.get(shape, {}).get(role), manifest_file)) is not None]
    pc, sc = p.timing["pairing"], p.timing["sustained"]
    rule = StoppingRule(pc["target_halfwidth"], pc["min_rounds"], pc["max_rounds"], pc["same_within"])
    sustained = (sc["min_settle_s"], sc["max_settle_s"]) if shape in sc["shapes"] else None
    return Pairing(peers, rule, p.timing["warmup"], p.arch, shape in pc["aa_shapes"], sustained, *NVML)


def run_shape(shape, fp32, fmt_file, manifest_file, cost):
    """``cost`` receives, as they pass, the seconds spent loading the inputs, building and checking the tiles
    (a CPU emulation: emulating), timing them alone and paired (harness/runner.py run_gpu's ``spent``)."""
    began = time.perf_counter()
    raw, ops, sha = load_point(fp32, fmt_file, manifest_file, variant.input_format)
    cost["load_s"] = time.perf_counter() - began
    began = time.perf_counter()
    if p.arch is None:
        rows = run_emulated(variant, raw["A"], raw["B"], ops, p.tolerance)
        cost["build_check_s"] = time.perf_counter() - began
        return rows, sha, {}
    pair = pairing(shape, manifest_file)
    with gpu_lock():
        began = time.perf_counter()
        try:
            rows = run_gpu(variant, raw["A"], raw["B"], ops, tiles[shape], p.arch, p.tolerance, reps=p.timing["reps"],
                           warmup=p.timing["warmup"], compiled=COMPILED.get(shape), pairing=pair, spent=cost)
        finally:  # the rest of run_gpu: operands to the GPU, references, each tile built (or loaded) and checked
            cost["build_check_s"] = time.perf_counter() - began - cost["standalone_s"] - cost["paired_s"]
    return rows, sha, (pair.samples if pair else {})


def precompile() -> float:
    """The variant's compiles for every shape of this job made at once (Variant.precompile: a library that
    compiles per shape in its prepare), before the first shape; its seconds, which go to the first shape's
    building. A warm-up only: a shape's prepare compiles, and reports, whatever it missed."""
    if p.arch is None or variant.precompile is None:
        return 0.0
    limit = variant.shape_limit or (lambda M, N, K: None)
    began = time.perf_counter()
    try:
        with gpu_lock():
            variant.precompile([s for s in map(parse_shape, p.shapes) if limit(*s) is None])
    except Exception as e:
        print(f"{variant.name}: compiling ahead failed, each shape compiles its own: {error_summary(e)}", flush=True)
    return time.perf_counter() - began


written, precompile_s = {}, precompile()
for shape, fp32, fmt_file, manifest_file, out in zip(p.shapes, snakemake.input.fp32, snakemake.input.formats,
                                                     snakemake.input.manifest, snakemake.output, strict=True):
    cost, started = {"load_s": 0.0, "build_check_s": 0.0, "standalone_s": 0.0, "paired_s": 0.0}, time.time()
    try:
        rows, sha, paired = run_shape(shape, fp32, fmt_file, manifest_file, cost)
    except Exception as e:  # this shape only: the others still run and keep their results
        traceback.print_exc()
        reason = str(e) if isinstance(e, DamagedFile) else error_summary(e)  # a CorruptInput is one
        rows, sha, paired = [{"tile": t, "status": "failed", "reason": reason} for t in tile_names(shape)], {}, {}
    cost["build_check_s"], precompile_s = cost["build_check_s"] + precompile_s, 0.0
    M, N, K = parse_shape(shape)
    point = {"platform": wc.platform, "target": p.arch or "cpu", "variant": variant.name, "entry": p.entry, "family": variant.family,
             "dist": wc.dist, "shape": shape, "M": M, "N": N, "K": K, "input_format": variant.input_format,
             "ops_unit": variant.ops_unit, "precision": variant.precision,
             "baseline": variant.baseline, "second_baseline": variant.second_baseline,
             "input_sha256": sha, "log": str(snakemake.log[0]), "job_key": p.job_key}
    if p.arch is not None:  # where its tiles come from, and which shape set it belongs to (sweep or zoo)
        choice = p.tile_choice.get(shape, {})
        point |= {"shape_set": "zoo" if shape in p.zoo else "sweep", "zoo_layer": "; ".join(p.zoo.get(shape, [])) or None,
                  "tile_source": choice.get("source") or ("config" if variant.kernel is not None else None),
                  "tile_record": choice.get("record") or None, "tile_why": choice.get("why") or None}
    for r in rows:
        print(shape, r.get("tile"), r.get("status"), r.get("reason"), r.get("throughput"), flush=True)
    # paired_samples: each power state's per-round times of every contender, from which the ratios come;
    # cost: where this shape's time went (UTC times; harness/cost.py puts it beside the job's benchmark)
    written[out] = {"point": point, "env": environment_tags(), "tolerance": p.tolerance, "rows": rows,
                    "paired_samples": paired,
                    "cost": {"process_start": utc(STARTED) if STARTED is not None else None, "ready": utc(READY),
                             "shape_start": utc(started), "shape_end": utc(time.time()),
                             **{k: round(v, 4) for k, v in cost.items()}}}
    write_json(out, written[out])
restore_missing(written)
