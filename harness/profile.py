"""Nsight Compute profile of one timed point: where a kernel's time goes.

``ncu`` runs a child process (``python -m harness.profile``) that loads the point's inputs, compiles
(or loads from cache) the variant's kernel, calls it once to warm up, then once inside the NVTX range
``NVTX_RANGE``. Only that call is profiled, and of a TileLang variant only its own kernels (by name):
no flush, copy or helper kernel gets into the report. Clocks are left alone (``--clock-control
none``); caches are flushed before every replay pass (ncu's default ``--cache-control all``), as the
pipeline flushes L2 before every timed repetition.

``summarize`` turns ncu's raw page (``ncu --import R --csv --page raw``) into the summary the report
lists: SOL percentages, achieved occupancy, DRAM bytes against the bytes the pipeline counts for the
point, the top warp stall reasons, registers and the kernel names.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys

import pandas as pd

NVTX_RANGE = "lpgemm_profiled"
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis",
            "ComputeWorkloadAnalysis")
# raw metrics the summary reads that the sections above may not collect
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
           "l1tex__throughput.avg.pct_of_peak_sustained_elapsed")
MAX_LAUNCHES = 16  # a variant's call launches a few kernels; more means the filter let others in
# Units whose SOL figure (% of that unit's peak over the kernel's elapsed time) names the limiter: the
# busiest. Below BUSY_PCT of peak in every unit the kernel is latency-bound (ncu's own SOL guidance:
# under 60% points to latency issues).
UNITS = {
    "tensor pipe": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "DRAM": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "L1/shared": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
}
BUSY_PCT = 60.0
FIELDS = {
    "duration_us": "gpu__time_duration.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": UNITS["DRAM"],
    "l2_throughput_pct": UNITS["L2"],
    "l1_throughput_pct": UNITS["L1/shared"],
    "tensor_pipe_pct": UNITS["tensor pipe"],
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "sm_clock_mhz": "gpc__cycles_elapsed.max.per_second",  # the clock it ran at: ncu leaves clocks alone
    "registers_per_thread": "launch__registers_per_thread",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "smem_per_block_bytes": "launch__shared_mem_per_block",
    "waves_per_sm": "launch__waves_per_multiprocessor",
}
_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
# ncu's raw page states each column's unit on its second line; values are scaled to bytes, µs and MHz
_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
          "nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6,
          "hz": 1e-6, "Khz": 1e-3, "Mhz": 1, "Ghz": 1e3}


class ProfileUnavailable(RuntimeError):
    """This host cannot profile: no ncu, or ncu cannot read the GPU's counters."""


def ncu_path() -> str:
    path = shutil.which("ncu")
    if path is None:
        raise ProfileUnavailable("ncu (Nsight Compute) is not on PATH: install the CUDA toolkit's Nsight Compute "
                                 "on the GPU node, or add its folder to PATH")
    return path


def ncu_version(ncu: str) -> str:
    out = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Version (\S+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "?"


def ncu_command(ncu: str, report: str, kernel_names: list[str] | None, child: list[str]) -> list[str]:
    """The ncu command line: profile ``child``'s kernels inside NVTX_RANGE (of those, only ``kernel_names``
    when given), export to ``report`` (.ncu-rep)."""
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
           "--launch-count", str(MAX_LAUNCHES), "--export", report, "--force-overwrite"]
    if kernel_names:
        cmd += ["--kernel-name", "regex:^(" + "|".join(re.escape(k) for k in sorted(kernel_names)) + ")$"]
    for s in SECTIONS:
        cmd += ["--section", s]
    return cmd + ["--metrics", ",".join(METRICS), *child]


def raw_page(ncu: str, report: str) -> str:
    proc = subprocess.run([ncu, "--import", report, "--csv", "--page", "raw"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu --import {report} failed (rc {proc.returncode}): {proc.stderr.strip()[:300]}")
    return proc.stdout


def parse_raw(text: str) -> pd.DataFrame:
    """ncu's raw page as one row per profiled launch: numbers scaled to bytes and µs (percentages, counts
    and ratios as they are), names and other text as strings."""
    df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    if df.empty:
        raise ValueError("the ncu raw page holds no kernel launch")
    units, rows = df.iloc[0], df.iloc[1:].reset_index(drop=True)
    if rows.empty:
        raise ValueError("the ncu raw page holds no kernel launch: no kernel ran in the profiled range, or the "
                         "kernel-name filter matched none")
    out = {}
    for col in df.columns:
        vals = rows[col].str.replace(",", "", regex=False)
        num = pd.to_numeric(vals, errors="coerce")
        if num.notna().all() and (vals != "").all():
            out[col] = num * _SCALE.get(units[col].split("/")[0], 1)  # Mbyte -> bytes, Gbyte/s -> bytes/s, Ghz -> MHz
        else:
            out[col] = rows[col]
    return pd.DataFrame(out)


def limiter(k: dict) -> str:
    """The busiest unit as a share of its peak, or latency when no unit reaches BUSY_PCT."""
    busy = {unit: k[field] for unit, field in
            (("tensor pipe", "tensor_pipe_pct"), ("DRAM", "dram_throughput_pct"), ("L2", "l2_throughput_pct"),
             ("L1/shared", "l1_throughput_pct")) if k.get(field) is not None}
    if not busy:
        return "unknown (no SOL metrics)"
    unit, pct = max(busy.items(), key=lambda kv: kv[1])
    if pct >= BUSY_PCT:
        return f"{unit} ({pct:.0f}% of peak)"
    stall = k["top_stalls"][0]["reason"] if k.get("top_stalls") else "?"
    return f"latency (no unit at {BUSY_PCT:.0f}% of peak; busiest {unit} {pct:.0f}%; top stall {stall})"


def summarize(raw: pd.DataFrame, counted_bytes: float | None, top: int = 3) -> dict:
    """Per launch: SOL %, occupancy, DRAM bytes, the ``top`` stall reasons (warp cycles per issued instruction,
    "selected" excluded: that is issuing), registers, its limiter; over all launches: time, DRAM bytes and
    their ratio to ``counted_bytes`` (what the pipeline counts the point moves: A, B with scales, C)."""
    kernels = []
    for _, r in raw.iterrows():
        k = {"name": r.get("Kernel Name", r.get("launch__kernel_name", "?"))}
        for field, metric in FIELDS.items():
            v = r.get(metric)
            k[field] = None if v is None or isinstance(v, str) else round(v) if field.endswith("_bytes") else float(v)
        stalls = {m.group(1): float(r[c]) for c in raw.columns if (m := _STALL.fullmatch(c)) and not isinstance(r[c], str)}
        stalls.pop("selected", None)
        k["top_stalls"] = [{"reason": s, "cycles_per_issue": round(v, 3)}
                           for s, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:top]]
        k["limiter"] = limiter(k)
        kernels.append(k)
    read = sum(k["dram_read_bytes"] or 0 for k in kernels)
    write = sum(k["dram_write_bytes"] or 0 for k in kernels)
    main = max(kernels, key=lambda k: k["duration_us"] or 0)
    return {
        "kernel_names": sorted({k["name"] for k in kernels}),
        "launches": len(kernels),
        "duration_us": sum(k["duration_us"] or 0 for k in kernels),
        "dram_read_bytes": read, "dram_write_bytes": write,
        "counted_bytes": counted_bytes,
        "dram_over_counted": (read + write) / counted_bytes if counted_bytes else None,
        "limiter": main["limiter"], "main_kernel": main["name"],
        "kernels": kernels,
    }


def _child(argv: list[str]) -> None:
    """Run inside ncu: warm up once, then one call of the variant inside NVTX_RANGE."""
    import torch

    from harness.compile import build
    from harness.inputs import load_point
    from harness.runner import prepared
    from kernels.registry import get_variant, load_all
    from kernels.tiles import parse_shape, parse_tile

    ap = argparse.ArgumentParser(prog="python -m harness.profile")
    for name in ("variant", "shape", "tile", "arch", "fp32", "formats", "manifest"):
        ap.add_argument(f"--{name}", required=True)
    a = ap.parse_args(argv)
    load_all()
    variant = get_variant(a.variant)
    _, ops, _ = load_point(a.fp32, a.formats, a.manifest, variant.input_format)
    dev = {k: v.cuda() for k, v in ops.items()}
    kernel = build(variant, *parse_shape(a.shape), parse_tile(a.tile), a.arch) if variant.kernel is not None else None
    run_ops = prepared(variant, dev)
    variant.launch(kernel, run_ops)  # first call: module load, lazy init; not profiled
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    variant.launch(kernel, run_ops)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    _child(sys.argv[1:])
    print(json.dumps({"profiled": True}))
