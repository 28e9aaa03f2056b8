"""harness/compare.py: two runs' tables side by side (rows, statuses, paired ratios and what moved)."""
import pandas as pd
import pytest

from harness.compare import compare, main


def _row(shape, tile, status="ok", ratio=None, halfwidth=0.005, variant_ms=1.0, peer="cublas_bf16"):
    row = {"target": "sm_90a", "entry": "dequant_w4_mxfp4", "dist": "normal", "shape": shape, "tile": tile,
           "status": status}
    if ratio is not None:
        row |= {"pair_speedup": ratio, "pair_speedup_lo": ratio - halfwidth, "pair_speedup_hi": ratio + halfwidth,
                "pair_peer": peer, "pair_variant_ms": variant_ms, "pair_baseline_ms": ratio * variant_ms}
    return row


def test_rows_statuses_and_ratios_are_matched_and_what_moved_is_named():
    a = pd.DataFrame([_row("16x8192x8192", "t1", ratio=1.50), _row("64x8192x8192", "t1", ratio=1.20),
                      _row("128x8192x8192", "t1", status="failed"), _row("1x8192x8192", None)])
    b = pd.DataFrame([_row("16x8192x8192", "t1", ratio=1.44), _row("64x8192x8192", "t1", ratio=1.203),
                      _row("128x8192x8192", "t1"), _row("256x8192x8192", "t1", ratio=1.0),
                      _row("1x8192x8192", None)])  # a missing tile matches a missing tile
    diff = compare(a, b)
    assert diff["only_a"].empty and diff["only_b"]["shape"].tolist() == ["256x8192x8192"]
    assert diff["status"][["shape", "status_a", "status_b"]].values.tolist() == [["128x8192x8192", "failed", "ok"]]
    r = diff["ratios"].set_index("shape")
    assert sorted(r.index) == ["16x8192x8192", "64x8192x8192"] and set(r["which"]) == {"cold"}
    assert r.loc["16x8192x8192", "change"] == pytest.approx(-0.04) and not r.loc["16x8192x8192", "overlap"]
    assert r.loc["64x8192x8192", "overlap"]
    # the variant's time stayed, the peer's moved: a host difference, not the kernel
    assert r.loc["16x8192x8192", "variant_ms_change"] == 0 and r.loc["16x8192x8192", "peer_ms_change"] < -0.03


def test_the_command_exits_1_where_rows_or_statuses_differ_and_names_a_wrong_file(tmp_path, capsys):
    a, b, out = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "ratios.csv"
    pd.DataFrame([_row("16x8192x8192", "t1", ratio=1.5)]).to_csv(a, index=False)
    pd.DataFrame([_row("16x8192x8192", "t1", ratio=1.497)]).to_csv(b, index=False)
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert "intervals overlap: 1" in capsys.readouterr().out and len(pd.read_csv(out)) == 1
    pd.DataFrame([_row("16x8192x8192", "t1", status="failed")]).to_csv(b, index=False)
    assert main([str(a), str(b)]) == 1
    pd.DataFrame({"x": [1]}).to_csv(b, index=False)
    with pytest.raises(SystemExit):
        main([str(a), str(b)])
    assert "not a run's table (no column target" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(tmp_path / "none.csv")])
    assert "none.csv: no such file" in capsys.readouterr().err
