# Commit a family's tuned records: results/{platform}/tuning/{entry}/{shape}.json ->
# results/published/{platform}/tuning/{family}/{entry}/{shape}.json (Snakemake empties the folder first).
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.jobs import setup

setup(snakemake)
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

out = Path(snakemake.output[0])
for f in map(Path, snakemake.input):
    dest = out / f.parent.name / f.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dest)
print(f"published {len(snakemake.input)} tuned records to {out}")
