# Tune one entry on one GPU platform (workflow/rules/tune.smk): compile every shape's candidates in
# parallel, then check and time them shape by shape exactly as a run does (harness.runner.run_gpu), and
# write one record per shape. A shape that cannot be tuned (a corrupt input, a crash) gets a record
# without a winner, saying why; runs then use the model's pick there.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import gpu_lock, restore_missing, setup

setup(snakemake)
import traceback  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402

from harness.compile import error_summary  # noqa: E402
from harness.device import check_landed, environment_tags  # noqa: E402
from harness.inputs import load_point  # noqa: E402
from harness.runner import run_gpu  # noqa: E402
from harness.selection import tune_key, tune_record  # noqa: E402
from harness.tryout import compile_job  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import parse_tile  # noqa: E402

wc, p = snakemake.wildcards, snakemake.params
variant = get_variant(p.variant)
check_landed(wc.platform, p.platform_spec)
jobs = [(variant.name, shape, tile, p.arch) for shape, _ in p.points for tile, _ in p.candidates[shape]]
with ProcessPoolExecutor(max(1, min(snakemake.threads, len(jobs)))) as pool:
    compiled = {(r["shape"], r["tile"]): r for r in pool.map(compile_job, jobs)}
env = environment_tags()
written = {}
for (shape, dist), fp32, fmt_file, manifest_file, out in zip(p.points, snakemake.input.fp32, snakemake.input.formats,
                                                             snakemake.input.manifest, snakemake.output, strict=True):
    candidates = p.candidates[shape]
    outcome = {t: (compiled[shape, t]["status"], compiled[shape, t]["reason"] or "") for t, _ in candidates}
    try:
        raw, ops, sha = load_point(fp32, fmt_file, manifest_file, variant.input_format)
        with gpu_lock():
            rows = run_gpu(variant, raw["A"], raw["B"], ops, [parse_tile(t) for t, _ in candidates], p.arch,
                           p.tolerance, reps=p.timing["reps"], warmup=p.timing["warmup"], compiled=outcome)
    except Exception as e:  # this shape only: the others are still tuned
        traceback.print_exc()
        sha, rows = {}, [{"tile": t, "status": "failed", "reason": error_summary(e)} for t, _ in candidates]
    written[out] = tune_record(tune_key(variant.name, shape, p.arch, env["gpu_name"]), dist, sha, candidates,
                               rows, compiled={t: compiled[shape, t] for t, _ in candidates}, env=env)
    print(shape, "winner", written[out]["winner"], "model regret", written[out]["regret"], flush=True)
    write_json(out, written[out])
restore_missing(written)
