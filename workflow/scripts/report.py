# Render the comparison report (Markdown + seaborn figures) from the tidy table.
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import setup  # noqa: E402

setup(snakemake)
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from tables import best_tiles, compile_summary, speedups  # noqa: E402

from kernels.registry import VARIANTS, load_all  # noqa: E402

load_all()
df = pd.read_parquet(snakemake.input.tidy)
cm = pd.read_csv(snakemake.input.compile_matrix)
cm["reason"] = cm["reason"].fillna("")
platform = snakemake.params.platform
on_gpu = platform != "cpu"
fig_dir = Path(snakemake.output.figures)
fig_dir.mkdir(parents=True, exist_ok=True)
env = df.iloc[0] if len(df) else pd.Series(dtype=object)


def md(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    return frame.to_markdown(index=False, floatfmt=floatfmt) if len(frame) else "_(none)_"


out = [f"# lpgemm report: {platform}", ""]
out += ["## Environment", "", md(pd.DataFrame([{k: env.get(k) for k in (
    "gpu_name", "driver", "cuda", "torch", "tilelang", "git_commit", "sm_clock_mhz")}])), ""]
if not on_gpu:
    out += ["**Not run on this host: no CUDA GPU was detected.** No kernel was executed or timed and no",
            "library baseline (cuBLAS) was called. The numbers below are CPU emulations of each variant's",
            "arithmetic (quantize, exact low-precision products, fp32 accumulation, the kernel's output",
            "rounding), tile `emulated`. Every TileLang kernel was still cross-compiled for "
            + ", ".join(sorted(cm["target"].unique())) + " (compile matrix below).", ""]

best = best_tiles(df) if on_gpu else pd.DataFrame()
if on_gpu:
    if snakemake.input.ceilings:
        ceil = json.loads(Path(snakemake.input.ceilings[0]).read_text())["ceilings"]
        out += ["## Ceilings measured in this run", "",
                md(pd.DataFrame([{"ceiling": k, **v} for k, v in ceil.items()])), ""]
    out += ["## Throughput (fastest tile within tolerance, median of the repetitions)", ""]
    t = best.assign(p20_p80_ms=best["time_ms_p20"].map("{:.4g}".format) + "–" + best["time_ms_p80"].map("{:.4g}".format))
    out += [md(t[["dist", "shape", "variant", "tile", "throughput", "ops_unit", "time_ms_median", "p20_p80_ms",
                  "pct_of_ceiling", "timing_method"]].sort_values(["dist", "shape", "variant"])), ""]
    sp = speedups(best, {n: v.baseline for n, v in VARIANTS.items() if v.baseline})
    if len(sp):
        out += ["## Speedup over the matching library baseline (same run, same shape)", "", md(sp), ""]
        geo = sp.groupby(["variant", "baseline"])["speedup"].apply(lambda s: float(np.exp(np.log(s).mean())))
        out += ["Geometric mean per variant:", "", md(geo.reset_index().rename(columns={"speedup": "geomean_speedup"})), ""]
    g = sns.catplot(data=best[best["dist"] == best["dist"].iloc[0]], x="shape", y="throughput", hue="variant",
                    kind="bar", height=4.5, aspect=2.2)
    g.set_axis_labels("shape (MxNxK)", "TFLOP/s or TOPS (median)")
    g.figure.suptitle(f"{platform}: throughput of the fastest tile per variant", y=1.02)
    g.savefig(fig_dir / "throughput.png", dpi=110, bbox_inches="tight")
    out += ["![throughput](figures/throughput.png)", ""]

out += ["## Error (worst over tiles; total = vs fp64 of the unquantized inputs, kernel = vs fp64 of the "
        "dequantized inputs)", ""]
err = df.groupby(["variant", "dist", "shape"]).agg(
    tiles=("tile", "count"), failed=("status", lambda s: int((s != "ok").sum())),
    total_rel_fro=("total_rel_fro", "max"), total_calc_diff=("total_calc_diff", "max"),
    kernel_rel_fro=("kernel_rel_fro", "max"), kernel_calc_diff=("kernel_calc_diff", "max"),
    tol_total_rel_fro=("tol_total_rel_fro", "first"), tol_kernel_rel_fro=("tol_kernel_rel_fro", "first"),
).reset_index()
out += [md(err), ""]
bad = df[df["status"] != "ok"]
out += ["## Rows not ok (never counted as a win)", "", md(bad[["variant", "dist", "shape", "tile", "status", "reason"]]), ""]
e = df.melt(id_vars=["variant", "dist"], value_vars=["total_rel_fro", "kernel_rel_fro"], var_name="error", value_name="rel_fro")
g = sns.catplot(data=e, x="variant", y="rel_fro", hue="error", col="dist", kind="bar", height=4, aspect=1.6)
g.set(yscale="log")
g.set_xticklabels(rotation=30, ha="right")
g.figure.suptitle(f"{platform}: relative Frobenius error (total vs kernel share)", y=1.03)
g.savefig(fig_dir / "error.png", dpi=110, bbox_inches="tight")
out += ["![error](figures/error.png)", ""]

out += ["## Compile matrix (variant x target; worst status over tiles and shapes)", "", md(compile_summary(cm)), ""]
Path(snakemake.output.md).write_text("\n".join(out))
