"""The comparison report: one self-contained HTML page (figures embedded as PNG) built from result sets.

``render_report`` reads this run's result set and its reference sets and returns the page and each
figure's PNG; every other function renders one section from tables already loaded. Plain Python, no
Snakemake: ``workflow/scripts/report.py`` only passes the rule's params in and writes the outputs.
"""
from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness import cost, figures, profile, records, tables
from kernels.registry import Variant, bytes_per_element

STATUS_STYLE = {"failed": "background:#f4b6bf;color:#7a0019;font-weight:600", "unsupported": "background:#ececec"}
THR = {"throughput": "{:.1f}", "weight_TBps": "{:.3f}", "baseline_throughput": "{:.1f}", "speedup": "{:.3f}",
       "second_baseline_throughput": "{:.1f}", "speedup_vs_second": "{:.3f}", "time_ms_median": "{:.4g}",
       "time_ms_p20": "{:.4g}", "time_ms_p80": "{:.4g}", "pct_of_peak": "{:.1f}", "pct_of_roof": "{:.1f}",
       "pct_of_measured_best": "{:.1f}", "peak": "{:.0f}", "roof": "{:.0f}", "measured_best": "{:.0f}",
       "intensity": "{:.1f}", "speedup_lo": "{:.3f}", "speedup_hi": "{:.3f}", "speedup_unpaired": "{:.3f}",
       "speedup_vs_second_lo": "{:.3f}", "speedup_vs_second_hi": "{:.3f}", "aa_ratio": "{:.4f}", "aa_halfwidth": "{:.2%}",
       "pair_rounds": "{:.0f}", "sm_clock_mhz_median": "{:.0f}", "sustained_speedup": "{:.3f}",
       "sustained_speedup_lo": "{:.3f}", "sustained_speedup_hi": "{:.3f}", "sustained_sm_clock_mhz_median": "{:.0f}"}
# a paired ratio's verdict cell: green faster, red slower (same: plain); an A/A that did not read "same": pink
VERDICT_STYLE = {"faster": "background:#d5eedb", "slower": "background:#f4b6bf"}
VERDICT_COLUMNS = ("verdict", "verdict_vs_second", "sustained_verdict")
ERR = {c: "{:.3g}" for c in ("total_rel_fro", "kernel_rel_fro", "total_calc_diff", "kernel_calc_diff",
                             "tol_total_rel_fro", "tol_kernel_rel_fro")}
THROUGHPUT_COLUMNS = ["dist", "shape", "variant", "tile", "throughput", "ops_unit", "weight_TBps", "time_ms_median",
                      "time_ms_p20", "time_ms_p80", "pct_of_peak", "pct_of_roof", "pct_of_measured_best",
                      "timed_kernels", "timing_method"]
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1500px;color:#222;padding:0 1rem}
h1{margin-bottom:.2rem} h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.4rem}
.banner{background:#fff4d6;border-left:5px solid #e0a800;padding:.7rem 1rem}
.damaged{background:#fbe3e6;border-left:5px solid #b00020;padding:.4rem 1rem .7rem}
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


class Figures:
    """The report's figures: each is rendered to PNG once, kept by name (``png``) and embedded in the page."""

    def __init__(self, captions: Mapping[str, str]):
        self.captions = captions
        self.png: dict[str, bytes] = {}

    def embed(self, fig: plt.Figure, name: str) -> str:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        data = self.png[name] = buf.getvalue()
        return (f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
                f"<figcaption>{html.escape(self.captions[name])}</figcaption></figure>")


@dataclass(frozen=True)
class Peers:
    """What the report reads of the variant registry: each variant's matched peer, second baseline, family."""
    baseline_of: dict[str, str]
    second_of: dict[str, str]
    family_of: dict[str, str]

    @classmethod
    def of(cls, variants: Mapping[str, Variant]) -> Peers:
        return cls({n: v.baseline for n, v in variants.items() if v.baseline},
                   {n: v.second_baseline for n, v in variants.items() if v.second_baseline},
                   {n: v.family for n, v in variants.items()})

    def peers_of(self) -> dict[str, list[str]]:
        return {n: [b for b in (self.baseline_of.get(n), self.second_of.get(n)) if b] for n in self.baseline_of}


@dataclass(frozen=True)
class Timed:
    """The speed tables of the set the throughput comes from, computed once for every section."""
    label: str
    best: pd.DataFrame  # the fastest tile per (variant, dist, shape)
    speedups: pd.DataFrame
    dist0: str  # the distribution the figures show
    geomean: pd.DataFrame  # geometric-mean speedups per variant
    roofs: pd.DataFrame


def table(df: pd.DataFrame, highlight: str | None = None, fmt: dict | None = None) -> str:
    """A pandas table; rows are coloured by column ``highlight``: failed red, unsupported grey, any
    other non-empty value that is not "ok" (e.g. a regression) pink."""
    if df.empty:
        return "<p><em>(none)</em></p>"
    # escaped: reasons and kernel names hold "<" (wgmma_ss<...>, Kernel2<cutlass_...>)
    sty = df.style.hide(axis="index").format(fmt or {}, precision=4, na_rep="–", escape="html")
    if highlight:
        val = df[highlight].astype(str)
        style = val.map(lambda v: STATUS_STYLE.get(v, "" if v in ("", "ok") else "background:#fbe3e6"))
        sty = sty.apply(lambda r: [style.loc[r.name] for _ in r], axis=1)
    verdicts = [c for c in VERDICT_COLUMNS if c in df]
    if verdicts:
        sty = sty.map(lambda v: VERDICT_STYLE.get(v, ""), subset=verdicts)
    if "aa_verdict" in df:
        sty = sty.map(lambda v: "background:#fbe3e6" if isinstance(v, str) and v != "same" else "", subset=["aa_verdict"])
    return sty.to_html(table_attributes='class="tbl"')


def shown_speedups(sp: pd.DataFrame) -> pd.DataFrame:
    """The speedup table as the page shows it: a set timed before pairing without the paired-only columns
    (``speedup_method`` still says each ratio is unpaired), a paired set without the ones no point filled."""
    if not (sp["speedup_method"] == tables.PAIRED).any():
        return sp.drop(columns=tables.PAIRED_ONLY)
    return sp.drop(columns=[c for c in tables.PAIRED_ONLY if sp[c].isna().all()])


def load_sets(result_dir: str | Path, label: str, limits: Mapping[str, dict | None],
              references: Sequence[tuple[str, str]], variants: Mapping[str, Variant]) -> tuple[dict, list[dict]]:
    """This run's result set and the reference sets ((folder, label) each), with the datasheet ``limits``
    of each folder (keyed by its path as a string)."""
    bytes_of = {v: bytes_per_element(v) for v in variants}
    this = tables.load_set(result_dir, label, limits[str(result_dir)], bytes_of)
    refs = [tables.load_set(d, ref_label, limits[str(d)], bytes_of) for d, ref_label in references]
    return this, refs


def _geomean(x: pd.Series) -> float:
    x = x.dropna()
    return float(np.exp(np.log(x).mean())) if len(x) else np.nan


def timed_tables(timed: dict | None, peers: Peers) -> Timed | None:
    """Best tiles, speedups and their geometric means of the timed set (None: nothing was timed)."""
    if not timed:
        return None
    best = tables.best_tiles(timed["tidy"])
    sp = tables.speedups(best, peers.baseline_of, peers.second_of)
    dist0 = "normal" if (best["dist"] == "normal").any() else best["dist"].iloc[0]
    geo = (sp.groupby(["family", "variant", "baseline"], dropna=False)
           .agg(geomean_speedup=("speedup", _geomean), second_baseline=("second_baseline", "first"),
                geomean_speedup_vs_second=("speedup_vs_second", _geomean), shapes=("speedup", "count"))
           .reset_index())
    return Timed(timed["label"], best, sp, dist0, geo, timed["roofs"])


def banner(s: dict, timed: dict | None) -> str:
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


def header(this: dict, timed: dict | None, result_dir: str | Path, generated: datetime) -> str:
    return (f"<h1>lpgemm report: {html.escape(this['label'])}</h1>"
            f"<p>Generated {generated:%Y-%m-%d %H:%M UTC} from "
            f"<code>{html.escape(str(result_dir))}</code>.</p>" + banner(this, timed))


def headline_section(t: Timed | None, variants: Mapping[str, Variant], figs: Figures) -> str:
    """Each TileLang variant's speedup over its matched peer: the first figure of the page."""
    if t is None:
        return "<h2>Speedup over the matched peer</h2>" + figs.embed(figures.message(
            "no timed rows: this set has no GPU run and no published GPU result set is configured"), "headline")
    sp0 = t.speedups[t.speedups["dist"] == t.dist0]
    return (f"<h2>Speedup over the matched peer — {html.escape(t.label)}</h2>"
            + figs.embed(figures.headline_speedup(
                sp0[sp0["variant"].map(lambda v: variants[v].kernel is not None)],
                f"{t.label}: each TileLang variant over the library call with the same accumulation semantics "
                f"({t.dist0} inputs; dashed line: parity)"), "headline")
            + f"<p>{method_note(t.speedups)}</p>")


def method_note(sp: pd.DataFrame) -> str:
    """How this set's ratios were taken, in one sentence (docs/methodology.md: How a speedup is taken)."""
    n_paired = int((sp["speedup_method"] == tables.PAIRED).sum())
    n_unpaired = int((sp["speedup_method"] == tables.UNPAIRED).sum())
    if not n_paired:
        return (f"All {n_unpaired} ratios are <b>unpaired</b>: best-tile throughputs of the variant and its peer, "
                "timed in separate jobs (no interval, no verdict).")
    text = (f"{n_paired} ratios are <b>paired</b>: the variant and its peer timed strictly alternated in one process, "
            "the median of per-round ratios with its 95 % interval; <i>faster</i> or <i>slower</i> when the interval "
            "excludes 1, else <i>same</i>.")
    return text + (f" {n_unpaired} are unpaired (separate jobs, no interval)." if n_unpaired else "")


def at_a_glance_section(acc: pd.DataFrame, t: Timed | None, peers: Peers) -> str:
    """Per variant: how often it passed, how fast against its matched peer, how wrong."""
    glance = acc.groupby(["family", "variant"]).agg(
        rows=("rows", "sum"), failed=("failed", "sum"), worst_total_rel_fro=("total_rel_fro", "max"),
        worst_kernel_rel_fro=("kernel_rel_fro", "max")).reset_index()
    if t is not None:
        g = t.geomean.set_index("variant")
        glance["matched_peer"] = glance["variant"].map(peers.baseline_of)
        glance[f"geomean_speedup ({t.label})"] = glance["variant"].map(g["geomean_speedup"])
        glance["second_baseline"] = glance["variant"].map(peers.second_of)
        glance["geomean_speedup_vs_second"] = glance["variant"].map(g["geomean_speedup_vs_second"])
        # faster / same / slower: paired ratios by their interval; unpaired: no verdict (separate jobs)
        counts = tables.verdict_counts(t.speedups).set_index("variant")
        paired = bool(counts[list(tables.VERDICTS)].to_numpy().sum())
        for col in (*tables.VERDICTS, "unpaired") if paired else ("unpaired",):
            glance[col] = glance["variant"].map(counts[col]).astype("Int64")
    glance["status"] = np.where(glance["failed"] > 0, "failed", "ok")
    fmt = {**{c: "{:.3g}" for c in glance.columns if "rel_fro" in c}, **{c: "{:.3f}" for c in glance.columns if "speedup" in c}}
    return "<h2>At a glance</h2>" + table(glance, highlight="status", fmt=fmt)


def environment_section(sets: Sequence[dict]) -> str:
    def env_block(s: dict) -> str:
        env = dict(s["env"])
        env["result set"] = s["label"]
        return table(pd.DataFrame([env]))

    return "<h2>Environment</h2>" + "".join(env_block(s) for s in sets)


def point_sets_sections(sets: Sequence[dict]) -> list[str]:
    """One section per published set: when and at which commit each family's run was measured."""
    return [f"<h3>Point sets of {html.escape(s['label'])}</h3><p>A published folder holds one run per "
            "family: its variants, their peers and the ceilings, measured together, so every ratio "
            "in it is taken within one run. When and at which commit each was measured:</p>"
            + table(s["point_sets"]) for s in sets if len(s["point_sets"])]


def variants_section(this: dict, variants: Mapping[str, Variant]) -> str:
    rows = [{"variant": v, "family": variants[v].family, "precision": variants[v].precision,
             "matched_peer": variants[v].baseline or "–", "second_baseline": variants[v].second_baseline or "–",
             "what": variants[v].description}
            for v in sorted(set(this["tidy"]["variant"]))]
    return ("<h2>Variants</h2><p>The <b>matched peer</b> has the variant's accumulation semantics (fp8 without "
            "promotion: cuBLAS <code>use_fast_accum=True</code>; promoted or full-fp32 kernels: promoted cuBLAS; "
            "exact integer kernels: <code>torch._int_mm</code>) and gives the headline speedup; the second "
            "baseline is reported beside it, never instead of it.</p>" + table(pd.DataFrame(rows)))


def _untimed(name: str, figs: Figures, heading: str | None = None) -> str:
    return f"<h2>{heading or name.capitalize()}</h2>" + figs.embed(figures.message(
        "no timed rows: this host has no GPU and no published GPU result set is configured"), name)


def throughput_section(t: Timed | None, peers: Peers, figs: Figures) -> str:
    if t is None:
        return _untimed("throughput", figs)
    best = t.best
    rows = tables.panels(best[best["dist"] == t.dist0], peers.peers_of(), peers.family_of)
    return (f"<h2>Throughput — {html.escape(t.label)}</h2>"
            + figs.embed(figures.throughput(rows, f"{t.label}: fastest tile per variant ({t.dist0} inputs)"), "throughput")
            + "<p><code>pct_of_peak</code>: of the datasheet's dense peak of the variant's precision; "
              "<code>pct_of_roof</code>: of min(peak, intensity × HBM bandwidth), both physical limits; "
              "<code>pct_of_measured_best</code>: of the fastest library probe or kernel of that precision in "
              "the same run. <code>timed_kernels</code>: the kernels summed per repetition.</p>"
            + table(best[[c for c in THROUGHPUT_COLUMNS if c in best]].sort_values(["dist", "shape", "variant"]), fmt=THR))


def speedup_section(t: Timed | None, figs: Figures) -> str:
    if t is None:
        return _untimed("speedup", figs)
    sp0 = t.speedups[t.speedups["dist"] == t.dist0]
    return (f"<h2>Speedup per shape — {html.escape(t.label)}</h2>"
            + figs.embed(figures.speedup(sp0, f"{t.label}: speedup over the matched peer ({t.dist0} inputs)"), "speedup")
            + "<h3>Geometric mean per variant</h3>"
            + table(t.geomean, fmt={"geomean_speedup": "{:.3f}", "geomean_speedup_vs_second": "{:.3f}"})
            + f"<h3>Every ratio</h3><p>{method_note(t.speedups)}</p>"
            + table(shown_speedups(t.speedups), fmt=THR)
            + aa_section(t.speedups) + power_state_section(t.speedups))


def aa_section(sp: pd.DataFrame) -> str:
    """The A/A check: how wide the variant's interval against itself is per family, and any that was not "same"."""
    per_family, off = tables.aa_checks(sp)
    if per_family.empty:
        return ""
    return ("<h3>A/A check</h3><p>At the headline shapes (<code>timing.pairing.aa_shapes</code>) each paired variant "
            "is also paired with itself; its ratio must read <i>same</i>. The worst A/A half-width per family is the "
            "resolution of that family's verdicts.</p>"
            + table(per_family.assign(status=np.where(per_family["aa_not_same"] > 0, "A/A not same", "")),
                    highlight="status", fmt={"worst_aa_halfwidth": "{:.2%}"})
            + ("<p>A/A checks that did not read <i>same</i>:</p>" + table(off, fmt=THR) if len(off) else ""))


def power_state_section(sp: pd.DataFrame) -> str:
    """Cold and sustained ratios side by side where a point has both, with each window's SM clock and throttle flag."""
    both = tables.power_states(sp)
    if both.empty:
        return ""
    n_differ = int((both["verdicts"] == "differ").sum())
    return ("<h3>Power state</h3><p>Cold: timed in the burst right after the checks; sustained: timed again after "
            "the pair ran back to back until the SM clock settled. Throttled: the window's lowest SM clock under 75 % "
            f"of the default clock. {n_differ} of {len(both)} points change verdict between the two states "
            "(highlighted).</p>" + table(both, highlight="verdicts", fmt=THR))


def shape_sets_section(t: Timed | None) -> str:
    """The zoo (real models' layers, config ``zoo``) beside the sweep: each variant's geometric mean over
    either, and the zoo's worst shapes (docs/design/tile_selection.md)."""
    if t is None or "shape_set" not in t.best:
        return ""
    shape_set = t.best.drop_duplicates("shape").set_index("shape")["shape_set"]
    gates = tables.shape_set_gates(t.speedups, shape_set)
    if gates.empty:
        return ""
    layers = t.best.dropna(subset=["zoo_layer"]).drop_duplicates("shape")[["shape", "zoo_layer"]] \
        if "zoo_layer" in t.best else pd.DataFrame()
    return ("<h2>Sweep and zoo</h2><p>The zoo is the linear layers of public models at decode, small-batch and "
            "prefill token counts (config <code>zoo</code>, each layer with its source). Per variant: the geometric "
            "mean speedup over the matched peer on the sweep and on the zoo, and the zoo's shapes below 0.90x.</p>"
            + table(gates, fmt={c: "{:.3f}" for c in ("sweep_geomean", "zoo_geomean", "zoo_worst")})
            + ("<h3>Zoo shapes</h3>" + table(layers.sort_values("shape")) if len(layers) else ""))


def tile_choice_section(t: Timed | None, folder: str | Path | None, peers: Peers, damaged: list | None = None) -> str:
    """Where each timed tile came from (tuned table, model, config), and the model's regret: its first pick's
    time over the tuned best, per tuned shape (harness/selection.py)."""
    if t is None or folder is None:
        return ""
    zoo = set(t.best.loc[t.best.get("shape_set", pd.Series(dtype=str)) == "zoo", "shape"]) if "shape_set" in t.best else set()
    tuning = tables.tuning_table(folder, zoo, damaged)
    sources = (t.best[t.best["tile"] != "lib"].groupby(["variant", "tile_source"], dropna=False).size()
               .rename("shapes").reset_index()) if "tile_source" in t.best else pd.DataFrame()
    if tuning.empty and sources.empty:
        return ""
    html_ = ("<h2>Tile choice</h2><p>A variant with a tile space gets, per platform and shape, the tuned table's "
             "winner while its key holds, else the cost model's pick; tiles listed in the config override both. "
             "The model's <b>regret</b> is its first pick's time over the tuned best, both timed by the tune job.</p>")
    if len(sources):
        html_ += "<h3>Source of each timed tile</h3>" + table(sources)
    if len(tuning):
        summary = tables.regret_summary(tuning, peers.family_of)
        html_ += ("<h3>The model's pick against the tuned best</h3>" + table(summary, fmt={"share": "{:.0%}"})
                  + "<h3>Every tuned shape</h3>"
                  + table(tuning.drop(columns=["record"]).sort_values(["variant", "shape_set", "shape"]),
                          fmt={"pick_us": "{:.1f}", "best_us": "{:.1f}", "regret": "{:.3f}"}))
    return html_


def roofline_section(t: Timed | None, figs: Figures) -> str:
    if t is None:
        return _untimed("roofline", figs)
    pts = t.best[(t.best["dist"] == t.dist0) & t.best["intensity"].notna()]
    return (f"<h2>Roofline — {html.escape(t.label)}</h2>"
            + figs.embed(figures.roofline(pts, t.roofs, f"{t.label}: roofline"), "roofline")
            + table(t.roofs, fmt={"value": "{:.4g}"}))


WEIGHT_COLUMNS = ["dist", "shape", "variant", "tile", "time_ms_median", "weight_TBps", "pct_of_hbm", "timed_kernels"]


def weight_bandwidth_section(t: Timed | None, peers: Peers, figs: Figures) -> str:
    """The W4A16 (dequant) rows and their peers: time and the weight's bytes per second beside the HBM line."""
    if t is None:
        return _untimed("weight_bandwidth", figs, "Weight bandwidth (W4A16)")
    best = t.best[t.best["dist"] == t.dist0]
    rows = tables.panels(best, peers.peers_of(), peers.family_of)
    rows = rows[rows["panel"] == "dequant"].assign(pct_of_hbm=lambda d: 100 * d["weight_TBps"] / d["hbm_TBps"])
    return ("<h2>Weight bandwidth (W4A16) — " + html.escape(t.label) + "</h2>"
            + figs.embed(figures.weight_bandwidth(rows, t.roofs, f"{t.label}: weight bytes per second, fastest tile "
                                                  f"({t.dist0} inputs)"), "weight_bandwidth")
            + "<p><code>weight_TBps</code>: bytes of the stored weight with its scales (and zeros) over the median "
              "time; <code>pct_of_hbm</code>: of the datasheet HBM bandwidth. The L2 cache is flushed before every "
              "repetition, so the packed weight (34 MB at 8192x8192, which would fit in the 50 MB L2) is read from "
              "HBM each time, like the bf16 weight it replaces.</p>"
            + table(rows[[c for c in WEIGHT_COLUMNS if c in rows]].sort_values(["shape", "variant"]),
                    fmt=THR | {"pct_of_hbm": "{:.1f}"}))


def accuracy_section(this: dict, acc: pd.DataFrame, figs: Figures) -> str:
    """This set's own numerics, and every row that is not ok."""
    tidy = this["tidy"]
    not_ok = tidy[tidy["status"] != "ok"][["variant", "dist", "shape", "tile", "status", "reason"]]
    return (f"<h2>Accuracy — {html.escape(this['label'])}</h2>"
            + figs.embed(figures.accuracy(acc, f"{this['label']}: total error (vs fp64 of the unquantized inputs) and "
                                               "kernel error (vs fp64 of the dequantized inputs)"), "accuracy")
            + table(acc.assign(status=np.where(acc["failed"] > 0, "failed", "ok")), highlight="status", fmt=ERR)
            + "<h3>Rows not ok (never counted as a win)</h3>" + table(not_ok, highlight="status"))


def compile_section(this: dict, figs: Figures) -> str:
    cm = this["compile"]
    summary = tables.compile_summary(cm)
    aggs = {"kernels": ("tile", "size"), "compile_s_median": ("compile_s", "median"), "max_registers": ("registers", "max"),
            "max_smem_dynamic_bytes": ("smem_dynamic_bytes", "max")}
    if "sass" in cm:  # records made before the SASS was read have none
        aggs = {"sass": ("sass", tables.sass_names),
                **aggs, "max_spill_instructions": ("spill_instructions", "max")}
        cm = cm.assign(spill_instructions=cm["sass_local_loads"] + cm["sass_local_stores"])
    detail = cm.groupby(["variant", "target", "status", "reason"], dropna=False).agg(**aggs).reset_index()
    return (f"<h2>Compile matrix — {html.escape(this['label'])}</h2>"
            + figs.embed(figures.compile_matrix(summary, f"{this['label']}: worst status over tiles and shapes, the "
                                                         "SASS's tensor-core instructions, registers"), "compile_matrix")
            + table(detail, highlight="status", fmt={"compile_s_median": "{:.2f}"}))


def damaged_section(damaged: Sequence[records.DamagedFile]) -> str:
    """Every input file the report could not read, by name, with what is wrong and its fix: what such a
    file holds is missing from (or failed in) every section below, and must not go unnoticed."""
    if not damaged:
        return ""
    rows = pd.DataFrame([{"file": e.path, "what is wrong": e.problem, "fix": e.fix} for e in damaged])
    return (f'<div class="damaged" id="damaged-inputs"><h2>Damaged inputs</h2><p><b>Warning: {len(damaged)} '
            "file(s) this report reads could not be read.</b> What they hold is left out of the sections below "
            "(a damaged point is a failed row there); restore or recompute each with its fix, then rebuild "
            "the report.</p>" + table(rows) + "</div>")


def profiles_section(sets: Sequence[tuple[str | Path, str]], damaged: list | None = None) -> str:
    """Every Nsight Compute profile summary of each (folder, label) result set (harness/profile.py)."""
    frames = [tables.profile_table(folder, damaged).assign(set=label) for folder, label in sets]
    prof = pd.concat([f for f in frames if not f.empty] or [frames[0]], ignore_index=True)
    how = ("<p>Nsight Compute (<code>ncu --clock-control none</code>; caches flushed before every replay pass) "
           "of one call of the variant, its own kernels only; figures of the longest kernel. SOL %: share of "
           "that unit's peak over the kernel's time. Limiter: the busiest unit, or latency when none reaches "
           f"{profile.BUSY_PCT:.0f}% of peak. DRAM MB read + written against the MB the pipeline counts for the "
           "point (A, B with scales, C once each). Stalls: warp cycles per issued instruction. Profile a point: "
           "<code>snakemake --cores 1 results/&lt;platform&gt;/profile/&lt;entry&gt;/&lt;dist&gt;/&lt;shape&gt;/"
           "&lt;tile&gt;.summary.json</code> (tile <code>lib</code> for a library baseline).</p>")
    fmt = {c: "{:.1f}" for c in tables.PROFILE_METRICS} | {"duration_us": "{:.1f}", "dram_MB": "{:.1f}",
                                                         "counted_MB": "{:.1f}", "dram_over_counted": "{:.2f}",
                                                         "registers_per_thread": "{:.0f}", "sm_clock_mhz": "{:.0f}"}
    return "<h2>Profiles</h2>" + how + table(prof[["set", *[c for c in prof if c != "set"]]], fmt=fmt)


def comparison_section(this: dict, refs: Sequence[dict], threshold: float, figs: Figures) -> str:
    """This set against each reference set: regressions over ``threshold`` flagged; the figure shows the first."""
    parts = []
    first_fig = None
    fmt = {**ERR, **{c: "{:.1f}" for c in ("throughput_this", "throughput_ref")}, "throughput_ratio": "{:.3f}"}
    for r in refs:
        cmp = tables.compare_sets(this["tidy"], r["tidy"], threshold)
        if first_fig is None:
            first_fig = figures.comparison(cmp, this["label"], r["label"], threshold)
        n_reg = int((cmp["regression"] != "").sum())
        parts.append(f"<h3>{html.escape(this['label'])} vs {html.escape(r['label'])}: {n_reg} regression(s) over "
                     f"{threshold:.0%}</h3>" + table(cmp, highlight="regression", fmt=fmt))
    fig = first_fig or figures.message("no reference result set configured (report.compare_with)")
    return "<h2>Comparison</h2>" + figs.embed(fig, "comparison") + "".join(parts)


def cost_section(folder: str | Path) -> str:
    """What the set's jobs cost (harness/cost.py, from its cost table): the wall time to the report and the
    sittings, time per rule kind, the slowest jobs, and the run jobs' set-up against their timing; one line
    where the set has no cost table (made before jobs recorded their benchmarks) or it cannot be read."""
    head = "<h2>What this run cost</h2>"
    try:
        jobs = cost.load(folder)
    except (OSError, ValueError) as e:  # pandas' parser errors are ValueErrors
        return head + (f"<p>No cost shown: the cost table of <code>{html.escape(str(folder))}</code> could not be read "
                       f"({html.escape(str(e))}).</p>")
    if jobs is None or not jobs["wall_s"].notna().any():
        return head + ("<p>No cost recorded: this set's jobs ran before they recorded their benchmarks "
                       "(<code>results/benchmarks/</code>).</p>")
    s, d = cost.summary(jobs), cost.duration
    unrecorded = f"; {s['unrecorded']} more, made before jobs recorded their benchmarks, not counted" if s["unrecorded"] else ""
    text = (f"<p>Wall time to the report: <b>{d(s['union_s'])}</b> with at least one of its {s['jobs']} jobs running "
            f"(a job reused from an earlier invocation counts its own time only; collect and the report not "
            f"included{unrecorded}), over {d(s['span_s'])} from the first start to the last end, in {s['sittings']} "
            f"sitting{'s' if s['sittings'] != 1 else ''} (jobs less than {cost.SITTING_GAP_S:.0f} s apart).</p>")
    kinds = s["per_kind"].assign(wall=lambda k: k["wall_s"].map(d), cpu=lambda k: k["cpu_s"].map(d))
    slowest = s["slowest"].assign(wall=lambda k: k["wall_s"].map(d), cpu=lambda k: k["cpu_s"].map(d))
    mb = {"max_rss_mb": "{:.0f}"}
    r = s["run"]
    if not s["run_jobs"]:
        runs = ""
    elif not s["run_jobs_split"]:
        runs = "<p>Run jobs: their records carry no split of their time (made before records kept one).</p>"
    else:
        runs = (f"<p>Run jobs ({s['run_jobs_split']} of {s['run_jobs']} with a split): {d(r['wall_s'])}, of which "
                f"<b>{d(r['timing_s'])} timing</b> ({d(r['standalone_s'])} standalone, {d(r['paired_s'])} paired) and "
                f"<b>{d(r['setup_s'])} set-up</b> ({d(r['load_s'])} loading inputs, {d(r['build_check_s'])} building and "
                "checking, the rest process start, imports and the GPU check).</p>")
    return (head + text + "<h3>Per rule kind</h3>" + table(kinds[["kind", "jobs", "wall", "cpu", "max_rss_mb"]], fmt=mb)
            + f"<h3>The {len(slowest)} slowest jobs</h3>"
            + table(slowest[["kind", "job", "wall", "cpu", "max_rss_mb", "start"]], fmt=mb) + runs)


def page(label: str, sections: Sequence[str]) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>lpgemm report: {html.escape(label)}</title>"
            f"<style>{STYLE}</style>{SCRIPT}</head><body>" + "\n".join(sections) + "</body></html>")


def render_report(result_dir: str | Path, label: str, limits: Mapping[str, dict | None],
                  references: Sequence[tuple[str, str]], regression_threshold: float, captions: Mapping[str, str],
                  variants: Mapping[str, Variant], generated: datetime | None = None) -> tuple[str, dict[str, bytes]]:
    """The report of the result set in ``result_dir`` (labelled ``label``) against ``references``
    ((folder, label) each): the HTML page and {figure name: PNG bytes} of every figure in it.

    ``limits``: the datasheet limits of each folder (keyed by its path as a string, None for none);
    ``captions``: each figure's caption; ``variants``: the variant registry (``kernels.registry.VARIANTS``,
    loaded); ``generated``: the time the page says it was made (default now)."""
    this, refs = load_sets(result_dir, label, limits, references, variants)
    peers = Peers.of(variants)
    # throughput comes from this run when it was timed, else from the first published GPU set
    timed = this if this["timed"] else next((r for r in refs if r["timed"]), None)
    t = timed_tables(timed, peers)
    timed_dir = result_dir if timed is this else next((d for (d, _), r in zip(references, refs, strict=True) if r is timed), None)
    acc = tables.accuracy(this["tidy"])
    figs = Figures(captions)
    # damaged committed points, provenance or ceilings of any set: listed at the top, never a crash
    damaged = [e for s in (this, *refs) for e in s["damaged"]]
    profiles = profiles_section([(result_dir, this["label"]), *references], damaged)
    records.warn(damaged)
    sections = [header(this, timed, result_dir, generated or datetime.now(timezone.utc)),
                damaged_section(damaged),
                headline_section(t, variants, figs),
                at_a_glance_section(acc, t, peers),
                environment_section([this, *refs]),
                *point_sets_sections([this, *refs]),
                variants_section(this, variants),
                throughput_section(t, peers, figs),
                speedup_section(t, figs),
                shape_sets_section(t),
                tile_choice_section(t, timed_dir, peers, damaged),
                roofline_section(t, figs),
                weight_bandwidth_section(t, peers, figs),
                accuracy_section(this, acc, figs),
                compile_section(this, figs),
                profiles,
                comparison_section(this, refs, regression_threshold, figs),
                cost_section(result_dir)]
    return page(this["label"], sections), figs.png
