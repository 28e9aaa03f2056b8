# Publish one family's points of a GPU platform's run: copy its run files, the ceilings and compile
# records of the same run, and say where they come from (provenance.json). Snakemake empties the
# output folder first, so a refresh replaces that family's points and nothing else.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import setup

setup(snakemake)
import shutil  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

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
print(f"published {len(envs)} points of {snakemake.params.family} to {out}")
