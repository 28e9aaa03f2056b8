# Publish one family's points of a GPU platform's run: copy its run files, the ceilings and compile
# records of the same run, say where they come from (provenance.json) and what their jobs cost (cost.csv).
# Snakemake empties the output folder first, so a refresh replaces that family's points and nothing else.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import setup

setup(snakemake)
import shutil  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

from harness.cost import BENCHMARKS, COST_FILE, job_table  # noqa: E402
from harness.device import git_commit  # noqa: E402
from harness.records import RUN, read_json  # noqa: E402

# what provenance.json is made of: a run file without it cannot be published (DamagedFile names it and the fix)
RUN_WITH_ENV = RUN | {"env": {"date": str, "gpu_name": str, "git_commit": str}}

out = Path(snakemake.output[0])
platform = snakemake.wildcards.platform
envs = []
for f in map(Path, snakemake.input.runs):
    # results/{platform}/{entry}/{dist}/{shape}.json -> runs/{entry}/{dist}/{shape}.json
    dest = out / "runs" / f.relative_to(f"results/{platform}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    envs.append(read_json(f, RUN_WITH_ENV)["env"])  # checked before it is copied
    shutil.copy2(f, dest)
for f in map(Path, snakemake.input.compiled):
    # results/compile/{variant}/{target}/[sweep/]{tile}.json -> compile/...
    dest = out / "compile" / f.relative_to("results/compile")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dest)
shutil.copy2(snakemake.input.ceilings, out / "ceilings.json")
dates = sorted(e["date"] for e in envs)
write_json(out / "provenance.json", {
    "family": snakemake.params.family, "platform": platform, "entries": list(snakemake.params.entries),
    "gpu_names": sorted({e["gpu_name"] for e in envs}), "nodes": sorted({e.get("node", "unknown") for e in envs}),
    "git_commits": sorted({e["git_commit"] for e in envs}), "measured_from": dates[0], "measured_to": dates[-1],
    "published_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "published_commit": git_commit(),
    "points": len(envs)})
# the cost of the jobs these points were made of (its entries' runs, their inputs and compiles, the ceilings,
# its tune jobs), from their benchmarks: the family's rows only, not a copy of the platform's cost.csv, which
# is collect's output (asking for it would collect, and so run, every family of the platform) and may hold
# jobs of runs whose points are published from elsewhere; collect_published counts a job two families share
# once. No cost.csv where the run's jobs recorded no benchmark (as in the point sets published before).
cost = job_table(BENCHMARKS, platform, files=list(snakemake.params.benchmarks), run_files=list(snakemake.input.runs))
if cost["wall_s"].notna().any():
    cost.to_csv(out / COST_FILE, index=False)
print(f"published {len(envs)} points of {snakemake.params.family} to {out}")
