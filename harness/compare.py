"""Two runs' tables side by side: did a rerun (another host, a resumed run, a later commit) measure the same?

    python -m harness.compare results/published/h200/tidy.csv results/h200/tidy.csv [--out diff.csv]

Rows are matched by (target, entry, distribution, shape, tile). The summary says which rows only one run has,
which changed status, and for every paired ratio (cold and sustained) both values, their relative change and
whether the two intervals overlap; then, per peer, how much the peer's own time and the variant's moved, which
tells a host difference (a bandwidth-bound library GEMM faster on one host) from a change of the kernel
(docs/methodology.md: What an interval covers). Exit status 1 where rows or statuses differ, else 0: ratios
are reported, not judged, since across hosts they move by more than their intervals.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

KEY = ["target", "entry", "dist", "shape", "tile"]
RATIOS = ("pair_speedup", "sustained_pair_speedup")
_TIMES = {"pair_speedup": ("pair_variant_ms", "pair_baseline_ms"),
          "sustained_pair_speedup": ("sustained_pair_variant_ms", "sustained_pair_baseline_ms")}


def _keyed(t: pd.DataFrame) -> pd.DataFrame:
    t = t.copy()
    t["tile"] = t["tile"].fillna("").astype(str)
    return t


def compare(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``only_a``, ``only_b``: rows one run lacks; ``status``: rows whose status differs; ``ratios``: one row per
    paired ratio both runs have (``which``: cold or sustained), with both values, ``change`` (b / a - 1),
    ``overlap`` (the intervals meet), and the relative change of the variant's and the peer's times."""
    a, b = _keyed(a), _keyed(b)
    m = a.merge(b, on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    only = {side: m.loc[m["_merge"] == f"{side}_only", KEY].reset_index(drop=True)
            for side in ("left", "right")}
    both = m[m["_merge"] == "both"]
    status = both.loc[both["status_a"] != both["status_b"], KEY + ["status_a", "status_b"]].reset_index(drop=True)
    ratios = []
    for name in RATIOS:
        if f"{name}_a" not in both or f"{name}_b" not in both:
            continue
        r = both[both[f"{name}_a"].notna() & both[f"{name}_b"].notna()]
        variant_ms, peer_ms = _TIMES[name]
        ratios.append(pd.DataFrame({
            **{k: r[k] for k in KEY},
            "which": "sustained" if name.startswith("sustained") else "cold",
            "peer": r.get(f"{name.replace('speedup', 'peer')}_a"),
            "a": r[f"{name}_a"], "b": r[f"{name}_b"],
            "change": r[f"{name}_b"] / r[f"{name}_a"] - 1,
            "overlap": (r[f"{name}_lo_a"] <= r[f"{name}_hi_b"]) & (r[f"{name}_lo_b"] <= r[f"{name}_hi_a"]),
            "variant_ms_change": r[f"{variant_ms}_b"] / r[f"{variant_ms}_a"] - 1,
            "peer_ms_change": r[f"{peer_ms}_b"] / r[f"{peer_ms}_a"] - 1,
        }))
    columns = KEY + ["which", "peer", "a", "b", "change", "overlap", "variant_ms_change", "peer_ms_change"]
    ratios = pd.concat(ratios, ignore_index=True) if ratios else pd.DataFrame(columns=columns)
    return {"only_a": only["left"], "only_b": only["right"], "status": status, "ratios": ratios}


def summary(diff: dict[str, pd.DataFrame], a_name: str = "a", b_name: str = "b") -> str:
    r = diff["ratios"]
    lines = [f"rows only in {a_name}: {len(diff['only_a'])}; only in {b_name}: {len(diff['only_b'])}; "
             f"status differs: {len(diff['status'])}"]
    for label in ("only_a", "only_b", "status"):
        if len(diff[label]):
            lines.append(diff[label].head(20).to_string(index=False))
    lines.append(f"paired ratios in both: {len(r)}; intervals overlap: {int(r['overlap'].sum())}; "
                 f"|change| <= 1 %: {int((r['change'].abs() <= 0.01).sum())}")
    if len(r):
        per_peer = r.groupby("peer", dropna=False).agg(
            ratios=("change", "size"), ratio_change=("change", "median"),
            variant_ms_change=("variant_ms_change", "median"), peer_ms_change=("peer_ms_change", "median"))
        lines.append("medians per peer (b / a - 1):")
        lines.append(per_peer.to_string(float_format=lambda x: f"{x:+.2%}"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="a run's tidy.csv (the reference)")
    ap.add_argument("b", type=Path, help="another run's tidy.csv")
    ap.add_argument("--out", type=Path, help="write every paired ratio of both runs here (csv)")
    args = ap.parse_args(argv)
    tables = []
    for path in (args.a, args.b):
        if not path.is_file():
            ap.error(f"{path}: no such file (a run's table is results/<platform>/tidy.csv)")
        tables.append(pd.read_csv(path))
        if missing := [c for c in KEY + ["status"] if c not in tables[-1]]:
            ap.error(f"{path}: not a run's table (no column {', '.join(missing)})")
    diff = compare(*tables)
    print(summary(diff, str(args.a), str(args.b)))
    if args.out is not None:
        diff["ratios"].to_csv(args.out, index=False)
    return 1 if len(diff["only_a"]) or len(diff["only_b"]) or len(diff["status"]) else 0


if __name__ == "__main__":
    sys.exit(main())
