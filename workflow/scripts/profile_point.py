# Profile one timed point with Nsight Compute on a node with its platform's GPU (harness/profile.py):
# the .ncu-rep, its raw page as CSV, and the summary the report lists.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import gpu_lock, setup

repo = setup(snakemake)
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from harness import profile  # noqa: E402
from harness.device import check_landed, environment_tags  # noqa: E402
from harness.records import COMPILE, DamagedFile, read_json  # noqa: E402
from harness.runner import kernel_names  # noqa: E402
from kernels.registry import bytes_moved, bytes_per_element, get_variant  # noqa: E402
from kernels.tiles import parse_shape  # noqa: E402

wc, p, out = snakemake.wildcards, snakemake.params, snakemake.output
variant = get_variant(p.variant)
check_landed(wc.platform, p.platform_spec)
ncu = profile.ncu_path()
names = None
if variant.kernel is not None:  # its own kernels only, by name, as its compile step built them at this shape
    try:
        record = read_json(snakemake.input.compiled, COMPILE)
    except DamagedFile as e:
        raise SystemExit(f"nothing to profile: {e}") from None
    rec = next((r for r in record["records"] if r["shape"] == wc.shape), None)
    if rec is None:
        raise SystemExit(f"{snakemake.input.compiled} has no record at {wc.shape}; recompute it: "
                         f"snakemake --cores 1 -f {snakemake.input.compiled}")
    if rec["status"] != "ok":
        raise SystemExit(f"{variant.name} {wc.tile} at {wc.shape} did not compile ok for {p.arch} ({rec['status']}: "
                         f"{rec.get('reason', '')}): nothing to profile")
    names = sorted(kernel_names((Path(snakemake.input.artifacts) / wc.shape / "kernel.cu").read_text()))
child = [sys.executable, "-m", "harness.profile", "--variant", variant.name, "--shape", wc.shape, "--tile", wc.tile,
         "--arch", p.arch, "--fp32", snakemake.input.fp32, "--formats", snakemake.input.formats,
         "--manifest", snakemake.input.manifest]
cmd = profile.ncu_command(ncu, out.report, names, child)
print(" ".join(cmd), flush=True)
# the child imports this checkout's harness and kernels, as this job does
env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])]))
with gpu_lock():
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
print(proc.stdout, proc.stderr, sep="\n", flush=True)
if proc.returncode != 0 or "==ERROR==" in proc.stdout + proc.stderr or not Path(out.report).is_file():
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "==ERROR==" in ln or "Error" in ln]
    raise profile.ProfileUnavailable(f"ncu failed (rc {proc.returncode}): {' | '.join(errors[:5]) or 'see the log'}")
raw = profile.raw_page(ncu, out.report)
Path(out.raw).write_text(raw)
M, N, K = parse_shape(wc.shape)
summary = profile.summarize(profile.parse_raw(raw), float(bytes_moved(bytes_per_element(variant.name), M, N, K)))
point = {"platform": wc.platform, "target": p.arch, "entry": wc.entry, "variant": variant.name, "family": variant.family,
         "dist": wc.dist, "shape": wc.shape, "M": M, "N": N, "K": K, "tile": wc.tile}
how = {"ncu": profile.ncu_version(ncu), "clock_control": "none", "cache_control": "all (flushed before every pass)",
       "kernel_filter": names, "nvtx_range": profile.NVTX_RANGE, "sections": list(profile.SECTIONS),
       "report": str(out.report)}
write_json(out.summary, {"point": point, "profile": how, "env": environment_tags(), **summary})
