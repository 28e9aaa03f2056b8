"""Tidy tables from run records (pure pandas, no Snakemake): used by collect.py and report.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from harness import sass
from harness.records import CEILINGS, COMPILE, PROFILE_SUMMARY, PROVENANCE, RUN, TUNE, DamagedFile, missing_status, note, read_json
from kernels.registry import bytes_moved

# the columns that identify a measurement (unique in a tidy table); everything else is a metric or a tag.
# point_set: "all" for one platform's run; in a published folder, the family whose refresh measured the
# point (a baseline shared by two families is measured, and kept, once in each family's run)
KEYS = ["platform", "point_set", "target", "entry", "dist", "shape", "tile"]
SORT = ["platform", "point_set", "target", "family", "variant", "entry", "dist", "M", "N", "K", "tile"]
ONE_RUN = "all"


class DuplicateRows(ValueError):
    """Two run records claim the same measurement key."""


def read_ceilings(path: str | Path | None, damaged: list | None = None) -> dict:
    """The library probes of a ceilings.json ({} for none). A damaged file is noted in ``damaged`` and
    counts as no probes when that list is given, else raised."""
    if path is None:
        return {}
    try:
        return read_json(path, CEILINGS)["ceilings"]
    except DamagedFile as e:
        if damaged is None:
            raise
        note(damaged, e)
        return {}


def unreadable_run(path: str, error: DamagedFile, defaults: dict) -> dict:
    """The one failed row standing for an unreadable run file: its key from the path grammar
    (.../{entry}/{dist}/{M}x{N}x{K}.json), what the config says of its entry, the reason."""
    entry, dist, stem = Path(path).parts[-3], Path(path).parts[-2], Path(path).stem
    dims = stem.split("x")
    M, N, K = (int(x) for x in dims) if len(dims) == 3 and all(x.isdigit() for x in dims) else (np.nan,) * 3
    return {"platform": "?", "target": "?", "variant": entry, "family": "?", **defaults.get("*", {}),
            **defaults.get(entry, {}), "entry": entry, "dist": dist, "shape": stem, "M": M, "N": N, "K": K,
            "tile": "?", "status": "failed", "reason": str(error), "source_file": str(path)}


def tidy_runs(run_files: list[str], ceilings_file: str | None = None, physical: dict | None = None,
              bytes_of: dict[str, tuple[float, float, float]] | None = None, point_set: str = ONE_RUN,
              defaults: dict[str, dict] | None = None, damaged: list | None = None) -> pd.DataFrame:
    """One row per platform x target x config entry x distribution x shape x tile: metrics, env tags,
    and, for timed rows, their fraction of the physical limits and of the run's measured best.

    ``physical``: the platform's datasheet limits (config ``platforms.<slug>``); ``bytes_of``: per
    variant, bytes per element of A and B that its kernel reads and of C it writes. An unreadable file
    becomes one failed row naming it (the others are kept); ``defaults`` fills that row's columns: per
    config entry (variant, family, precision, ...) and under "*" for every file (platform, target).
    A file of the wrong shape is unreadable too; a row without a status is failed, naming the file.
    ``damaged``: where given, every damaged file is noted there (harness.records.note), and a damaged
    ceilings file counts as no probes instead of raising.
    """
    records, unreadable = [], []
    for f in run_files:
        try:
            d = read_json(f, RUN)
        except DamagedFile as e:
            records.append(unreadable_run(f, e, defaults or {}) | {"point_set": point_set})
            note(damaged, e)
            unreadable.append(str(f))
            continue
        tol = {f"tol_{k}": v for k, v in d.get("tolerance", {}).items()}
        point = {k: v for k, v in d["point"].items() if k != "input_sha256"}
        for i, row in enumerate(d["rows"]):
            if not isinstance(row.get("status"), str):  # failed, never a NaN status
                e = missing_status(f, i, row)
                row = row | {"status": "failed", "reason": str(e) + (f" (its reason: {row['reason']})" if row.get("reason") else "")}
                note(damaged, e)
            records.append(point | d["env"] | tol | row | {"input_sha256": json.dumps(d["point"].get("input_sha256", {})),
                                                            "source_file": str(f), "point_set": point_set})
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return df
    for col in ("platform", "target"):  # an unreadable file's, when the path does not say: its run's
        known = df.loc[df[col] != "?", col]
        if len(known):
            df.loc[df[col] == "?", col] = known.mode().iloc[0]
    if unreadable:  # and what its entry's readable files say of it (no config defaults: a report's reference set)
        bad = df["source_file"].isin(unreadable)
        for col in ("variant", "family", "precision", "ops_unit", "input_format"):
            if col in df:
                of_entry = df[~bad].groupby("entry")[col].first()
                df.loc[bad, col] = df.loc[bad, "entry"].map(of_entry).fillna(df.loc[bad, col])
    check_unique(df)
    for col in ("throughput", "time_ms_median", "time_ms_p20", "time_ms_p80"):
        if col not in df:
            df[col] = np.nan
    df = add_limits(df, read_ceilings(ceilings_file, damaged), physical, bytes_of or {})
    front = [c for c in SORT + ["status", "reason", "throughput", "ops_unit", "time_ms_median", "time_ms_p20",
                                "time_ms_p80", "pct_of_peak", "pct_of_roof", "pct_of_measured_best"] if c in df]
    return df[front + [c for c in df.columns if c not in front]].sort_values(SORT).reset_index(drop=True)


def point_sets(points_dir: str | Path, physical: dict | None, bytes_of: dict[str, tuple[float, float, float]],
               defaults: dict[str, dict] | None = None,
               damaged: list | None = None) -> tuple[pd.DataFrame, dict, list[str], pd.DataFrame]:
    """A published folder's points, one family refresh per sub-folder: the tidy rows of every family
    (each with the limits of its own run), the best ceiling probes over all runs, every compile record,
    and one provenance row per family (when, at which commit, on which GPU it was measured).

    A damaged run file becomes a failed row naming it. With a ``damaged`` list (the report's "Damaged
    inputs"), a damaged provenance or ceilings file leaves its family's provenance or probes out and every
    damaged file is noted there; without one (rebuilding the committed tables) they raise DamagedFile."""
    frames, ceilings, compiled, sets = [], {}, [], []
    for d in sorted(p for p in Path(points_dir).iterdir() if p.is_dir()):
        try:
            prov = read_json(d / "provenance.json", PROVENANCE)
        except DamagedFile as e:
            if damaged is None:  # no list to show it in (rebuilding the committed tables): refused
                raise
            note(damaged, e)
            prov = {"damaged": f"{e.path}: {e.problem}"}
        runs = sorted(str(f) for f in (d / "runs").rglob("*.json"))
        frames.append(tidy_runs(runs, str(d / "ceilings.json"), physical, bytes_of, point_set=d.name,
                                defaults=defaults, damaged=damaged))
        for name, probe in read_ceilings(d / "ceilings.json", damaged).items():
            if name not in ceilings or (probe.get("value") or 0) > (ceilings[name].get("value") or 0):
                ceilings[name] = probe | {"how": f"{probe.get('how', '')} (run of {d.name})"}
        compiled += sorted(str(f) for f in (d / "compile").rglob("*.json"))
        sets.append({"point_set": d.name, "rows": len(frames[-1]), **{k: (", ".join(map(str, v)) if isinstance(v, list) else v)
                                                                      for k, v in prov.items() if k != "family"}})
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(df):
        check_unique(df)
        df = df.sort_values(SORT).reset_index(drop=True)
    return df, ceilings, compiled, pd.DataFrame(sets)


def check_unique(df: pd.DataFrame) -> None:
    dup = df[df.duplicated(KEYS, keep=False)]
    if len(dup):
        lines = [f"  {'/'.join(str(v) for v in k)}: {', '.join(g['source_file'])}"
                 for k, g in dup.groupby(KEYS, sort=True)]
        raise DuplicateRows(f"{len(lines)} measurement key(s) ({', '.join(KEYS)}) appear more than once:\n"
                            + "\n".join(lines))


def add_limits(df: pd.DataFrame, ceilings: dict, physical: dict | None,
               bytes_of: dict[str, tuple[float, float, float]]) -> pd.DataFrame:
    """Bytes, intensity and the limits of each row.

    peak: the datasheet's dense peak of the row's precision; roof: min(peak, intensity x HBM
    bandwidth), both physical upper bounds; measured_best: per precision, the faster of the library
    probe (ceilings.json) and every ok row of this run. A timed row above its physical roof cannot be
    a true measurement: it is marked failed, with the numbers.
    """
    df = df.copy()
    per = df["variant"].map(bytes_of)
    a, b, c = (per.map(lambda t, i=i: t[i] if isinstance(t, tuple) else np.nan) for i in range(3))
    df["bytes_moved"] = bytes_moved((a, b, c), df["M"], df["N"], df["K"])
    df["intensity"] = 2.0 * df["M"] * df["N"] * df["K"] / df["bytes_moved"]
    seconds = df["time_ms_median"] * 1e-3
    df["bandwidth_TBps"] = df["bytes_moved"] / seconds / 1e12
    # bytes of B (the weight, with its scales) per second: the figure of merit of memory-bound shapes
    df["weight_TBps"] = df["N"] * df["K"] * b / seconds / 1e12
    if physical:
        df["peak"] = df["precision"].map(physical["peak"]).astype(float)
        df["hbm_TBps"] = float(physical["hbm_TBps"])
        df["roof"] = np.minimum(df["peak"], df["intensity"] * df["hbm_TBps"])
    else:
        df["peak"] = df["hbm_TBps"] = df["roof"] = np.nan
    df["pct_of_peak"] = 100 * df["throughput"] / df["peak"]
    df["pct_of_roof"] = 100 * df["throughput"] / df["roof"]
    over = (df["status"] == "ok") & (df["throughput"] > df["roof"])
    if over.any():
        df.loc[over, "reason"] = [
            f"throughput {t:.1f} exceeds the physical roof {r:.1f} (datasheet peak {p:.0f}, HBM "
            f"{h:.2f} TB/s at intensity {i:.1f}): the timing cannot be right"
            for t, r, p, h, i in df.loc[over, ["throughput", "roof", "peak", "hbm_TBps", "intensity"]].to_numpy()]
        df.loc[over, "status"] = "failed"
    best = measured_best(df, ceilings)
    df["measured_best"] = df["precision"].map(best.set_index("precision")["value"]) if len(best) else np.nan
    df["pct_of_measured_best"] = 100 * df["throughput"] / df["measured_best"]
    return df


def measured_best(df: pd.DataFrame, ceilings: dict) -> pd.DataFrame:
    """Per precision, the fastest throughput of the run: a library probe or any ok row, whichever wins."""
    cands = [{"precision": v["precision"], "value": v["value"], "by": f"probe {k}: {v['how']}"}
             for k, v in ceilings.items() if v.get("precision") not in (None, "memory")]
    ok = df[(df["status"] == "ok") & df["throughput"].notna()]
    for prec, g in ok.groupby("precision"):
        r = g.loc[g["throughput"].idxmax()]
        cands.append({"precision": prec, "value": r["throughput"], "by": f"{r['entry']} {r['shape']} {r['tile']}"})
    if not cands:
        return pd.DataFrame(columns=["precision", "value", "by"])
    c = pd.DataFrame(cands)
    return c.loc[c.groupby("precision")["value"].idxmax()].reset_index(drop=True)


def roofs(df: pd.DataFrame, ceilings: dict, physical: dict | None) -> pd.DataFrame:
    """The limits of a run, one row each: physical (datasheet) and measured (best of the run)."""
    rows = []
    units = df.groupby("precision")["ops_unit"].first().to_dict() if len(df) else {}
    if physical:
        for prec, v in physical["peak"].items():
            if v is None:  # no tensor-core path for this precision on this GPU
                continue
            rows.append({"kind": "physical", "precision": prec, "value": float(v), "unit": units.get(prec, "TFLOP/s"),
                         "by": f"{physical['name']} datasheet, dense ({physical['source']})"})
        rows.append({"kind": "physical", "precision": "memory", "value": float(physical["hbm_TBps"]), "unit": "TB/s",
                     "by": f"{physical['name']} HBM bandwidth ({physical['source']})"})
    for _, r in measured_best(df, ceilings).iterrows():
        rows.append({"kind": "measured", "precision": r["precision"], "value": r["value"],
                     "unit": units.get(r["precision"], "TFLOP/s"), "by": r["by"]})
    if "copy_bandwidth" in ceilings:
        cb = ceilings["copy_bandwidth"]
        rows.append({"kind": "measured", "precision": "memory", "value": cb["value"], "unit": cb["unit"], "by": cb["how"]})
    return pd.DataFrame(rows, columns=["kind", "precision", "value", "unit", "by"])


def compile_matrix(compile_files: list[str], damaged: list | None = None) -> pd.DataFrame:
    """One row per target x variant x tile x shape: status, reason, the SASS's tensor-core instructions
    (``sass_mma``: opcode xcount; ``sass``: their short names), spill instructions, registers, memory, and
    the instruction classes of the generated source. A damaged record becomes a failed row naming it (and
    is noted in ``damaged``)."""
    rows = []
    for f in compile_files:
        try:
            d = read_json(f, COMPILE)
        except DamagedFile as e:  # results/compile/{variant}/{target}/[sweep/]{tile}.json
            note(damaged, e)
            parts = Path(f).parts
            variant, target = (parts[-3], parts[-2]) if parts[-2] != "sweep" else (parts[-4], parts[-3])
            rows.append({"target": target, "variant": variant, "tile": Path(f).stem, "shape": "?",
                         "status": "failed", "reason": str(e)})
            continue
        for r in d["records"]:
            r = dict(r)
            r["instructions"] = ",".join(r.get("instructions") or [])
            if "sass_mma" in r:
                r["sass"] = ", ".join(dict.fromkeys(sass.short_name(op) for op in r["sass_mma"])) or "none"
                r["sass_mma"] = sass.mma_label(r["sass_mma"])
            rows.append(r)
    cols = ["target", "variant", "tile", "shape", "status", "reason", "sass", "sass_mma", "sass_local_loads",
            "sass_local_stores", "registers", "stack_bytes", "local_bytes", "smem_static_bytes", "smem_dynamic_bytes",
            "instructions", "compile_s", "sass_tool", "sass_error",
            "spill_store_bytes"]  # ptxas -v's, in records made before the SASS was read
    df = pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=cols)
    return df[[c for c in cols if c in df]].sort_values(["variant", "target", "tile", "shape"]).reset_index(drop=True)


def sass_names(values: pd.Series) -> str:
    """The distinct short SASS names in a column of ``compile_matrix``'s ``sass`` ("A, B" each), sorted."""
    return ", ".join(sorted({name for v in values.dropna() for name in v.split(", ") if name}))


def compile_summary(cm: pd.DataFrame) -> pd.DataFrame:
    """variant x target: ok / unsupported / failed (worst over tiles and shapes) with the first reason."""
    order = {"ok": 0, "unsupported": 1, "failed": 2}

    def agg(g: pd.DataFrame) -> pd.Series:
        worst = max(g["status"], key=lambda s: order.get(s, 3))
        reason = next((r for r in g["reason"] if r), "")
        regs = g["registers"].max() if "registers" in g else np.nan
        return pd.Series({"status": worst, "kernels": len(g), "ok": int((g["status"] == "ok").sum()),
                          "instructions": ",".join(sorted({i for s in g["instructions"].fillna("") for i in s.split(",") if i})),
                          "sass": sass_names(g.get("sass", pd.Series(dtype=str))),
                          "max_registers": regs, "reason": reason})

    return cm.groupby(["variant", "target"]).apply(agg, include_groups=False).reset_index()


# a GPU run job times its variant's fastest tile against its peers, strictly alternated in one process
# (harness/stats.py), and writes the result on that tile's row: the cold state's columns unprefixed, the
# sustained state's prefixed "sustained_". Older sets, and CPU runs, have none of them.
PAIR_PREFIXES = ("pair_", "sustained_")
POWER_STATE = ("sm_clock_mhz_median", "sm_clock_mhz_min", "default_sm_clock_mhz", "power_w_median", "gpu_temp_c_max",
               "throttled", "clock_source", "clock_samples")
POINT = ["point_set", "target", "variant", "dist", "shape"]
VERDICTS = ("faster", "same", "slower")
PAIRED, UNPAIRED = "paired", "unpaired (separate jobs)"


def pair_columns(df: pd.DataFrame) -> list[str]:
    """The columns a paired timing wrote (empty for a set timed before pairing)."""
    return [c for c in df.columns if c.startswith(PAIR_PREFIXES) or c in POWER_STATE]


def best_tiles(df: pd.DataFrame) -> pd.DataFrame:
    """Per (point set, target, variant, dist, shape): the fastest tile among rows within tolerance, with
    the paired timing of its point (``paired_tile``: the tile it paired, its fastest by median time;
    the fastest by throughput is normally the same one, but the pair belongs to the point either way)."""
    ok = df[(df["status"] == "ok") & df["throughput"].notna()]
    if "point_set" not in ok:  # a tidy table written before point sets: one run
        ok = ok.assign(point_set=ONE_RUN)
    if ok.empty:
        return ok
    idx = ok.groupby(POINT)["throughput"].idxmax()
    best = ok.loc[idx].reset_index(drop=True)
    cols = pair_columns(ok)
    if not cols:
        return best
    # the paired row is the one with a ratio; the power-state columns alone say so only where no ratio was written
    signal = [c for c in cols if c.startswith(PAIR_PREFIXES)] or cols
    carriers = ok[ok[signal].notna().any(axis=1)].drop_duplicates(POINT)[POINT + cols + ["tile"]]
    return best.drop(columns=cols).merge(carriers.rename(columns={"tile": "paired_tile"}), on=POINT, how="left")


def _column(df: pd.DataFrame, name: str) -> pd.Series:
    """A column, or missing values where the set has none (sets timed before pairing)."""
    return df[name] if name in df else pd.Series(np.nan, index=df.index, dtype=object)


def _paired_ratio(out: pd.DataFrame, prefix: str, group: str, peer_column: str) -> tuple[pd.Series, ...]:
    """Median, lo, hi and verdict of one paired group (``group``: "speedup" or "speedup_vs_second") of one
    state (``prefix``), kept only where the peer it was paired with is the one the report compares against."""
    ratio = pd.to_numeric(_column(out, f"{prefix}pair_{group}"), errors="coerce")
    peer = _column(out, f"{prefix}pair_{'peer' if group == 'speedup' else 'second'}")
    verdict = _column(out, f"{prefix}pair_verdict{group.removeprefix('speedup')}")
    same_peer = peer.isna() | (peer == out[peer_column])
    kept = ratio.notna() & same_peer
    return tuple(s.where(kept) for s in (ratio, pd.to_numeric(_column(out, f"{prefix}pair_{group}_lo"), errors="coerce"),
                                         pd.to_numeric(_column(out, f"{prefix}pair_{group}_hi"), errors="coerce"),
                                         verdict.astype(object)))


SPEEDUP_COLUMNS = [
    "point_set", "target", "dist", "shape", "family", "variant", "tile", "throughput", "baseline", "baseline_throughput",
    "speedup", "speedup_lo", "speedup_hi", "verdict", "speedup_method", "speedup_unpaired",
    "second_baseline", "second_baseline_throughput", "speedup_vs_second", "speedup_vs_second_lo", "speedup_vs_second_hi",
    "verdict_vs_second", "paired_tile", "pair_rounds", "pair_stop", "aa_ratio", "aa_halfwidth", "aa_verdict",
    "sm_clock_mhz_median", "throttled", "sustained_speedup", "sustained_speedup_lo", "sustained_speedup_hi",
    "sustained_verdict", "sustained_sm_clock_mhz_median", "sustained_throttled"]
# what a set timed before pairing has none of (the report leaves them out there)
PAIRED_ONLY = [c for c in SPEEDUP_COLUMNS[SPEEDUP_COLUMNS.index("speedup_lo"):]
               if c not in ("speedup_method", "second_baseline", "second_baseline_throughput", "speedup_vs_second")]


def speedups(best: pd.DataFrame, baseline_of: dict[str, str], second_of: dict[str, str] | None = None) -> pd.DataFrame:
    """Speedup of each variant's best tile over its matched peer (``baseline_of``: same accumulation
    semantics) of the same run (point set) and shape, and over its second baseline (``second_of``) beside it.

    Paired first: where the point was timed alternated with its peer in one process, the speedup is the
    median of per-round ratios with its 95 % interval and verdict (``speedup_method`` "paired"); else the
    ratio of best-tile throughputs timed in separate jobs ("unpaired (separate jobs)", no interval).
    ``speedup_unpaired`` keeps that throughput ratio beside a paired one. The A/A check, rounds, power state
    and the sustained state's ratio come with it where the point has them."""
    if best.empty:
        return pd.DataFrame(columns=SPEEDUP_COLUMNS)
    key = ["point_set", "target", "dist", "shape"]
    lib = best.groupby(key + ["variant"])["throughput"].max()
    out = best[best["variant"].isin(baseline_of)].copy()
    for col, of in (("baseline", baseline_of), ("second_baseline", second_of or {})):
        out[col] = out["variant"].map(of)
        idx = pd.MultiIndex.from_frame(out[key].assign(variant=out[col]))
        out[f"{col}_throughput"] = lib.reindex(idx).to_numpy()
    out["speedup_unpaired"] = out["throughput"] / out["baseline_throughput"]
    unpaired_vs_second = out["throughput"] / out["second_baseline_throughput"]
    for group, peer, unpaired in (("speedup", "baseline", out["speedup_unpaired"]),
                                  ("speedup_vs_second", "second_baseline", unpaired_vs_second)):
        ratio, lo, hi, verdict = _paired_ratio(out, "", group, peer)
        out[group] = ratio.fillna(unpaired)
        out[f"{group}_lo"], out[f"{group}_hi"] = lo, hi
        out["verdict" + group.removeprefix("speedup")] = verdict
        if group == "speedup":
            out["speedup_method"] = np.where(ratio.notna(), PAIRED, np.where(out["speedup"].notna(), UNPAIRED, None))
    ratio, lo, hi, verdict = _paired_ratio(out, "sustained_", "speedup", "baseline")
    out["sustained_speedup"], out["sustained_speedup_lo"], out["sustained_speedup_hi"] = ratio, lo, hi
    out["sustained_verdict"] = verdict
    for col, src in (("aa_ratio", "pair_aa_ratio"), ("aa_halfwidth", "pair_aa_halfwidth"), ("aa_verdict", "pair_aa_verdict"),
                     ("pair_rounds", "pair_rounds"), ("pair_stop", "pair_stop"), ("paired_tile", "paired_tile"),
                     ("sm_clock_mhz_median", "sm_clock_mhz_median"), ("throttled", "throttled"),
                     ("sustained_sm_clock_mhz_median", "sustained_sm_clock_mhz_median"),
                     ("sustained_throttled", "sustained_throttled")):
        out[col] = _column(out, src)
    return out[SPEEDUP_COLUMNS].reset_index(drop=True)


def verdict_counts(sp: pd.DataFrame) -> pd.DataFrame:
    """Per variant: at how many points it was faster than, the same as, or slower than its matched peer
    (paired ratios, by their interval), and how many ratios were unpaired (no verdict)."""
    counts = pd.crosstab([sp["family"], sp["variant"]], sp["verdict"]).reindex(columns=list(VERDICTS), fill_value=0)
    unpaired = sp[sp["speedup_method"] == UNPAIRED].groupby(["family", "variant"]).size().rename("unpaired")
    every = sp[["family", "variant"]].drop_duplicates().set_index(["family", "variant"])
    return (every.join(counts).join(unpaired).fillna(0).astype(int).reset_index()
            .sort_values(["family", "variant"]).reset_index(drop=True))


def aa_checks(sp: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The A/A check (each variant paired with itself, which must read "same"): per family, the worst A/A
    half-width and where it was, and every A/A that did not read "same"."""
    aa = sp[sp["aa_halfwidth"].notna() | sp["aa_verdict"].notna()]
    cols = ["family", "points", "worst_aa_halfwidth", "worst_at", "aa_not_same"]
    if aa.empty:
        return pd.DataFrame(columns=cols), aa[["family", "variant", "dist", "shape", "aa_ratio", "aa_halfwidth", "aa_verdict"]]
    rows = []
    for fam, g in aa.groupby("family"):
        hw = pd.to_numeric(g["aa_halfwidth"], errors="coerce")
        worst = g.loc[hw.idxmax()] if hw.notna().any() else None
        rows.append({"family": fam, "points": len(g), "worst_aa_halfwidth": hw.max(),
                     "worst_at": f"{worst['variant']} {worst['dist']} {worst['shape']}" if worst is not None else "",
                     "aa_not_same": int((g["aa_verdict"].notna() & (g["aa_verdict"] != "same")).sum())})
    off = aa[aa["aa_verdict"].notna() & (aa["aa_verdict"] != "same")]
    return (pd.DataFrame(rows, columns=cols),
            off[["family", "variant", "dist", "shape", "aa_ratio", "aa_halfwidth", "aa_verdict"]].reset_index(drop=True))


POWER_STATE_COLUMNS = ["family", "variant", "dist", "shape", "baseline", "speedup", "speedup_lo", "speedup_hi", "verdict",
                       "sm_clock_mhz_median", "throttled", "sustained_speedup", "sustained_speedup_lo",
                       "sustained_speedup_hi", "sustained_verdict", "sustained_sm_clock_mhz_median",
                       "sustained_throttled", "verdicts"]


def power_states(sp: pd.DataFrame) -> pd.DataFrame:
    """Points with both a cold (the burst right after the checks) and a sustained (after the card ran the
    pair back to back until its clock settled) paired ratio, side by side; ``verdicts`` says "differ"
    where the two states disagree."""
    both = sp[(sp["speedup_method"] == PAIRED) & sp["sustained_speedup"].notna()]
    both = both.assign(verdicts=np.where(both["verdict"] != both["sustained_verdict"], "differ", ""))
    return both[POWER_STATE_COLUMNS].reset_index(drop=True)


def what_ran(tidy: pd.DataFrame) -> dict:
    """What a result set actually ran, read from its rows: GPU names and targets of rows that ran on a
    GPU, how many were timed, and the status counts. The report's banner says exactly this."""
    on_gpu = tidy[tidy["target"] != "cpu"] if len(tidy) else tidy
    timed = on_gpu[on_gpu["throughput"].notna()] if len(on_gpu) else on_gpu
    return {
        "gpus": sorted(set(on_gpu["gpu_name"].dropna()) - {"none"}) if len(on_gpu) else [],
        "targets": sorted(set(on_gpu["target"])) if len(on_gpu) else [],
        "gpu_rows": len(on_gpu),
        "timed_rows": len(timed),
        "emulated_rows": int((tidy["target"] == "cpu").sum()) if len(tidy) else 0,
        "status": tidy["status"].value_counts().to_dict() if len(tidy) else {},
    }


# ---- result sets and the report's derived tables ------------------------------------------------


def load_set(directory: str | Path, label: str, physical: dict | None = None,
             bytes_of: dict[str, tuple[float, float, float]] | None = None) -> dict:
    """A result set, with a label saying where it comes from: the tidy table, compile matrix, limits and
    ceilings of one platform's run (its collect outputs), or of a published folder, read from its
    per-family points (``physical``, ``bytes_of``: as for ``tidy_runs``). ``damaged``: the files it could
    not read (DamagedFile each), which the report lists by name with their fix."""
    d = Path(directory)
    damaged: list[DamagedFile] = []
    if (d / "points").is_dir():
        tidy, ceilings, compiled, sets = point_sets(d / "points", physical, bytes_of or {}, damaged=damaged)
        cm = compile_matrix(compiled, damaged)
        limits = roofs(tidy, ceilings, physical)
        env = {}
    else:
        ceilings_file = d / "ceilings.json"
        try:
            probes = read_json(ceilings_file, CEILINGS) if ceilings_file.exists() else {}
        except DamagedFile as e:
            note(damaged, e)
            probes = {}
        env, ceilings = probes.get("env", {}), probes.get("ceilings", {})
        tidy = pd.read_parquet(d / "tidy.parquet")
        cm = pd.read_csv(d / "compile_matrix.csv", dtype={"reason": str})
        limits = (pd.read_csv(d / "roofs.csv") if (d / "roofs.csv").exists()
                  else pd.DataFrame(columns=["kind", "precision", "value"]))
        sets = pd.DataFrame()
    return {
        "point_sets": sets,
        "roofs": limits,
        "label": label,
        "tidy": tidy,
        "compile": cm.fillna({"reason": ""}),
        "ceilings": ceilings,
        "env": env or (tidy.iloc[0][["gpu_name", "driver", "cuda", "torch", "tilelang", "git_commit"]].to_dict()
                       if len(tidy) else {}),
        "timed": bool(len(tidy) and tidy["throughput"].notna().any()),
        "damaged": damaged,
    }


def panels(best: pd.DataFrame, peers_of: dict[str, list[str]], family_of: dict[str, str]) -> pd.DataFrame:
    """Rows grouped into one panel per family, each library baseline repeated in every family that
    compares against it, so a variant is always drawn beside its peers (from that family's own run
    where a published folder holds one run per family)."""
    fam = best["variant"].map(family_of)
    own_run = best["point_set"]

    def of_run(rows: pd.Series, family: str) -> pd.Series:
        return rows & own_run.isin([ONE_RUN, family])

    parts = [best[fam != "baseline"].assign(panel=fam[fam != "baseline"])]
    for variant, bases in peers_of.items():
        for base in bases:
            if family_of.get(base) != family_of[variant]:
                parts.append(best[of_run(best["variant"] == base, family_of[variant])].assign(panel=family_of[variant]))
    # precision-independent baselines (the unquantized bf16 GEMM) are drawn in every family
    for f in set(fam) - {"baseline"}:
        parts.append(best[of_run(fam == "baseline", f)].assign(panel=f))
    out = pd.concat(parts, ignore_index=True)
    shapes_of = out[out["variant"].map(family_of) != "baseline"].groupby("panel")["shape"].agg(set)
    out = out[[s in shapes_of.get(p, set()) for p, s in zip(out["panel"], out["shape"], strict=True)]]
    return out.drop_duplicates(subset=["panel", "point_set", "variant", "dist", "shape", "tile"])


def accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """Worst error per variant x distribution (over shapes and tiles), with tolerances and failures."""
    agg = df.groupby(["family", "variant", "dist"]).agg(
        rows=("status", "size"),
        failed=("status", lambda s: int((s == "failed").sum())),
        total_rel_fro=("total_rel_fro", "max"), tol_total_rel_fro=("tol_total_rel_fro", "first"),
        kernel_rel_fro=("kernel_rel_fro", "max"), tol_kernel_rel_fro=("tol_kernel_rel_fro", "first"),
        total_calc_diff=("total_calc_diff", "max"), kernel_calc_diff=("kernel_calc_diff", "max"),
    ).reset_index()
    return agg


def compare_sets(primary: pd.DataFrame, reference: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Side by side on (variant, dist, shape): best-tile throughput where both timed it, worst kernel
    error everywhere; a change worse than ``threshold`` (relative) is flagged as a regression."""
    def summary(df: pd.DataFrame) -> pd.DataFrame:
        key = ["variant", "dist", "shape"]
        err = df.groupby(key).agg(kernel_rel_fro=("kernel_rel_fro", "max"), total_rel_fro=("total_rel_fro", "max"))
        bt = best_tiles(df)
        # a published folder may hold a shared baseline once per family run: the faster counts here
        err["throughput"] = bt.groupby(key)["throughput"].max() if len(bt) else np.nan
        return err

    a, b = summary(primary), summary(reference)
    both = a.merge(b, left_index=True, right_index=True, suffixes=("_this", "_ref")).reset_index()
    both["throughput_ratio"] = both["throughput_this"] / both["throughput_ref"]
    # kernel error may move a little with rounding; it regresses when it grows past the threshold
    # and past a floor of 1e-6 (bit-exact integer GEMMs sit at ~1e-16)
    grow = both["kernel_rel_fro_this"] > np.maximum(both["kernel_rel_fro_ref"] * (1 + threshold), 1e-6)
    slow = both["throughput_ratio"] < 1 - threshold
    both["regression"] = np.where(slow, "slower", np.where(grow, "less accurate", ""))
    return both


PROFILE_METRICS = ("sm_throughput_pct", "tensor_pipe_pct", "dram_throughput_pct", "l2_throughput_pct", "l1_throughput_pct",
                   "achieved_occupancy_pct", "theoretical_occupancy_pct", "l2_hit_rate_pct", "registers_per_thread",
                   "sm_clock_mhz")
PROFILE_COLUMNS = ["entry", "dist", "shape", "tile", "target", "limiter", "duration_us", *PROFILE_METRICS, "dram_MB",
                   "counted_MB", "dram_over_counted", "top_stalls", "kernels", "ncu", "git_commit", "date", "file"]


def profile_summary_files(folder: str | Path) -> list[Path]:
    """The profile summaries under ``folder``/profile: a platform's ``<tile>.summary.json``, a published
    folder's ``<tile>/summary.json``."""
    return sorted(Path(folder).glob("profile/**/*summary.json"))


def profile_table(folder: str | Path, damaged: list | None = None) -> pd.DataFrame:
    """One row per profile summary under ``folder``/profile (harness/profile.py): the point, its main
    kernel's SOL figures and limiter, DRAM bytes against the counted bytes, the top stalls. A damaged
    summary is a row saying so (and noted in ``damaged``)."""
    rows = []
    for f in profile_summary_files(folder):
        try:
            d = read_json(f, PROFILE_SUMMARY)
            main = next((k for k in d["kernels"] if k["name"] == d["main_kernel"]), None)
            if main is None:
                raise DamagedFile(f, f"wrong shape: main_kernel {d['main_kernel']!r} is none of its 'kernels'")
        except DamagedFile as e:
            note(damaged, e)
            rows.append({"file": str(f), "limiter": f"unreadable: {e}"})
            continue
        rows.append({**{k: d["point"][k] for k in ("entry", "dist", "shape", "tile", "target")},
                     "limiter": d["limiter"], "duration_us": d["duration_us"],
                     **{k: main.get(k) for k in PROFILE_METRICS},
                     "dram_MB": (d["dram_read_bytes"] + d["dram_write_bytes"]) / 1e6,
                     "counted_MB": d["counted_bytes"] / 1e6 if d.get("counted_bytes") else None,
                     "dram_over_counted": d.get("dram_over_counted"),
                     "top_stalls": ", ".join(f"{s['reason']} {s['cycles_per_issue']:.2f}" for s in main["top_stalls"]),
                     "kernels": ", ".join(d["kernel_names"]), "ncu": d.get("profile", {}).get("ncu"),
                     "git_commit": d.get("env", {}).get("git_commit"), "date": d.get("env", {}).get("date"),
                     "file": str(f)})
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


# the model's pick counts as good when it is within this of the tuned best (issue 32's criterion)
REGRET_LIMIT = 1.05


def tuning_records(folder: str | Path) -> list[Path]:
    """The tune records of a result folder: a published one's table (tuning/<family>/<entry>/<shape>.json)
    or a run's (tuning/<entry>/<shape>.json)."""
    root = Path(folder) / "tuning"
    return sorted({*root.glob("*/*/*.json"), *root.glob("*/*.json")})


def tuning_table(folder: str | Path, zoo_shapes=(), damaged: list | None = None) -> pd.DataFrame:
    """One row per tune record: the model's first pick and its time, the tuned winner and its time, the
    regret (pick over winner), how many candidates passed, and whether the shape is in the zoo."""
    rows = []
    for f in tuning_records(folder):
        try:
            rec = read_json(f, TUNE)
        except DamagedFile as e:
            note(damaged, e)
            continue
        by_tile = {c["tile"]: c for c in rec["candidates"]}
        pick, win = by_tile.get(rec.get("model_pick") or ""), by_tile.get(rec.get("winner") or "")
        rows.append({"variant": rec["key"]["variant"], "shape": rec["key"]["shape"],
                     "shape_set": "zoo" if rec["key"]["shape"] in set(zoo_shapes) else "sweep",
                     "model_pick": rec.get("model_pick"), "pick_us": _us(pick), "tuned_best": rec.get("winner"),
                     "best_us": _us(win), "regret": rec.get("regret"),
                     "passed": sum(c.get("status") == "ok" for c in rec["candidates"]), "candidates": len(rec["candidates"]),
                     "failed_tiles": "; ".join(f"{c['tile']}: {c.get('reason', '')[:80]}" for c in rec["candidates"]
                                               if c.get("status") not in ("ok", None)), "record": str(f)})
    return pd.DataFrame(rows)


def _us(candidate: dict | None) -> float:
    t = (candidate or {}).get("time_ms_median")
    return t * 1e3 if t else np.nan


def regret_summary(tuning: pd.DataFrame, family_of: dict[str, str]) -> pd.DataFrame:
    """Per family and shape set: shapes tuned, and how many of them the model's first pick was within
    ``REGRET_LIMIT`` of the tuned best (a pick that failed its checks counts as not within)."""
    if tuning.empty:
        return pd.DataFrame(columns=["family", "shape_set", "shapes", "pick_within_5pct", "share"])
    t = tuning.assign(family=tuning["variant"].map(family_of),
                      good=tuning["regret"].fillna(np.inf) <= REGRET_LIMIT)
    out = t.groupby(["family", "shape_set"]).agg(shapes=("good", "size"), pick_within_5pct=("good", "sum")).reset_index()
    out["share"] = out["pick_within_5pct"] / out["shapes"]
    return out


def shape_set_gates(sp: pd.DataFrame, shape_set_of: pd.Series, floor: float = 0.90) -> pd.DataFrame:
    """Per variant, the sweep's and the zoo's geometric mean speedup over the matched peer, the zoo's worst
    ratio and its shapes below ``floor`` (``shape_set_of``: shape -> "sweep" or "zoo")."""
    s = sp.assign(shape_set=sp["shape"].map(shape_set_of).fillna("sweep"))
    s = s[s["speedup"].notna()]
    geo = lambda x: float(np.exp(np.log(x).mean())) if len(x) else np.nan  # noqa: E731
    rows = []
    for (variant, dist), g in s.groupby(["variant", "dist"]):
        sweep, zoo = g[g["shape_set"] == "sweep"]["speedup"], g[g["shape_set"] == "zoo"]
        if zoo.empty:
            continue
        rows.append({"variant": variant, "dist": dist, "sweep_geomean": geo(sweep), "zoo_geomean": geo(zoo["speedup"]),
                     "zoo_shapes": len(zoo), "zoo_worst": zoo["speedup"].min(),
                     f"zoo_below_{floor:.2f}": ", ".join(f"{r.shape} ({r.speedup:.3f})" for r in zoo[zoo["speedup"] < floor].itertuples())})
    return pd.DataFrame(rows)
