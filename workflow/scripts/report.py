# Render the comparison report: one self-contained HTML file (figures embedded) plus the figures.
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import setup  # noqa: E402

setup(snakemake)
import base64  # noqa: E402
import html  # noqa: E402
import io  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import figures  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import tables  # noqa: E402

from kernels.registry import VARIANTS, bytes_per_element, load_all  # noqa: E402

load_all()
p = snakemake.params
this = tables.load_set(p.result_dir, p.label)
refs = [tables.load_set(d, label) for d, label in p.references]
threshold = p.regression_threshold
baseline_of = {n: v.baseline for n, v in VARIANTS.items() if v.baseline}
family_of = {n: v.family for n, v in VARIANTS.items()}
# throughput comes from this run when it was timed, else from the first published GPU set
timed = this if this["timed"] else next((r for r in refs if r["timed"]), None)

sections: list[str] = []
images: dict[str, str] = {}


def save(fig, name: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    Path(snakemake.output[name]).write_bytes(data)
    images[name] = name
    return (f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
            f"<figcaption>{html.escape(p.captions[name])}</figcaption></figure>")


def table(df: pd.DataFrame, highlight: str | None = None, fmt: dict | None = None) -> str:
    """A pandas table; rows where column ``highlight`` is truthy (or not "ok") are marked."""
    if df.empty:
        return "<p><em>(none)</em></p>"
    sty = df.style.hide(axis="index").format(fmt or {}, precision=4, na_rep="–")
    if highlight:
        bad = df[highlight].astype(str).ne("") & df[highlight].astype(str).ne("ok")
        sty = sty.apply(lambda r: ["background:#fbe3e6" if bad.loc[r.name] else "" for _ in r], axis=1)
    return sty.to_html(table_attributes='class="tbl"')


def env_block(s: dict) -> str:
    env = dict(s["env"])
    env["result set"] = s["label"]
    return table(pd.DataFrame([env]))


THR = {"throughput": "{:.1f}", "weight_TBps": "{:.3f}", "baseline_throughput": "{:.1f}", "speedup": "{:.3f}", "time_ms_median": "{:.4g}",
       "time_ms_p20": "{:.4g}", "time_ms_p80": "{:.4g}", "pct_of_ceiling": "{:.1f}"}
ERR = {c: "{:.3g}" for c in ("total_rel_fro", "kernel_rel_fro", "total_calc_diff", "kernel_calc_diff",
                             "tol_total_rel_fro", "tol_kernel_rel_fro")}

# -- header and environment
on_gpu = this["timed"]
head = [f"<h1>lpgemm report: {html.escape(this['label'])}</h1>",
        f"<p>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from <code>{html.escape(str(p.result_dir))}</code>.</p>"]
if not on_gpu:
    head.append('<p class="banner"><b>Not run on this host: no CUDA GPU was detected.</b> No kernel was executed or '
                "timed and no library baseline was called; this host's numbers are CPU emulations of each variant's "
                "arithmetic (tile <code>emulated</code>), and every kernel was cross-compiled for "
                + html.escape(", ".join(sorted(this["compile"]["target"].unique()))) + "."
                + (f" <b>Throughput below is from {html.escape(timed['label'])}</b>, not from this host." if timed else "")
                + "</p>")
sections.append("\n".join(head))
# the tables several sections share, computed once
acc = tables.accuracy(this["tidy"])
if timed:
    best = tables.best_tiles(timed["tidy"])
    sp = tables.speedups(best, baseline_of)
    geo = (sp.dropna(subset=["speedup"]).groupby(["variant", "baseline"])["speedup"]
           .apply(lambda s: float(np.exp(np.log(s).mean()))).reset_index(name="geomean_speedup"))

# -- at a glance: per variant, how often it passed, how fast against its baseline, how wrong
glance = acc.groupby(["family", "variant"]).agg(
    rows=("rows", "sum"), failed=("failed", "sum"), worst_total_rel_fro=("total_rel_fro", "max"),
    worst_kernel_rel_fro=("kernel_rel_fro", "max")).reset_index()
if timed:
    glance[f"geomean_speedup ({timed['label']})"] = glance["variant"].map(geo.set_index("variant")["geomean_speedup"])
    glance["baseline"] = glance["variant"].map(baseline_of)
glance["status"] = np.where(glance["failed"] > 0, "failed", "ok")
sections.append("<h2>At a glance</h2>" + table(glance,
                                               highlight="status", fmt={**{c: "{:.3g}" for c in glance.columns if "rel_fro" in c},
                                                                        **{c: "{:.3f}" for c in glance.columns if "speedup" in c}}))
sections.append("<h2>Environment</h2>" + "".join(env_block(s) for s in [this, *refs]))
sections.append("<h2>Variants</h2>" + table(pd.DataFrame(
    [{"variant": v, "family": VARIANTS[v].family, "baseline": VARIANTS[v].baseline or "–", "what": VARIANTS[v].description}
     for v in sorted(set(this["tidy"]["variant"]))])))

# -- throughput, speedup, roofline
if timed:
    lab = timed["label"]
    dist0 = "normal" if (best["dist"] == "normal").any() else best["dist"].iloc[0]
    rows = tables.panels(best[best["dist"] == dist0], baseline_of, family_of)
    pts = tables.roofline_points(best[best["dist"] == dist0],
                                 {v: bytes_per_element(v) for v in best["variant"].unique()})
    # bytes of B (the weight, with its scales) per second: the figure of merit of memory-bound shapes
    b_bytes = best["variant"].map({v: bytes_per_element(v)[1] for v in best["variant"].unique()})
    best["weight_TBps"] = best["N"] * best["K"] * b_bytes / (best["time_ms_median"] * 1e-3) / 1e12
    cols = ["dist", "shape", "variant", "tile", "throughput", "ops_unit", "weight_TBps", "time_ms_median",
            "time_ms_p20", "time_ms_p80", "pct_of_ceiling", "timing_method"]
    sections.append(f"<h2>Throughput — {html.escape(lab)}</h2>"
                    + save(figures.throughput(rows, f"{lab}: fastest tile per variant ({dist0} inputs)"), "throughput")
                    + table(best[cols].sort_values(["dist", "shape", "variant"]), fmt=THR))
    sections.append(f"<h2>Speedup over the matching library baseline — {html.escape(lab)}</h2>"
                    + save(figures.speedup(sp[sp["dist"] == dist0], f"{lab}: speedup ({dist0} inputs)"), "speedup")
                    + "<h3>Geometric mean per variant</h3>" + table(geo, fmt={"geomean_speedup": "{:.3f}"})
                    + table(sp, fmt=THR))
    ceil = timed["ceilings"]
    sections.append(f"<h2>Roofline — {html.escape(lab)}</h2>"
                    + save(figures.roofline(pts, ceil, f"{lab}: roofline"), "roofline")
                    + table(pd.DataFrame([{"ceiling": k, **v} for k, v in ceil.items()]), fmt={"value": "{:.4g}"}))
else:
    for name in ("throughput", "speedup", "roofline"):
        sections.append(f"<h2>{name.capitalize()}</h2>" + save(figures.message(
            "no timed rows: this host has no GPU and no published GPU result set is configured"), name))

# -- accuracy (this host's own numerics)
not_ok = this["tidy"][this["tidy"]["status"] != "ok"][["variant", "dist", "shape", "tile", "status", "reason"]]
sections.append(f"<h2>Accuracy — {html.escape(this['label'])}</h2>"
                + save(figures.accuracy(acc, f"{this['label']}: total error (vs fp64 of the unquantized inputs) and "
                                             "kernel error (vs fp64 of the dequantized inputs)"), "accuracy")
                + table(acc.assign(status=np.where(acc["failed"] > 0, "failed", "ok")), highlight="status", fmt=ERR)
                + "<h3>Rows not ok (never counted as a win)</h3>" + table(not_ok, highlight="status"))

# -- compile matrix
summary = tables.compile_summary(this["compile"])
detail = (this["compile"].groupby(["variant", "target", "status", "reason"], dropna=False)
          .agg(kernels=("tile", "size"), compile_s_median=("compile_s", "median"), max_registers=("registers", "max"),
               max_smem_dynamic_bytes=("smem_dynamic_bytes", "max")).reset_index())
sections.append(f"<h2>Compile matrix — {html.escape(this['label'])}</h2>"
                + save(figures.compile_matrix(summary, f"{this['label']}: worst status over tiles and shapes"),
                       "compile_matrix")
                + table(detail, highlight="status", fmt={"compile_s_median": "{:.2f}"}))

# -- comparison with the reference sets
cmp_html = []
first_fig = None
for r in refs:
    cmp = tables.compare_sets(this["tidy"], r["tidy"], threshold)
    if first_fig is None:
        first_fig = figures.comparison(cmp, this["label"], r["label"], threshold)
    n_reg = int((cmp["regression"] != "").sum())
    cmp_html.append(f"<h3>{html.escape(this['label'])} vs {html.escape(r['label'])}: {n_reg} regression(s) over "
                    f"{threshold:.0%}</h3>" + table(cmp, highlight="regression",
                                                    fmt={**ERR, **{c: "{:.1f}" for c in ("throughput_this", "throughput_ref")},
                                                         "throughput_ratio": "{:.3f}"}))
fig = first_fig or figures.message("no reference result set configured (report.compare_with)")
sections.append("<h2>Comparison</h2>" + save(fig, "comparison") + "".join(cmp_html))

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1500px;color:#222;padding:0 1rem}
h1{margin-bottom:.2rem} h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.4rem}
.banner{background:#fff4d6;border-left:5px solid #e0a800;padding:.7rem 1rem}
figure{margin:1rem 0} img{max-width:100%;height:auto} figcaption{color:#555;font-size:.9rem}
table.tbl{border-collapse:collapse;font-size:.8rem;margin:.6rem 0;display:block;overflow-x:auto;max-height:32rem}
table.tbl th,table.tbl td{border:1px solid #ddd;padding:.2rem .45rem;text-align:right;white-space:nowrap}
table.tbl th{background:#f3f3f3;position:sticky;top:0}
table.tbl td:last-child{white-space:normal;min-width:18rem;max-width:60rem;text-align:left}
"""
# the page records how many figures decoded, so a headless browser can check none is broken
SCRIPT = ("<script>window.addEventListener('load',()=>{const i=[...document.images];"
          "document.body.dataset.figures=i.length;"
          "document.body.dataset.figuresLoaded=i.filter(x=>x.complete&&x.naturalWidth>0).length;});</script>")
page = (f"<!doctype html><html><head><meta charset='utf-8'><title>lpgemm report: {html.escape(this['label'])}</title>"
        f"<style>{STYLE}</style>{SCRIPT}</head><body>" + "\n".join(sections) + "</body></html>")
Path(snakemake.output.html).write_text(page)
