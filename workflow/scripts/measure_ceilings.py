# Measure this GPU's ceilings in the same run as the kernels.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import gpu_lock, setup

setup(snakemake)
from harness.ceilings import measure_ceilings  # noqa: E402
from harness.device import check_landed, environment_tags  # noqa: E402

check_landed(snakemake.wildcards.platform, snakemake.params.platform_spec)
with gpu_lock():
    ceilings = measure_ceilings(snakemake.params.reps)
write_json(snakemake.output[0], {"env": environment_tags(), "ceilings": ceilings})
