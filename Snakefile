# lpgemm: build, compile, run and compare low-precision GEMM kernels written in TileLang.
#
#   snakemake --cores 1              # the whole pipeline for this host (CPU-only or GPU)
#   snakemake -n                     # show what would run
#   snakemake --profile profiles/slurm --config 'run_on=[h100,b200]'   # GPU platforms on a cluster
#
# Results path grammar (everything under results/ is generated):
#   results/inputs/{dist}/{M}x{N}x{K}/fp32.pt            unquantized A (M,K), B (N,K); manifest.json: sha256
#   results/inputs/{dist}/{M}x{N}x{K}/formats/{fmt}.pt   quantized operands per input format
#   results/compile/{variant}/{target}/{tile}.json            compile check of a target (sweeps.cpu_compile shapes)
#   results/compile/{variant}/{target}/sweep/{tile}.json      the same at every GPU shape (a GPU platform's arch)
#   results/compile/{variant}/artifacts/{target}/{tile}/{shape}/kernel.cu, .ptx, .cubin, .sass
#   results/{platform}/{variant}/{dist}/{M}x{N}x{K}.json        one run: a row per tile (lib or emulated for baselines and CPU hosts)
#   results/{platform}/tuning/{entry}/{M}x{N}x{K}.json   a tune job's record: candidates timed, the winner (GPU hosts)
#   results/{platform}/ceilings.json                     library probes: copy bandwidth, cuBLAS GEMM per precision (GPU hosts)
#   results/{platform}/tidy.csv|parquet, compile_matrix.csv, roofs.csv (physical and measured limits),
#   results/{platform}/report.html (self-contained), figures/*.png
#   results/{platform}/profile/{entry}/{dist}/{M}x{N}x{K}/{tile}.ncu-rep, .raw.csv, .summary.json   on request (ncu)
#   results/published/{platform}/points/{family}/         committed points of one family refresh (+ provenance.json)
#   results/published/{platform}/tuning/{family}/{entry}/{M}x{N}x{K}.json   the committed tuned table
#   results/published/{platform}/tidy.csv, point_sets.csv, report.html   rebuilt from every family's points
#   results/published/{platform}/profile/{entry}/{dist}/{M}x{N}x{K}/{tile}/summary.json, raw.csv   committed profiles
# platform: "cpu" (CPU emulation) or a slug of config platforms (h200, h100, b200, l40s, a100): config
# run_on lists those to run ("auto": this host); target: an nvcc arch (sm_90a); tile: kernels/tiles.py
# grammar, "lib" for a library baseline, "emulated" on the CPU.

# Snakemake's own error for a broken config.yaml gives no line or column: read it first (a --configfile is
# read by Snakemake before this file, and keeps its message)
import sys as _sys

from snakemake.exceptions import WorkflowError as _WorkflowError

# plan with this checkout's kernels and harness, even where another checkout of lpgemm is installed
_sys.path.insert(0, workflow.basedir)
from harness.plan import ConfigError as _ConfigError, load_config_text as _load_config_text  # noqa: E402

if not workflow.config_settings.configfiles:
    try:
        _load_config_text("config.yaml")
    except _ConfigError as _e:
        raise _WorkflowError(str(_e)) from None


configfile: "config.yaml"

# One snakemake writes in this checkout at a time (a second one is refused, naming the first), and no local
# job outlives it or ignores its interrupt: export this process's identity to the jobs, which watch it, and
# forward SIGINT to them (harness/jobs.py: register_main).
from harness.jobs import hold_checkout as _hold_checkout, register_main as _register_main  # noqa: E402

_register_main(workflow)


include: "workflow/rules/common.smk"
include: "workflow/rules/inputs.smk"
include: "workflow/rules/compile.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/publish.smk"


rule all:
    input:
        expand("results/{platform}/tidy.csv", platform=RUN_ON),
        expand("results/{platform}/report.html", platform=RUN_ON),
    default_target: True


# started through the API (no command line for register_main to read): the checkout's invocation lock is
# taken here, before any job is prepared (snakemake deletes a job's old outputs then)
onstart:
    _hold_checkout()


# the end of every run lists each failed row with its log (common.smk: report_failures)
onsuccess:
    report_failures()


onerror:
    report_failures()
