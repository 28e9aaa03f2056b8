# Collect every run of this platform into one tidy table (CSV + parquet) and the compile matrix.
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import setup  # noqa: E402

setup(snakemake)
from tables import compile_matrix, tidy_runs  # noqa: E402

ceilings = snakemake.input.ceilings[0] if snakemake.input.ceilings else None
df = tidy_runs(list(snakemake.input.runs), ceilings)
df.to_csv(snakemake.output.csv, index=False)
df.to_parquet(snakemake.output.parquet, index=False)
compile_matrix(list(snakemake.input.compiled)).to_csv(snakemake.output.compile_matrix, index=False)
print(f"{len(df)} rows")
