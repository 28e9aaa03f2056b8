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


# ---- result sets and the report's derived tables ------------------------------------------------


def load_set(directory: str | Path, label: str) -> dict:
    """A result set: the tidy table, compile matrix and ceilings of one run (a platform folder or a
    published copy), with a label saying where it comes from."""
    d = Path(directory)
    ceilings = d / "ceilings.json"
    env = json.loads(ceilings.read_text())["env"] if ceilings.exists() else {}
    tidy = pd.read_parquet(d / "tidy.parquet")
    cm = pd.read_csv(d / "compile_matrix.csv", dtype={"reason": str}).fillna({"reason": ""})
    return {
        "label": label,
        "tidy": tidy,
        "compile": cm,
        "ceilings": json.loads(ceilings.read_text())["ceilings"] if ceilings.exists() else {},
        "env": env or (tidy.iloc[0][["gpu_name", "driver", "cuda", "torch", "tilelang", "git_commit"]].to_dict()
                       if len(tidy) else {}),
        "timed": bool(len(tidy) and tidy["throughput"].notna().any()),
    }


def panels(best: pd.DataFrame, baseline_of: dict[str, str], family_of: dict[str, str]) -> pd.DataFrame:
    """Rows grouped into one panel per family, each library baseline repeated in every family that
    compares against it, so a variant is always drawn beside its baseline."""
    fam = best["variant"].map(family_of)
    parts = [best[fam != "baseline"].assign(panel=fam[fam != "baseline"])]
    for variant, base in baseline_of.items():
        if family_of.get(base) != family_of[variant]:
            parts.append(best[best["variant"] == base].assign(panel=family_of[variant]))
    # precision-independent baselines (the unquantized bf16 GEMM) are drawn in every family
    for f in set(fam) - {"baseline"}:
        parts.append(best[fam == "baseline"].assign(panel=f))
    out = pd.concat(parts, ignore_index=True)
    shapes_of = out[out["variant"].map(family_of) != "baseline"].groupby("panel")["shape"].agg(set)
    out = out[[s in shapes_of.get(p, set()) for p, s in zip(out["panel"], out["shape"], strict=True)]]
    return out.drop_duplicates(subset=["panel", "variant", "dist", "shape", "tile"])


def roofline_points(best: pd.DataFrame, bytes_per_element: dict[str, tuple[float, float, float]]) -> pd.DataFrame:
    """Arithmetic intensity = 2MNK / (bytes of A + B (with their scales) + C) for each timed row."""
    pts = best[best["throughput"].notna()].copy()
    if pts.empty:
        return pts.assign(intensity=[])
    per = pts["variant"].map(bytes_per_element)
    a = per.map(lambda t: t[0])
    b = per.map(lambda t: t[1])
    c = per.map(lambda t: t[2])
    traffic = pts["M"] * pts["K"] * a + pts["N"] * pts["K"] * b + pts["M"] * pts["N"] * c
    pts["intensity"] = 2.0 * pts["M"] * pts["N"] * pts["K"] / traffic
    pts["bandwidth_TBps"] = traffic / (pts["time_ms_median"] * 1e-3) / 1e12
    return pts


def accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """Worst error per variant x distribution (over shapes and tiles), with tolerances and failures."""
    agg = df.groupby(["family", "variant", "dist"]).agg(
        rows=("status", "size"),
        failed=("status", lambda s: int(s.isin(["failed", "error"]).sum())),
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
        err["throughput"] = bt.set_index(key)["throughput"] if len(bt) else np.nan
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
