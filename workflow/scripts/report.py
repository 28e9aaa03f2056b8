# Render the comparison report (harness/report.py): one self-contained HTML file (figures embedded) plus the figures.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.jobs import setup

setup(snakemake)
from pathlib import Path  # noqa: E402

from harness.report import render_report  # noqa: E402
from kernels.registry import VARIANTS, load_all  # noqa: E402

load_all()
p = snakemake.params
page, pngs = render_report(p.result_dir, p.label, p.limits, p.references, p.regression_threshold, p.captions, VARIANTS)
for name, data in pngs.items():
    Path(snakemake.output[name]).write_bytes(data)
Path(snakemake.output.html).write_text(page)
