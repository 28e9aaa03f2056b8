"""Where a run's time goes: every job's Snakemake benchmark as one table of jobs, and what a report says of it.

Every rule with a log ``results/logs/<X>.log`` records its job's cost in ``results/benchmarks/<X>.tsv``
(``benchmark_of``; Snakemake's ``benchmark:``: wall seconds ``s``, ``max_rss`` in MB, ``cpu_time`` in seconds,
...). Snakemake writes it as the job ends, so the file's mtime is the job's end, and the end less its wall
seconds its start. ``job_table`` makes one row per job: its kind (from its path, ``kind_of``), its name (the
path under results/benchmarks without ``.tsv``), wall seconds, peak resident memory, CPU seconds, start and
end (UTC); a run job's row adds what its records say of it (each record's ``cost``, written by
workflow/scripts/run_variant.py): seconds loading inputs, building and checking tiles, timing them alone and
paired, and the rest of its wall time, its set-up. ``summary`` is what the report's "What this run cost"
shows. Plain pandas, no Snakemake: collect writes ``results/<platform>/cost.csv``, publish_family a family's
``points/<family>/cost.csv``, collect_published their concatenation.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.jobs import BENCHMARKS, benchmark_of, forked_cost_of
from harness.records import RUN, DamagedFile, read_json, utc

KINDS = ("inputs", "compile", "run", "tune", "ceilings", "collect", "report", "publish", "other")
# kinds of jobs every platform's tables are made of (they name no platform)
SHARED = ("inputs", "compile")
# a gap between jobs shorter than this keeps them in one sitting
SITTING_GAP_S = 60.0
JOB_COLUMNS = ["kind", "job", "wall_s", "max_rss_mb", "cpu_s", "start", "end"]
# a run job's: its records, the seconds they spent loading, building and checking, timing alone and paired;
# timing_s = standalone_s + paired_s, setup_s = wall_s - timing_s (process start, imports, the GPU check,
# loading, building and checking: everything but timing)
RUN_COLUMNS = ["records", "load_s", "build_check_s", "standalone_s", "paired_s", "timing_s", "setup_s"]
COLUMNS = JOB_COLUMNS + RUN_COLUMNS
COST_FILE = "cost.csv"


def job_name(path: str | Path, root: str | Path = BENCHMARKS) -> str:
    """A benchmark file's job: its path under ``root`` without .tsv (``cpu/fp8_e4m3/normal``)."""
    return Path(path).relative_to(root).as_posix().removesuffix(".tsv")


def kind_of(job: str) -> str:
    """What a job is, from its name (its log's path under results/logs, workflow/rules/*.smk)."""
    parts = job.split("/")
    head, last = parts[0], parts[-1]
    if head in SHARED:
        return head
    if head == "screenshots":
        return "report"
    if head == "published":  # published/<platform>/{collect, report, publish_<family>, tuning_<family>, profile/...}
        return last if len(parts) == 3 and last in ("collect", "report") else "publish"
    if len(parts) == 2:  # <platform>/{ceilings, collect, report}
        return {"ceilings": "ceilings", "collect": "collect", "report": "report"}.get(last, "other")
    if parts[1] == "tuning":
        return "tune"
    if parts[1] == "profile":
        return "other"
    return "run" if len(parts) == 3 else "other"  # <platform>/<entry>/<dist>[_zoo]: a run or an emulation


def set_of(job: str) -> str | None:
    """The result set a job belongs to: its platform (``h200``, ``cpu``), ``published/<platform>`` for a
    published set's jobs, a screenshot's folder under results/; None for inputs and compiles (every
    platform's tables are made of them)."""
    parts = job.split("/")
    if parts[0] in SHARED:
        return None
    if parts[0] == "published":
        return "/".join(parts[:2])
    if parts[0] == "screenshots":
        return "/".join(parts[2:]) if parts[1:2] == ["results"] else "/".join(parts[1:])
    return parts[0]


def seconds(stamp) -> float:
    """A UTC ISO timestamp as a POSIX time."""
    return pd.Timestamp(stamp).timestamp()


def read_benchmark(path: str | Path) -> dict:
    """One benchmark file: wall seconds, peak RSS (MB) and CPU seconds (summed over its rows, one per
    ``repeat``), and when it ran (end: the file's mtime)."""
    t = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
    if t.empty or "s" not in t or t["s"].isna().all():
        raise ValueError("no benchmark row")
    end = Path(path).stat().st_mtime
    wall = float(t["s"].sum())
    row = {"wall_s": wall,
           "max_rss_mb": float(t["max_rss"].max()) if "max_rss" in t else np.nan,
           "cpu_s": float(t["cpu_time"].sum(min_count=1)) if "cpu_time" in t else np.nan,
           "start": utc(end - wall), "end": utc(end)}
    # a warm start (harness/warm.py): snakemake measured the job's waiting process; the child that ran the job
    # left its own peak memory and CPU time beside the benchmark
    forked = Path(forked_cost_of(str(path)))
    if forked.exists():
        try:
            child = read_json(forked, {"max_rss_mb": float, "cpu_s": float})
        except DamagedFile as e:
            print(f"lpgemm: {e}", file=sys.stderr)
        else:
            row["max_rss_mb"] = np.nanmax([row["max_rss_mb"], child["max_rss_mb"]])
            row["cpu_s"] = np.nansum([row["cpu_s"], child["cpu_s"]])
    return row


def read_benchmarks(root: str | Path = BENCHMARKS, platform: str | None = None,
                    files: list[str] | None = None) -> pd.DataFrame:
    """A job per benchmark file under ``root`` (``files``: those of them, each job's row empty where its file is
    missing: made before jobs recorded their benchmarks), leaving out the jobs of any other result set than
    ``platform``'s (inputs and compiles belong to every platform). An unreadable file is named on stderr and
    its row left empty."""
    root = Path(root)
    paths = sorted(root.rglob("*.tsv")) if files is None else [Path(f) for f in files]
    rows = []
    for path in paths:
        job = job_name(path, root)
        if platform is not None and set_of(job) not in (None, platform):
            continue
        row = {"kind": kind_of(job), "job": job}
        if path.is_file():
            try:
                row |= read_benchmark(path)
            except (OSError, ValueError) as e:  # pandas' parser errors are ValueErrors
                print(f"lpgemm: {path}: unreadable benchmark, no cost for its job ({e})", file=sys.stderr)
        rows.append(row)
    table = pd.DataFrame(rows, columns=JOB_COLUMNS).astype({c: float for c in ("wall_s", "max_rss_mb", "cpu_s")})
    return table.sort_values(["start", "job"]).reset_index(drop=True)


def record_costs(run_files: list[str]) -> pd.DataFrame:
    """Per run job (named as its benchmark is, from the log each record names), what its records' ``cost``
    say: how many there are and the seconds they spent loading, building and checking, timing alone and
    paired. A record without ``cost`` (made before records kept it) or unreadable is left out."""
    rows = []
    for f in run_files:
        try:
            d = read_json(f, RUN)
        except DamagedFile:  # collect's tidy table names it as a failed row already
            continue
        cost, log = d.get("cost"), d["point"].get("log")
        if not isinstance(cost, dict) or not log:
            continue
        try:
            job = job_name(benchmark_of(log))
        except ValueError:
            continue
        rows.append({"job": job, **{k: float(cost.get(k) or 0.0)
                                    for k in ("load_s", "build_check_s", "standalone_s", "paired_s")}})
    if not rows:
        return pd.DataFrame({"job": pd.Series(dtype=str), **{c: pd.Series(dtype=float) for c in RUN_COLUMNS[:5]}})
    per = pd.DataFrame(rows).groupby("job")
    return per.sum().assign(records=per.size()).reset_index()[["job", *RUN_COLUMNS[:5]]]


def job_table(root: str | Path = BENCHMARKS, platform: str | None = None, files: list[str] | None = None,
              run_files: list[str] = ()) -> pd.DataFrame:
    """The cost table of a platform's jobs (``read_benchmarks``), each run job with its records' split of
    its wall time (``RUN_COLUMNS``: NaN where its records carry no cost)."""
    jobs = read_benchmarks(root, platform, files)
    recs = record_costs(list(run_files))
    table = jobs.merge(recs, on="job", how="left")
    table["timing_s"] = table["standalone_s"] + table["paired_s"]
    table["setup_s"] = table["wall_s"] - table["timing_s"]
    return table[COLUMNS].round({c: 4 for c in RUN_COLUMNS[1:]})


def published_cost_files(folder: str | Path) -> list[str]:
    """The cost tables of a published folder's point sets present (points/<family>/cost.csv)."""
    root = Path(folder) / "points"
    return sorted(str(p) for p in root.glob(f"*/{COST_FILE}")) if root.is_dir() else []


def concat_point_sets(folder: str | Path) -> pd.DataFrame:
    """A published folder's cost: every point set's table (``point_set``: its family), a job counted once
    where two families were published from the same run (same job, same start and end); no row where no
    point set has one (published before jobs recorded their cost)."""
    files = published_cost_files(folder)
    if not files:
        return pd.DataFrame(columns=["point_set", *COLUMNS])
    frames = [pd.read_csv(f).assign(point_set=Path(f).parent.name) for f in files]
    table = pd.concat(frames, ignore_index=True)
    return (table.drop_duplicates(["job", "start", "end"]).sort_values(["start", "job"])
            .reset_index(drop=True)[["point_set", *COLUMNS]])


def load(folder: str | Path) -> pd.DataFrame | None:
    """The cost table of a result set: a platform's ``cost.csv`` (collect), or a published folder's point
    sets' (``concat_point_sets``, empty where none has one); None for a platform folder without one (made
    before jobs recorded their cost)."""
    folder = Path(folder)
    if (folder / "points").is_dir():
        return concat_point_sets(folder)
    return pd.read_csv(folder / COST_FILE) if (folder / COST_FILE).is_file() else None


def merged(intervals: list[tuple[float, float]], gap: float = 0.0) -> list[tuple[float, float]]:
    """``intervals`` (start, end) merged where one starts less than ``gap`` seconds after the ones before it
    end (gap 0: where they overlap or touch)."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and (start - out[-1][1] < gap or start <= out[-1][1]):
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def intervals_of(table: pd.DataFrame) -> list[tuple[float, float]]:
    """(start, end) of each job that recorded its benchmark."""
    known = table.dropna(subset=["start", "end"])
    return [(seconds(s), seconds(e)) for s, e in zip(known["start"], known["end"], strict=True)]


def union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least one job ran: a job reused from an older invocation counts its own
    duration, not the time between."""
    return sum(b - a for a, b in merged(intervals))


def sittings(intervals: list[tuple[float, float]], gap: float = SITTING_GAP_S) -> int:
    """Separate sittings: maximal sets of jobs each overlapping, touching or following the others by under
    ``gap`` seconds."""
    return len(merged(intervals, gap))


def summary(table: pd.DataFrame, slowest: int = 10) -> dict:
    """What the report shows: wall time to the report (the union of the jobs' intervals), the span from the
    first start to the last end and the sittings; per kind the summed wall and CPU seconds and the count;
    the ``slowest`` jobs; the run jobs' wall time split into set-up and timing (of those whose records say).
    ``jobs`` counts the jobs with a benchmark, ``unrecorded`` those without."""
    table = table.reindex(columns=list(dict.fromkeys([*table.columns, *COLUMNS])))  # a job table of read_benchmarks too
    iv = intervals_of(table)
    recorded = table[table["wall_s"].notna()]
    kinds = (recorded.groupby("kind").agg(jobs=("job", "size"), wall_s=("wall_s", "sum"), cpu_s=("cpu_s", "sum"),
                                          max_rss_mb=("max_rss_mb", "max"))
             .reindex([k for k in KINDS if k in set(recorded["kind"])]).reset_index())
    runs = recorded[(recorded["kind"] == "run") & recorded["timing_s"].notna()]
    return {"jobs": len(recorded), "unrecorded": len(table) - len(recorded), "union_s": union_s(iv),
            "span_s": (max(b for _, b in iv) - min(a for a, _ in iv)) if iv else 0.0,
            "sittings": sittings(iv), "per_kind": kinds,
            "slowest": recorded.nlargest(slowest, "wall_s")[["kind", "job", "wall_s", "cpu_s", "max_rss_mb", "start"]],
            "run_jobs": int((recorded["kind"] == "run").sum()), "run_jobs_split": len(runs),
            "run": {c: float(runs[c].sum()) for c in ("wall_s", "setup_s", "timing_s", "standalone_s", "paired_s",
                                                      "load_s", "build_check_s")}}


def duration(s: float) -> str:
    """Seconds as a person reads them: 42.1 s, 7 min 05 s, 2 h 03 min."""
    if not np.isfinite(s):
        return "–"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"
