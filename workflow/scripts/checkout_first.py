"""Imported first by every workflow script, before anything imports ``harness`` or ``kernels``: puts this
checkout's root first on sys.path, so that a job runs the code its rule's dependencies were computed from
(harness/deps.py), even where another checkout of lpgemm is installed. Snakemake appends this folder and
the planning process's path (this root among it) to a job's sys.path, after site-packages, where an
installed lpgemm would win; and it drops PYTHONPATH from a conda job's environment. So this one step is a
file here, not a function of harness; the rest of a job's start is harness/jobs.py (setup)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
