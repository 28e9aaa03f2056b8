"""Tidy tables from run records (pure pandas, no Snakemake): used by collect.py and report.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

# the columns that identify a measurement; everything else is a metric or a tag
KEYS = ["platform", "target", "family", "variant", "dist", "shape", "M", "N", "K", "tile"]


def tidy_runs(run_files: list[str], ceilings_file: str | None = None) -> pd.DataFrame:
    """One row per platform x target x variant x distribution x shape x tile, metrics and env tags."""
    records = []
    for f in run_files:
        d = json.loads(Path(f).read_text())
        for row in d["rows"]:
            tol = {f"tol_{k}": v for k, v in d.get("tolerance", {}).items()}
            point = {k: v for k, v in d["point"].items() if k != "input_sha256"}
            records.append(point | d["env"] | tol | row | {"input_sha256": json.dumps(d["point"]["input_sha256"])})
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return df
    for col in ("throughput", "time_ms_median", "time_ms_p20", "time_ms_p80"):
        if col not in df:
            df[col] = np.nan
    df["ceiling_value"] = np.nan
    if ceilings_file:
        ceilings = json.loads(Path(ceilings_file).read_text())["ceilings"]
        df["ceiling_value"] = df["ceiling"].map({k: v["value"] for k, v in ceilings.items()})
    df["pct_of_ceiling"] = 100 * df["throughput"] / df["ceiling_value"]
    front = [c for c in KEYS + ["status", "reason", "throughput", "ops_unit", "time_ms_median", "time_ms_p20",
                                "time_ms_p80", "pct_of_ceiling"] if c in df]
    return df[front + [c for c in df.columns if c not in front]].sort_values(KEYS).reset_index(drop=True)


def compile_matrix(compile_files: list[str]) -> pd.DataFrame:
    """One row per target x variant x tile x shape: status, reason, instructions, registers, shared memory."""
    rows = []
    for f in compile_files:
        d = json.loads(Path(f).read_text())
        for r in d["records"]:
            r = dict(r)
            r["instructions"] = ",".join(r.get("instructions") or [])
            rows.append(r)
    cols = ["target", "variant", "tile", "shape", "status", "reason", "instructions", "compile_s", "registers",
            "spill_store_bytes", "smem_static_bytes", "smem_dynamic_bytes"]
    df = pd.DataFrame.from_records(rows)
    if df.empty:
        return pd.DataFrame(columns=cols)
    return df[[c for c in cols if c in df]].sort_values(["variant", "target", "tile", "shape"]).reset_index(drop=True)


def compile_summary(cm: pd.DataFrame) -> pd.DataFrame:
    """variant x target: ok / unsupported / failed (worst over tiles and shapes) with the first reason."""
    order = {"ok": 0, "unsupported": 1, "failed": 2}

    def agg(g: pd.DataFrame) -> pd.Series:
        worst = max(g["status"], key=lambda s: order.get(s, 3))
        reason = next((r for r in g["reason"] if r), "")
        regs = g["registers"].max() if "registers" in g else np.nan
        return pd.Series({"status": worst, "kernels": len(g), "ok": int((g["status"] == "ok").sum()),
                          "instructions": ",".join(sorted({i for s in g["instructions"].fillna("") for i in s.split(",") if i})),
                          "max_registers": regs, "reason": reason})

    return cm.groupby(["variant", "target"]).apply(agg, include_groups=False).reset_index()


def best_tiles(df: pd.DataFrame) -> pd.DataFrame:
    """Per (target, variant, dist, shape): the fastest tile among rows within tolerance."""
    ok = df[(df["status"] == "ok") & df["throughput"].notna()]
    if ok.empty:
        return ok
    idx = ok.groupby(["target", "variant", "dist", "shape"])["throughput"].idxmax()
    return ok.loc[idx].reset_index(drop=True)


def speedups(best: pd.DataFrame, baseline_of: dict[str, str]) -> pd.DataFrame:
    """Speedup of each variant's best tile over its library baseline of the same run and shape."""
    if best.empty:
        return pd.DataFrame()
    key = ["target", "dist", "shape"]
    base = best[key + ["variant", "throughput"]].rename(columns={"variant": "baseline", "throughput": "baseline_throughput"})
    out = best[best["variant"].isin(baseline_of)].copy()
    out["baseline"] = out["variant"].map(baseline_of)
    out = out.merge(base, on=key + ["baseline"], how="left")
    out["speedup"] = out["throughput"] / out["baseline_throughput"]
    return out[key + ["variant", "tile", "throughput", "baseline", "baseline_throughput", "speedup"]]
