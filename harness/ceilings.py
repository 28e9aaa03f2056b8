"""Library probes measured in the same run as the kernels: copy bandwidth and a large library GEMM per
precision. They are measured references, not limits: a kernel may beat them. The physical limits (the
datasheet's dense peaks and HBM bandwidth) come from the config's ``platforms`` section, and the
measured best of a precision is the faster of these probes and every kernel of that run."""
from __future__ import annotations

import torch

from harness import bench

PEAK_SHAPE = 8192  # M = N = K for the peak-matmul probes


def _copy_bandwidth(reps: int) -> dict:
    n_bytes = 1 << 30
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    t = bench.time_cuda(lambda: dst.copy_(src), reps=reps)
    return {"value": 2 * n_bytes / (t["time_ms_median"] * 1e-3) / 1e12, "unit": "TB/s",
            "how": "device-to-device copy of 1 GiB (read + write)", "precision": "memory"}


def measure_ceilings(reps: int = 30) -> dict:
    """{name: {value, unit, how[, precision]}}; every value is a median over ``reps`` L2-flushed repetitions."""
    out: dict = {"copy_bandwidth": _copy_bandwidth(reps)}
    n = PEAK_SHAPE
    flops = 2.0 * n ** 3
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = bench.time_cuda(lambda: a @ b.T, reps=reps)
    out["bf16_matmul"] = {"value": flops / (t["time_ms_median"] * 1e-3) / 1e12, "unit": "TFLOP/s",
                          "how": f"cuBLAS bf16 {n}^3 A·Bᵀ", "precision": "bf16"}
    if torch.cuda.get_device_capability() >= (8, 9):
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        t = bench.time_cuda(lambda: torch._scaled_mm(a8, b8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                      use_fast_accum=True), reps=reps)
        out["fp8_matmul"] = {"value": flops / (t["time_ms_median"] * 1e-3) / 1e12, "unit": "TFLOP/s",
                             "how": f"cuBLASLt e4m3 {n}^3 A·Bᵀ, fast accumulation", "precision": "fp8"}
    i8a = torch.randint(-8, 8, (n, n), device="cuda", dtype=torch.int8)
    i8b = torch.randint(-8, 8, (n, n), device="cuda", dtype=torch.int8)
    t = bench.time_cuda(lambda: torch._int_mm(i8a, i8b.T), reps=reps)
    out["int8_matmul"] = {"value": flops / (t["time_ms_median"] * 1e-3) / 1e12, "unit": "TOPS",
                          "how": f"torch._int_mm int8 {n}^3", "precision": "int8"}
    return out
