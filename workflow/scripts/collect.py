# Collect every run of this platform into one tidy table (CSV + parquet), its limits (roofs.csv) and
# the compile matrix.
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import setup  # noqa: E402

setup(snakemake)
import json  # noqa: E402

from tables import compile_matrix, roofs, tidy_runs  # noqa: E402

from kernels.registry import VARIANTS, bytes_per_element, load_all  # noqa: E402

load_all()
runs = list(snakemake.input.runs)
ceilings_file = snakemake.input.ceilings[0] if snakemake.input.ceilings else None
physical = snakemake.params.physical
df = tidy_runs(runs, ceilings_file, physical, {v: bytes_per_element(v) for v in VARIANTS})
df.to_csv(snakemake.output.csv, index=False)
df.to_parquet(snakemake.output.parquet, index=False)
ceilings = json.load(open(ceilings_file))["ceilings"] if ceilings_file else {}
roofs(df, ceilings, physical).to_csv(snakemake.output.roofs, index=False)
compile_matrix(list(snakemake.input.compiled)).to_csv(snakemake.output.compile_matrix, index=False)
print(f"{len(df)} rows")
