"""The report's seaborn figures; each function returns a matplotlib Figure (or None: nothing to draw)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook")
STATUS_CODE = {"ok": 0, "unsupported": 1, "failed": 2}
STATUS_COLORS = ["#4c9f70", "#b8b8b8", "#d1495b"]


def message(text: str) -> plt.Figure:
    """A figure that says why there is nothing to draw (the report never silently drops one)."""
    fig, ax = plt.subplots(figsize=(8, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, wrap=True)
    return fig


def _shape_key(shape: str) -> tuple[int, ...]:
    return tuple(int(x) for x in shape.split("x"))


def throughput(panel_rows: pd.DataFrame, title: str) -> plt.Figure:
    """TFLOP/s (TOPS) per shape, one panel per family, baselines beside the variants (log scale)."""
    if panel_rows.empty:
        return message(f"{title}: no timed rows (no GPU run in this result set)")
    fams = sorted(panel_rows["panel"].unique())
    fig, axes = plt.subplots(len(fams), 1, figsize=(15, 3.9 * len(fams)), squeeze=False)
    for ax, fam in zip(axes[:, 0], fams, strict=True):
        sub = panel_rows[panel_rows["panel"] == fam]
        order = sorted(sub["shape"].unique(), key=_shape_key)
        sns.barplot(data=sub, x="shape", y="throughput", hue="variant", order=order, ax=ax, errorbar=None,
                    palette="tab10" if sub["variant"].nunique() <= 10 else "tab20")
        ax.set_yscale("log")
        ax.set_title(fam)
        ax.set_xlabel("")
        ax.set_ylabel("TFLOP/s (TOPS for int)")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle(title, y=1.0)
    fig.tight_layout()
    return fig


# how a paired ratio's verdict is marked above its bar (and in the heat map): its interval against parity
VERDICT_MARKS = {"faster": ("^", "#2a7f3f", "▲"), "same": ("o", "#777777", "="), "slower": ("v", "#c0392b", "▼")}


def _is_paired(sp: pd.DataFrame) -> pd.Series:
    return sp["speedup_method"].eq("paired") if "speedup_method" in sp else pd.Series(False, index=sp.index)


def headline_speedup(sp: pd.DataFrame, title: str) -> plt.Figure:
    """Per family, each TileLang variant's speedup over its matched peer per shape; 1.0 = parity. A paired
    ratio carries its 95 % interval (error bar) and its verdict (a mark above the bar: faster, same, slower);
    an unpaired one (timed in separate jobs) has neither, and is hatched where paired ones are beside it."""
    if sp.empty or sp["speedup"].notna().sum() == 0:
        return message(f"{title}: no speedups (no variant and its matched peer both timed in this set)")
    data = sp.dropna(subset=["speedup"])
    paired = _is_paired(data)
    fams = sorted(data["family"].unique())
    fig, axes = plt.subplots(1, len(fams), figsize=(4.6 * len(fams) + 1.5, 4.4), squeeze=False)
    for ax, fam in zip(axes[0], fams, strict=True):
        sub = data[data["family"] == fam]
        order = sorted(sub["shape"].unique(), key=_shape_key)
        names = sorted(sub["variant"].unique())
        colors = sns.color_palette("tab10", len(names))
        width = 0.8 / len(names)
        for i, (name, color) in enumerate(zip(names, colors, strict=True)):
            rows = sub[sub["variant"] == name].drop_duplicates("shape").set_index("shape").reindex(order)
            x = np.arange(len(order)) - 0.4 + width * (i + 0.5)
            is_paired = _is_paired(rows).to_numpy()
            hatch = [None if p or not paired.any() else "//" for p in is_paired]
            bars = ax.bar(x, rows["speedup"], width, color=color, edgecolor="white", lw=0.5)
            for bar, h in zip(bars, hatch, strict=True):
                bar.set_hatch(h)
            if not is_paired.any():
                continue
            lo = rows.get("speedup_lo", pd.Series(np.nan, index=rows.index)).to_numpy(float)
            hi = rows.get("speedup_hi", pd.Series(np.nan, index=rows.index)).to_numpy(float)
            mid = rows["speedup"].to_numpy(float)
            bounded = is_paired & np.isfinite(lo) & np.isfinite(hi)
            ax.errorbar(x[bounded], mid[bounded], yerr=[mid[bounded] - lo[bounded], hi[bounded] - mid[bounded]],
                        fmt="none", ecolor="#222", elinewidth=0.9, capsize=1.5)
            top = np.where(bounded, hi, mid)
            for verdict, (marker, mark_color, _) in VERDICT_MARKS.items():
                hit = is_paired & (rows["verdict"] == verdict).to_numpy()
                ax.scatter(x[hit], top[hit] * 1.03, marker=marker, s=14, color=mark_color, zorder=5)
        ax.axhline(1.0, color="#222", lw=1.4, ls="--")
        ax.set_xticks(np.arange(len(order)), order)
        ax.set_title(f"{fam}\nvs {', '.join(sorted(sub['baseline'].unique()))}", fontsize=10)
        ax.set_ylabel("speedup over matched peer" if ax is axes[0][0] else "")
        ax.tick_params(axis="x", rotation=60, labelsize=7)
        # one plain patch per variant (its first bar may be hatched), then the verdict marks
        handles = [Patch(facecolor=c) for c in colors]
        labels = list(names)
        if paired[sub.index].any():
            handles += [plt.Line2D([], [], ls="", marker=m, color=c) for m, c, _ in VERDICT_MARKS.values()]
            labels += [f"{v} (95 % interval vs 1)" for v in VERDICT_MARKS]
        ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.42), frameon=False, ncol=1)
    how = ("paired (alternated in one process): bars with 95 % intervals, mark = verdict"
           + ("; hatched: unpaired (separate jobs)" if not paired.all() else "") if paired.any()
           else "unpaired ratios of best-tile throughputs timed in separate jobs (no interval)")
    fig.suptitle(f"{title}\n{how}", y=1.09)
    return fig


def speedup(sp: pd.DataFrame, title: str) -> plt.Figure:
    """Heat map of the speedup over the matched peer per variant and shape; a paired ratio's cell also
    carries its verdict (▲ faster, = same, ▼ slower)."""
    if sp.empty:
        return message(f"{title}: no speedups (no variant and its baseline both timed)")
    data = sp.dropna(subset=["speedup"]).sort_values("speedup", ascending=False).drop_duplicates(["variant", "shape"])
    if data.empty:
        return message(f"{title}: no speedups (no variant and its baseline both timed)")
    marks = {v: m for v, (_, _, m) in VERDICT_MARKS.items()}
    verdict = data["verdict"] if "verdict" in data else pd.Series(np.nan, index=data.index)
    data = data.assign(label=[f"{s:.2f}" + (f" {marks[v]}" if p and v in marks else "")
                              for s, v, p in zip(data["speedup"], verdict, _is_paired(data), strict=True)])
    grid = data.pivot(index="variant", columns="shape", values="speedup")
    grid = grid[sorted(grid.columns, key=_shape_key)]
    labels = data.pivot(index="variant", columns="shape", values="label").reindex_like(grid).fillna("")
    fig, ax = plt.subplots(figsize=(min(2 + 0.9 * grid.shape[1], 18), 1.2 + 0.42 * grid.shape[0]))
    sns.heatmap(grid, annot=labels, fmt="", center=1.0, cmap="RdBu", vmin=0, vmax=2, ax=ax,
                cbar_kws={"label": "speedup over matched peer"}, linewidths=0.5, annot_kws={"fontsize": 8})
    ax.grid(False)
    how = ("paired ratios marked ▲ faster, = same, ▼ slower (95 % interval vs 1)" if _is_paired(data).any()
           else "unpaired ratios (separate jobs)")
    ax.set_title(f"{title}\n{how}")
    ax.set_xlabel("")
    ax.set_ylabel("")
    return fig


def roofline(points: pd.DataFrame, roofs: pd.DataFrame, title: str) -> plt.Figure:
    """Timed points against the physical roofs (datasheet peak per precision, HBM bandwidth; solid)
    and the measured best of the same run (best kernel or library probe per precision, copy
    bandwidth; dashed)."""
    if points.empty or roofs.empty:
        return message(f"{title}: no timed rows or no limits for this set")
    fig, ax = plt.subplots(figsize=(11, 6.5))
    sns.scatterplot(data=points, x="intensity", y="throughput", hue="family", style="family", s=55, ax=ax)
    x = np.logspace(np.log10(points["intensity"].min() / 2), np.log10(points["intensity"].max() * 2), 200)
    precisions = sorted(set(roofs["precision"]) - {"memory"})
    colors = dict(zip(precisions, sns.color_palette("dark", len(precisions)), strict=True))
    for kind, ls in (("physical", "-"), ("measured", "--")):
        lim = roofs[roofs["kind"] == kind].set_index("precision")
        bw = lim["value"].get("memory")
        for prec in precisions:
            if prec not in lim.index:
                continue
            peak = lim.loc[prec, "value"]
            y = np.minimum(peak, bw * x) if bw else np.full_like(x, peak)
            # equal peaks (fp8 and int8 on Hopper) would hide each other's labels: the legend names each line
            ax.plot(x, y, color=colors[prec], lw=1.4, ls=ls, label=f"{prec} {kind}: {peak:.0f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xlabel("arithmetic intensity (FLOP per byte the kernel must move: A, B with scales, C)")
    ax.set_ylabel("TFLOP/s (TOPS)")
    phys = roofs[(roofs["kind"] == "physical") & (roofs["precision"] == "memory")]["value"]
    meas = roofs[(roofs["kind"] == "measured") & (roofs["precision"] == "memory")]["value"]
    ax.set_title(title + "\nsolid: physical (datasheet" + (f", HBM {phys.iloc[0]:.2f} TB/s" if len(phys) else "")
                 + "); dashed: measured best of this run" + (f" (copy {meas.iloc[0]:.2f} TB/s)" if len(meas) else ""))
    return fig


def weight_bandwidth(rows: pd.DataFrame, roofs: pd.DataFrame, title: str) -> plt.Figure:
    """Bytes of the weight (with its scales) per second, per shape and variant of the W4A16 family and
    its peers, against the HBM bandwidth (datasheet, solid) and the measured copy bandwidth (dashed):
    at decode sizes the weight stream is the whole cost, so the distance to the line is what is left."""
    if rows.empty:
        return message(f"{title}: no timed W4A16 rows in this set")
    order = sorted(rows["shape"].unique(), key=_shape_key)
    fig, ax = plt.subplots(figsize=(15, 4.8))
    sns.barplot(data=rows, x="shape", y="weight_TBps", hue="variant", order=order, ax=ax, errorbar=None,
                palette="tab10")
    for kind, ls in (("physical", "-"), ("measured", "--")):
        lim = roofs[(roofs["kind"] == kind) & (roofs["precision"] == "memory")]
        if len(lim):
            ax.axhline(lim["value"].iloc[0], color="#222", lw=1.4, ls=ls,
                       label=f"{'HBM (datasheet)' if kind == 'physical' else 'copy (measured)'}: {lim['value'].iloc[0]:.2f} TB/s")
    ax.set_xlabel("")
    ax.set_ylabel("weight TB/s (packed codes + scales)")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(title)
    return fig


def accuracy(acc: pd.DataFrame, title: str) -> plt.Figure:
    """Total vs kernel error per variant and distribution; tolerance ticks; failures marked."""
    long = acc.melt(id_vars=["variant", "dist", "failed"], value_vars=["total_rel_fro", "kernel_rel_fro"],
                    var_name="error", value_name="rel_fro")
    long["rel_fro"] = long["rel_fro"].clip(lower=1e-17)  # exact integer GEMMs: keep them on a log axis
    order = sorted(acc["variant"].unique())
    g = sns.catplot(data=long, x="variant", y="rel_fro", hue="error", col="dist", col_wrap=1, kind="bar", order=order,
                    height=3.8, aspect=3.4, errorbar=None, palette=["#8da0cb", "#fc8d62"])
    g.set(yscale="log")
    for ax, (dist, sub) in zip(g.axes.flat, acc.groupby("dist"), strict=True):
        # one row per variant (a damaged point's row can carry another family label for the same variant)
        sub = sub.groupby("variant").agg(tol_total_rel_fro=("tol_total_rel_fro", "max"),
                                         tol_kernel_rel_fro=("tol_kernel_rel_fro", "max"),
                                         failed=("failed", "sum")).reindex(order)
        xs = np.arange(len(order))
        ax.scatter(xs - 0.2, sub["tol_total_rel_fro"], marker="_", s=300, color="#333", zorder=5,
                   label="tolerance")
        ax.scatter(xs + 0.2, sub["tol_kernel_rel_fro"], marker="_", s=300, color="#333", zorder=5)
        for x, failed in zip(xs, sub["failed"].fillna(0), strict=True):
            if failed:
                ax.annotate("FAILED", (x, ax.get_ylim()[1]), ha="center", va="top", color="#d1495b", fontsize=8)
        ax.tick_params(axis="x", rotation=60, labelsize=8)
        ax.set_title(f"dist = {dist} (— tolerance)")
    g.set_axis_labels("", "relative Frobenius error (worst over shapes)")
    g.figure.suptitle(title, y=1.02)
    return g.figure


def compile_matrix(summary: pd.DataFrame, title: str) -> plt.Figure:
    if summary.empty:
        return message(f"{title}: nothing was compiled")
    codes = summary.pivot(index="variant", columns="target", values="status").replace(STATUS_CODE)
    regs = summary.pivot(index="variant", columns="target", values="max_registers")
    sass = summary.pivot(index="variant", columns="target", values="sass") if "sass" in summary else None
    labels = summary.pivot(index="variant", columns="target", values="status").copy()
    for idx in labels.index:
        for col in labels.columns:
            r = regs.loc[idx, col]
            ops = sass.loc[idx, col] if sass is not None else None
            # status, then the SASS tensor-core instruction(s) ptxas emitted, then registers
            labels.loc[idx, col] = (f"{labels.loc[idx, col]}" + (f"\n{ops}" if isinstance(ops, str) and ops else "")
                                    + (f"\n{int(r)} regs" if pd.notna(r) else ""))
    fig, ax = plt.subplots(figsize=(2.5 + 2.8 * codes.shape[1], 0.9 + 0.75 * codes.shape[0]))
    sns.heatmap(codes.astype(float), annot=labels, fmt="", cmap=ListedColormap(STATUS_COLORS), vmin=-0.5, vmax=2.5,
                cbar=False, linewidths=1, linecolor="white", ax=ax, annot_kws={"fontsize": 8})
    ax.grid(False)
    ax.set_title(title)
    ax.set_xlabel("")
    ax.set_ylabel("")
    return fig


def comparison(cmp: pd.DataFrame, this: str, ref: str, threshold: float) -> plt.Figure:
    """This set against a reference: throughput where both were timed, else kernel error."""
    if cmp.empty:
        return message(f"{this} vs {ref}: no (variant, distribution, shape) in common")
    timed = cmp.dropna(subset=["throughput_this", "throughput_ref"])
    metric = "throughput" if len(timed) else "kernel_rel_fro"
    data = timed if len(timed) else cmp.dropna(subset=["kernel_rel_fro_this", "kernel_rel_fro_ref"])
    data = data.assign(flag=np.where(data["regression"] != "", "regression", "within threshold"))
    fig, ax = plt.subplots(figsize=(7, 6))
    sns.scatterplot(data=data, x=f"{metric}_ref", y=f"{metric}_this", hue="flag", style="flag", s=45, ax=ax,
                    palette={"regression": "#d1495b", "within threshold": "#4c72b0"})
    lo = np.nanmin(data[[f"{metric}_ref", f"{metric}_this"]].to_numpy())
    hi = np.nanmax(data[[f"{metric}_ref", f"{metric}_this"]].to_numpy())
    line = np.array([lo, hi])
    ax.plot(line, line, color="#555", lw=1)
    ax.plot(line, line * (1 - threshold), color="#999", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{metric} — {ref}")
    ax.set_ylabel(f"{metric} — {this}")
    ax.set_title(f"{this} vs {ref} ({metric}; dotted: {threshold:.0%} regression threshold)")
    return fig
