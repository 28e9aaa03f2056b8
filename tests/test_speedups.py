"""Speedups paired first: the median of alternated rounds with its interval where a point has one, the
throughput ratio of separate jobs where it has none (older sets, CPU runs), and the report's use of both."""
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from harness import figures, report, tables

BASELINE_OF = {"fp8_e4m3": "cublas_fp8_e4m3_fastacc"}
SECOND_OF = {"fp8_e4m3": "cublas_fp8_e4m3"}
PEERS = report.Peers(BASELINE_OF, SECOND_OF, {"fp8_e4m3": "fp8", "cublas_fp8_e4m3_fastacc": "fp8", "cublas_fp8_e4m3": "fp8"})
BIG, SMALL = "8192x8192x8192", "16x8192x8192"


def tidy_rows() -> pd.DataFrame:
    """Two shapes of one fp8 run: the variant in two tiles (a faster by throughput), both peers."""
    rows = []
    for shape, scale in ((BIG, 1.0), (SMALL, 0.1)):
        for variant, tile, thr in (("fp8_e4m3", "a", 900.0), ("fp8_e4m3", "b", 880.0),
                                   ("cublas_fp8_e4m3_fastacc", "lib", 1000.0), ("cublas_fp8_e4m3", "lib", 800.0)):
            rows.append({"platform": "h200", "point_set": "fp8", "target": "sm_90a", "family": "fp8", "variant": variant,
                         "entry": variant, "dist": "normal", "shape": shape, "tile": tile, "status": "ok",
                         "throughput": thr * scale, "total_rel_fro": 1e-2, "kernel_rel_fro": 1e-3, "total_calc_diff": 1e-4,
                         "kernel_calc_diff": 1e-6, "tol_total_rel_fro": 0.1, "tol_kernel_rel_fro": 0.01})
    return pd.DataFrame(rows)


def pair(df: pd.DataFrame, shape: str, tile: str, prefix: str = "", **cols) -> pd.DataFrame:
    """Write a paired timing's columns on one tile's row, as a GPU job does (None on every other row)."""
    at = (df["variant"] == "fp8_e4m3") & (df["shape"] == shape) & (df["tile"] == tile)
    for k, v in cols.items():
        col = prefix + k
        if col not in df:
            df[col] = pd.Series([None] * len(df), dtype=object)
        df.loc[at, col] = v
    return df


COLD = dict(pair_peer="cublas_fp8_e4m3_fastacc", pair_speedup=1.04, pair_speedup_lo=1.02, pair_speedup_hi=1.06,
            pair_verdict="faster", pair_second="cublas_fp8_e4m3", pair_speedup_vs_second=1.30, pair_speedup_vs_second_lo=1.28,
            pair_speedup_vs_second_hi=1.32, pair_verdict_vs_second="faster", pair_aa_ratio=1.001, pair_aa_lo=0.998,
            pair_aa_hi=1.004, pair_aa_verdict="same", pair_aa_halfwidth=0.003, pair_halfwidth=0.019, pair_rounds=120,
            pair_stop="target", sm_clock_mhz_median=1980.0, sm_clock_mhz_min=1965.0, default_sm_clock_mhz=1980.0,
            throttled=False)


def paired_tidy() -> pd.DataFrame:
    """The big shape paired on tile b (the fastest by median time, not by throughput), with a sustained
    window that reads "same"; the small shape not paired."""
    df = pair(tidy_rows(), BIG, "b", **COLD)
    return pair(df, BIG, "b", "sustained_", pair_peer="cublas_fp8_e4m3_fastacc", pair_speedup=0.995,
                pair_speedup_lo=0.98, pair_speedup_hi=1.01, pair_verdict="same", sm_clock_mhz_median=1410.0, throttled=True,
                settle_s=3.2, settled=True)


def speedups_of(tidy: pd.DataFrame) -> pd.DataFrame:
    return tables.speedups(tables.best_tiles(tidy), BASELINE_OF, SECOND_OF).set_index("shape")


def test_without_pair_columns_the_speedup_is_the_unpaired_throughput_ratio():
    sp = speedups_of(tidy_rows())
    assert sorted(sp.reset_index().columns) == sorted(tables.SPEEDUP_COLUMNS)
    assert sp.loc[BIG, "tile"] == "a" and sp.loc[BIG, "speedup"] == pytest.approx(0.9)
    assert sp.loc[BIG, "speedup_vs_second"] == pytest.approx(1.125)
    assert (sp["speedup_method"] == tables.UNPAIRED).all()
    assert sp[["speedup_lo", "speedup_hi", "verdict", "sustained_speedup", "aa_halfwidth"]].isna().all().all()


def test_paired_ratio_comes_first_and_from_the_points_paired_row():
    sp = speedups_of(paired_tidy())
    big, small = sp.loc[BIG], sp.loc[SMALL]
    # best_tiles keeps tile a (higher throughput); the pair was taken on tile b and belongs to the point
    assert big["tile"] == "a" and big["paired_tile"] == "b"
    assert (big["speedup"], big["speedup_lo"], big["speedup_hi"], big["verdict"]) == (1.04, 1.02, 1.06, "faster")
    assert big["speedup_method"] == tables.PAIRED and big["speedup_unpaired"] == pytest.approx(0.9)
    assert (big["speedup_vs_second"], big["verdict_vs_second"]) == (1.30, "faster")
    assert (big["aa_halfwidth"], big["aa_verdict"], big["pair_rounds"], big["pair_stop"]) == (0.003, "same", 120, "target")
    assert (big["sm_clock_mhz_median"], big["throttled"]) == (1980.0, False)
    assert (big["sustained_speedup"], big["sustained_verdict"], big["sustained_sm_clock_mhz_median"],
            big["sustained_throttled"]) == (0.995, "same", 1410.0, True)
    # the unpaired shape falls back to the throughput ratio, without interval or verdict
    assert small["speedup_method"] == tables.UNPAIRED and small["speedup"] == pytest.approx(0.9)
    assert np.isnan(small["speedup_lo"]) and pd.isna(small["verdict"]) and pd.isna(small["paired_tile"])


def test_a_pair_with_another_peer_or_a_missing_group_is_not_taken():
    df = pair(tidy_rows(), BIG, "a", pair_peer="cublas_bf16", pair_speedup=3.0, pair_speedup_lo=2.9, pair_speedup_hi=3.1,
              pair_verdict="faster")
    sp = speedups_of(df)
    assert sp.loc[BIG, "speedup"] == pytest.approx(0.9) and sp.loc[BIG, "speedup_method"] == tables.UNPAIRED
    # a point paired with its matched peer only (no second baseline there): the second ratio stays unpaired
    df = pair(tidy_rows(), BIG, "a", **{k: v for k, v in COLD.items() if "second" not in k})
    big = speedups_of(df).loc[BIG]
    assert big["speedup"] == 1.04 and big["speedup_vs_second"] == pytest.approx(1.125) and pd.isna(big["verdict_vs_second"])


def test_a_failed_row_carries_no_pair():
    df = paired_tidy()
    df.loc[(df["variant"] == "fp8_e4m3") & (df["tile"] == "b"), "status"] = "failed"
    assert speedups_of(df).loc[BIG, "speedup_method"] == tables.UNPAIRED


def test_power_states_put_cold_and_sustained_side_by_side_and_mark_a_changed_verdict():
    sp = speedups_of(paired_tidy()).reset_index()
    both = tables.power_states(sp)
    assert len(both) == 1 and both.loc[0, "shape"] == BIG
    assert (both.loc[0, "verdict"], both.loc[0, "sustained_verdict"], both.loc[0, "verdicts"]) == ("faster", "same", "differ")
    assert tables.power_states(speedups_of(tidy_rows()).reset_index()).empty


def test_aa_checks_give_the_worst_halfwidth_per_family_and_every_aa_not_same():
    sp = speedups_of(paired_tidy()).reset_index()
    per_family, off = tables.aa_checks(sp)
    assert per_family.to_dict("records") == [{"family": "fp8", "points": 1, "worst_aa_halfwidth": 0.003,
                                              "worst_at": f"fp8_e4m3 normal {BIG}", "aa_not_same": 0}]
    assert off.empty
    sp.loc[sp["shape"] == BIG, ["aa_verdict", "aa_halfwidth"]] = ["slower", 0.02]
    per_family, off = tables.aa_checks(sp)
    assert per_family.loc[0, "aa_not_same"] == 1 and per_family.loc[0, "worst_aa_halfwidth"] == 0.02
    assert list(off["shape"]) == [BIG]


def timed(tidy: pd.DataFrame) -> report.Timed:
    return report.timed_tables({"tidy": tidy, "label": "test set", "roofs": pd.DataFrame()}, PEERS)


def test_at_a_glance_counts_faster_same_slower_per_variant():
    df = pair(paired_tidy(), SMALL, "a", pair_peer="cublas_fp8_e4m3_fastacc", pair_speedup=0.97, pair_speedup_lo=0.95,
              pair_speedup_hi=0.99, pair_verdict="slower")
    df = pd.concat([df, df.assign(dist="student_t3")], ignore_index=True)  # and the same again on a second distribution
    df.loc[(df["dist"] == "student_t3") & (df["shape"] == BIG) & (df["tile"] == "b"), "pair_verdict"] = "same"
    counts = tables.verdict_counts(timed(df).speedups)
    assert counts.to_dict("records") == [{"family": "fp8", "variant": "fp8_e4m3", "faster": 1, "same": 1, "slower": 2,
                                          "unpaired": 0}]
    page = report.at_a_glance_section(tables.accuracy(df), timed(df), PEERS)
    assert all(f">{c}</th>" in page for c in ("faster", "same", "slower", "unpaired"))
    # a set timed before pairing: no verdict columns, the unpaired count says how each ratio was taken
    old = report.at_a_glance_section(tables.accuracy(tidy_rows()), timed(tidy_rows()), PEERS)
    assert ">unpaired</th>" in old and ">faster</th>" not in old
    assert tables.verdict_counts(timed(tidy_rows()).speedups)[["faster", "same", "slower", "unpaired"]].values.tolist() == [
        [0, 0, 0, 2]]


@pytest.mark.parametrize("tidy", [tidy_rows, paired_tidy], ids=["unpaired", "paired"])
def test_figures_and_sections_render_for_both_kinds(tidy):
    t = timed(tidy())
    for fig in (figures.headline_speedup(t.speedups, "headline"), figures.speedup(t.speedups, "speedup")):
        assert isinstance(fig, plt.Figure) and fig.axes and len(fig.axes[0].patches + fig.axes[0].collections) > 0
        plt.close(fig)
    figs = report.Figures({"headline": "h", "speedup": "s"})
    variants = {"fp8_e4m3": SimpleNamespace(kernel=object())}
    page = report.headline_section(t, variants, figs) + report.speedup_section(t, figs)
    assert set(figs.png) == {"headline", "speedup"}
    if tidy is paired_tidy:
        assert "1 ratios are <b>paired</b>" in page and "1 are unpaired" in page
        assert "<h3>Power state</h3>" in page and "<h3>A/A check</h3>" in page and ">1.020<" in page  # speedup_lo
    else:
        assert "All 2 ratios are <b>unpaired</b>" in page and "Power state" not in page and "A/A check" not in page
        assert ">speedup_lo</th>" not in page and "unpaired (separate jobs)" in page
