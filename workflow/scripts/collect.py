# Collect a platform's runs into one tidy table (CSV + parquet), its limits (roofs.csv), the compile
# matrix and what its jobs cost (cost.csv: their benchmarks, harness/cost.py); for a published folder, the
# same from every family's points, with a table of the point sets (when and at which commit each family
# was measured).
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.jobs import setup

setup(snakemake)

from pathlib import Path  # noqa: E402

from harness.cost import BENCHMARKS, concat_point_sets, job_table  # noqa: E402
from harness.tables import compile_matrix, point_sets, read_ceilings, roofs, tidy_runs  # noqa: E402
from kernels.registry import VARIANTS, bytes_per_element, load_all  # noqa: E402

load_all()
physical = snakemake.params.physical
bytes_of = {v: bytes_per_element(v) for v in VARIANTS}
# what the config says of each entry: the columns of the failed row an unreadable run file becomes
defaults = {entry: {k: getattr(VARIANTS[v], k) for k in ("family", "precision", "ops_unit", "input_format")} | {"variant": v}
            for entry, v in ((e, c.get("uses", e)) for e, c in snakemake.config["variants"].items())}
defaults["*"] = {"platform": snakemake.wildcards.platform}
# a damaged run or compile file becomes a failed row naming it and its fix; a damaged ceilings.json or
# provenance.json fails this job with the same message (DamagedFile, harness/records.py)
if "points_dir" in snakemake.params.keys():
    df, ceilings, compiled, sets = point_sets(snakemake.params.points_dir, physical, bytes_of, defaults)
    sets.to_csv(snakemake.output.point_sets, index=False)
    cost = concat_point_sets(Path(snakemake.params.points_dir).parent)
else:
    ceilings_file = snakemake.input.ceilings[0] if snakemake.input.ceilings else None
    df = tidy_runs(list(snakemake.input.runs), ceilings_file, physical, bytes_of, defaults=defaults)
    ceilings = read_ceilings(ceilings_file)
    compiled = list(snakemake.input.compiled)
    # collect's own benchmark is written after it ends, and is not among these (common.smk job_benchmarks)
    cost = job_table(BENCHMARKS, snakemake.wildcards.platform, files=list(snakemake.params.benchmarks),
                     run_files=list(snakemake.input.runs))
df.to_csv(snakemake.output.csv, index=False)
df.to_parquet(snakemake.output.parquet, index=False)
roofs(df, ceilings, physical).to_csv(snakemake.output.roofs, index=False)
compile_matrix(compiled).to_csv(snakemake.output.compile_matrix, index=False)
cost.to_csv(snakemake.output.cost, index=False)
print(f"{len(df)} rows, {len(cost)} jobs' costs")
for _, r in df[df["status"] == "failed"].iterrows() if len(df) else ():
    print(f"failed: {r['entry']} {r['dist']} {r['shape']} {r['tile']}: {r['reason']}")
