# Tune one entry on one GPU platform (workflow/rules/tune.smk): compile every shape's candidates in
# parallel, then check and time them shape by shape exactly as a run does (harness.runner.run_gpu), and
# write one record per shape. A shape that cannot be tuned (a corrupt input, a crash) gets a record
# without a winner, saying why; runs then use the model's pick there. Each shape with a winner is also kept
# (harness.plan.kept_tune_path) until the job ends: a job stopped part-way (a time limit, the machine
# taken away) loses only the shape it was timing, and its next run reuses each kept winner found under the
# same key, candidates, inputs, tolerance and timing.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import gpu_lock, restore_missing, setup

setup(snakemake)
import traceback  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

from harness.compile import error_summary  # noqa: E402
from harness.device import check_landed, environment_tags  # noqa: E402
from harness.inputs import load_point  # noqa: E402
from harness.plan import kept_tune_path  # noqa: E402
from harness.runner import run_gpu  # noqa: E402
from harness.selection import kept_tune_record, tune_key, tune_record, tune_stamp  # noqa: E402
from harness.tryout import compile_job  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import parse_tile  # noqa: E402

wc, p = snakemake.wildcards, snakemake.params
variant = get_variant(p.variant)
check_landed(wc.platform, p.platform_spec)
env = environment_tags()
keys = {shape: tune_key(variant.name, shape, p.arch, env["gpu_name"]) for shape, _ in p.points}
stamps = {shape: tune_stamp(keys[shape], p.candidates[shape], dist, manifest, variant.input_format, p.tolerance, p.timing)
          for (shape, dist), manifest in zip(p.points, snakemake.input.manifest, strict=True)}
kept = {shape: rec for shape, _ in p.points
        if (rec := kept_tune_record(kept_tune_path(wc.platform, p.entry, shape), stamps[shape])) is not None}
if kept:
    print(f"reusing the records of {len(kept)} shapes this job finished before it was stopped", flush=True)
jobs = [(variant.name, shape, tile, p.arch) for shape, _ in p.points if shape not in kept for tile, _ in p.candidates[shape]]
with ProcessPoolExecutor(max(1, min(snakemake.threads, len(jobs) or 1))) as pool:
    compiled = {(r["shape"], r["tile"]): r for r in pool.map(compile_job, jobs)}
written = {}
for (shape, dist), fp32, fmt_file, manifest_file, out in zip(p.points, snakemake.input.fp32, snakemake.input.formats,
                                                             snakemake.input.manifest, snakemake.output, strict=True):
    if shape in kept:
        written[out] = kept[shape]
        write_json(out, written[out])
        continue
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
    written[out] = tune_record(keys[shape], dist, sha, candidates, rows,
                               compiled={t: compiled[shape, t] for t, _ in candidates}, env=env)
    print(shape, "winner", written[out]["winner"], "model regret", written[out]["regret"], flush=True)
    write_json(out, written[out])
    if written[out]["winner"] and stamps[shape]:  # a shape without one (a crash, no candidate passing) is tried again
        write_json(kept_tune_path(wc.platform, p.entry, shape), {"stamp": stamps[shape], "record": written[out]})
restore_missing(written)
for shape, _ in p.points:  # the job is whole: a forced rerun tunes afresh
    Path(kept_tune_path(wc.platform, p.entry, shape)).unlink(missing_ok=True)
