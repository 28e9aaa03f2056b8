# Render the comparison report: one self-contained HTML file (figures embedded) plus the figures.
from script_setup import setup  # noqa: E402

setup(snakemake)
import base64  # noqa: E402
import html  # noqa: E402
import io  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness import (
    figures,  # noqa: E402
    tables,  # noqa: E402
)
from kernels.registry import VARIANTS, bytes_per_element, load_all  # noqa: E402

load_all()
p = snakemake.params
bytes_of = {v: bytes_per_element(v) for v in VARIANTS}
this = tables.load_set(p.result_dir, p.label, p.limits[str(p.result_dir)], bytes_of)
refs = [tables.load_set(d, label, p.limits[str(d)], bytes_of) for d, label in p.references]
threshold = p.regression_threshold
baseline_of = {n: v.baseline for n, v in VARIANTS.items() if v.baseline}
second_of = {n: v.second_baseline for n, v in VARIANTS.items() if v.second_baseline}
peers_of = {n: [b for b in (baseline_of.get(n), second_of.get(n)) if b] for n in baseline_of}
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


STATUS_STYLE = {"failed": "background:#f4b6bf;color:#7a0019;font-weight:600", "unsupported": "background:#ececec"}


def table(df: pd.DataFrame, highlight: str | None = None, fmt: dict | None = None) -> str:
    """A pandas table; rows are coloured by column ``highlight``: failed red, unsupported grey, any
    other non-empty value that is not "ok" (e.g. a regression) pink."""
    if df.empty:
        return "<p><em>(none)</em></p>"
    sty = df.style.hide(axis="index").format(fmt or {}, precision=4, na_rep="–")
    if highlight:
        val = df[highlight].astype(str)
        style = val.map(lambda v: STATUS_STYLE.get(v, "" if v in ("", "ok") else "background:#fbe3e6"))
        sty = sty.apply(lambda r: [style.loc[r.name] for _ in r], axis=1)
    return sty.to_html(table_attributes='class="tbl"')


def env_block(s: dict) -> str:
    env = dict(s["env"])
    env["result set"] = s["label"]
    return table(pd.DataFrame([env]))


def banner(s: dict) -> str:
    """What this set actually ran, read from its rows' target and GPU columns."""
    ran = tables.what_ran(s["tidy"])
    counts = ", ".join(f"{n} {k}" for k, n in sorted(ran["status"].items()))
    if ran["gpu_rows"]:
        gpus = ", ".join(ran["gpus"]) or "an unnamed GPU"
        text = (f"<b>Run on {html.escape(gpus)} ({', '.join(ran['targets'])})</b>: {ran['gpu_rows']} rows, "
                f"{ran['timed_rows']} timed; status: {counts}.")
        if not ran["timed_rows"]:
            text += " <b>No row was timed</b>: every row failed its checks or is unsupported (reasons below)."
        return f'<p class="banner">{text}</p>'
    text = (f"<b>Not run on a GPU</b>: all {ran['emulated_rows']} rows are CPU emulations of each variant's "
            "arithmetic (tile <code>emulated</code>); no kernel or library call was executed or timed"
            f"; status: {counts}. Every kernel was cross-compiled for "
            + html.escape(", ".join(sorted(s["compile"]["target"].unique()))) + ".")
    if timed is not None and timed is not s:
        text += f" <b>Speed figures below are from {html.escape(timed['label'])}</b>, not from this host."
    return f'<p class="banner">{text}</p>'


THR = {"throughput": "{:.1f}", "weight_TBps": "{:.3f}", "baseline_throughput": "{:.1f}", "speedup": "{:.3f}",
       "second_baseline_throughput": "{:.1f}", "speedup_vs_second": "{:.3f}", "time_ms_median": "{:.4g}",
       "time_ms_p20": "{:.4g}", "time_ms_p80": "{:.4g}", "pct_of_peak": "{:.1f}", "pct_of_roof": "{:.1f}",
       "pct_of_measured_best": "{:.1f}", "peak": "{:.0f}", "roof": "{:.0f}", "measured_best": "{:.0f}",
       "intensity": "{:.1f}"}
ERR = {c: "{:.3g}" for c in ("total_rel_fro", "kernel_rel_fro", "total_calc_diff", "kernel_calc_diff",
                             "tol_total_rel_fro", "tol_kernel_rel_fro")}

# -- header: what ran, then the headline figure, then the at-a-glance table
sections.append(f"<h1>lpgemm report: {html.escape(this['label'])}</h1>"
                f"<p>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from "
                f"<code>{html.escape(str(p.result_dir))}</code>.</p>" + banner(this))

# the tables several sections share, computed once
acc = tables.accuracy(this["tidy"])
if timed:
    lab = timed["label"]
    best = tables.best_tiles(timed["tidy"])
    sp = tables.speedups(best, baseline_of, second_of)
    dist0 = "normal" if (best["dist"] == "normal").any() else best["dist"].iloc[0]
    sp0 = sp[sp["dist"] == dist0]
    def geomean(x: pd.Series) -> float:
        x = x.dropna()
        return float(np.exp(np.log(x).mean())) if len(x) else np.nan

    geo = (sp.groupby(["family", "variant", "baseline"], dropna=False)
           .agg(geomean_speedup=("speedup", geomean), second_baseline=("second_baseline", "first"),
                geomean_speedup_vs_second=("speedup_vs_second", geomean), shapes=("speedup", "count"))
           .reset_index())
    sections.append(f"<h2>Speedup over the matched peer — {html.escape(lab)}</h2>"
                    + save(figures.headline_speedup(
                        sp0[sp0["variant"].map(lambda v: VARIANTS[v].kernel is not None)],
                        f"{lab}: each TileLang variant over the library call with the same accumulation semantics "
                        f"({dist0} inputs; dashed line: parity)"), "headline"))
else:
    sections.append("<h2>Speedup over the matched peer</h2>" + save(figures.message(
        "no timed rows: this set has no GPU run and no published GPU result set is configured"), "headline"))

# -- at a glance: per variant, how often it passed, how fast against its matched peer, how wrong
glance = acc.groupby(["family", "variant"]).agg(
    rows=("rows", "sum"), failed=("failed", "sum"), worst_total_rel_fro=("total_rel_fro", "max"),
    worst_kernel_rel_fro=("kernel_rel_fro", "max")).reset_index()
if timed:
    g = geo.set_index("variant")
    glance["matched_peer"] = glance["variant"].map(baseline_of)
    glance[f"geomean_speedup ({timed['label']})"] = glance["variant"].map(g["geomean_speedup"])
    glance["second_baseline"] = glance["variant"].map(second_of)
    glance["geomean_speedup_vs_second"] = glance["variant"].map(g["geomean_speedup_vs_second"])
glance["status"] = np.where(glance["failed"] > 0, "failed", "ok")
sections.append("<h2>At a glance</h2>" + table(glance,
                                               highlight="status", fmt={**{c: "{:.3g}" for c in glance.columns if "rel_fro" in c},
                                                                        **{c: "{:.3f}" for c in glance.columns if "speedup" in c}}))
sections.append("<h2>Environment</h2>" + "".join(env_block(s) for s in [this, *refs]))
for s in [this, *refs]:
    if len(s["point_sets"]):
        sections.append(f"<h3>Point sets of {html.escape(s['label'])}</h3><p>A published folder holds one run per "
                        "family: its variants, their peers and the ceilings, measured together, so every ratio "
                        "in it is taken within one run. When and at which commit each was measured:</p>"
                        + table(s["point_sets"]))
sections.append("<h2>Variants</h2><p>The <b>matched peer</b> has the variant's accumulation semantics (fp8 without "
                "promotion: cuBLAS <code>use_fast_accum=True</code>; promoted or full-fp32 kernels: promoted cuBLAS; "
                "exact integer kernels: <code>torch._int_mm</code>) and gives the headline speedup; the second "
                "baseline is reported beside it, never instead of it.</p>" + table(pd.DataFrame(
                    [{"variant": v, "family": VARIANTS[v].family, "precision": VARIANTS[v].precision,
                      "matched_peer": VARIANTS[v].baseline or "–", "second_baseline": VARIANTS[v].second_baseline or "–",
                      "what": VARIANTS[v].description}
                     for v in sorted(set(this["tidy"]["variant"]))])))

# -- throughput, speedup, roofline
if timed:
    rows = tables.panels(best[best["dist"] == dist0], peers_of, family_of)
    cols = ["dist", "shape", "variant", "tile", "throughput", "ops_unit", "weight_TBps", "time_ms_median",
            "time_ms_p20", "time_ms_p80", "pct_of_peak", "pct_of_roof", "pct_of_measured_best", "timed_kernels",
            "timing_method"]
    sections.append(f"<h2>Throughput — {html.escape(lab)}</h2>"
                    + save(figures.throughput(rows, f"{lab}: fastest tile per variant ({dist0} inputs)"), "throughput")
                    + "<p><code>pct_of_peak</code>: of the datasheet's dense peak of the variant's precision; "
                      "<code>pct_of_roof</code>: of min(peak, intensity × HBM bandwidth), both physical limits; "
                      "<code>pct_of_measured_best</code>: of the fastest library probe or kernel of that precision in "
                      "the same run. <code>timed_kernels</code>: the kernels summed per repetition.</p>"
                    + table(best[[c for c in cols if c in best]].sort_values(["dist", "shape", "variant"]), fmt=THR))
    sections.append(f"<h2>Speedup per shape — {html.escape(lab)}</h2>"
                    + save(figures.speedup(sp0, f"{lab}: speedup over the matched peer ({dist0} inputs)"), "speedup")
                    + "<h3>Geometric mean per variant</h3>"
                    + table(geo, fmt={"geomean_speedup": "{:.3f}", "geomean_speedup_vs_second": "{:.3f}"})
                    + table(sp, fmt=THR))
    pts = best[(best["dist"] == dist0) & best["intensity"].notna()]
    sections.append(f"<h2>Roofline — {html.escape(lab)}</h2>"
                    + save(figures.roofline(pts, timed["roofs"], f"{lab}: roofline"), "roofline")
                    + table(timed["roofs"], fmt={"value": "{:.4g}"}))
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
