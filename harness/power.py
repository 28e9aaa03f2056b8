"""The power state of a timed window: SM clock, power and temperature sampled through NVML while the
kernels run, and whether the card throttled.

A power-hungry kernel loses clock as the card heats, so a ratio depends on when it was taken; each
paired window records what the card did during it. Throttled follows nvbench: the window's lowest
SM clock below 75 % of the default clock. NVML is read through pynvml (nvidia-ml-py); where it is not
installed or the driver refuses, the window says so (``clock_source: unavailable``) and ``throttled``
is None, never a guess.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

THROTTLE_FRACTION = 0.75  # nvbench's threshold
SAMPLE_INTERVAL_S = 0.005


@dataclass(frozen=True)
class Sample:
    t: float  # seconds, monotonic
    sm_clock_mhz: float
    power_w: float | None = None
    temp_c: float | None = None


class Nvml:
    """One GPU's NVML handle: its current SM clock, power, temperature, and its default SM clock."""

    def __init__(self, device_index: int = 0):
        import pynvml
        import torch

        self._nvml = pynvml
        pynvml.nvmlInit()
        # CUDA's device order and numbering (CUDA_VISIBLE_DEVICES) need not be NVML's: match by UUID
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        try:
            self.default_sm_clock_mhz = float(pynvml.nvmlDeviceGetDefaultApplicationsClock(self.handle, pynvml.NVML_CLOCK_SM))
            self.default_source = "default applications clock"
        except pynvml.NVMLError:
            self.default_sm_clock_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM))
            self.default_source = "max SM clock"

    def sample(self) -> Sample:
        n = self._nvml
        clock = float(n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM))
        try:
            power = n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        except n.NVMLError:
            power = None
        try:
            temp = float(n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU))
        except n.NVMLError:
            temp = None
        return Sample(time.monotonic(), clock, power, temp)


def open_nvml(device_index: int = 0) -> tuple[Nvml | None, str]:
    """The NVML reader of the GPU torch uses, or None with the reason it cannot be read."""
    try:
        return Nvml(device_index), ""
    except Exception as e:  # ImportError (no pynvml), NVMLError (driver), no CUDA
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def summarize(samples: list[Sample], default_sm_clock_mhz: float | None, why_none: str = "") -> dict:
    """A window's power state: SM clock (median, min), power (median), temperature (max), throttled."""
    if not samples:
        return {"clock_source": f"unavailable ({why_none})" if why_none else "unavailable", "sm_clock_mhz_median": None,
                "sm_clock_mhz_min": None, "default_sm_clock_mhz": default_sm_clock_mhz, "power_w_median": None,
                "gpu_temp_c_max": None, "throttled": None, "clock_samples": 0}
    clocks = [s.sm_clock_mhz for s in samples]
    power = [s.power_w for s in samples if s.power_w is not None]
    temps = [s.temp_c for s in samples if s.temp_c is not None]
    throttled = None if not default_sm_clock_mhz else min(clocks) < THROTTLE_FRACTION * default_sm_clock_mhz
    return {"clock_source": "nvml", "sm_clock_mhz_median": statistics.median(clocks), "sm_clock_mhz_min": min(clocks),
            "default_sm_clock_mhz": default_sm_clock_mhz, "power_w_median": statistics.median(power) if power else None,
            "gpu_temp_c_max": max(temps) if temps else None, "throttled": throttled, "clock_samples": len(samples)}


@dataclass
class Sampler:
    """Samples ``read`` every ``interval_s`` on a thread between ``start`` and ``stop`` (a context
    manager). NVML calls go through ctypes, which releases the GIL: the launching thread is not held up."""
    read: Callable[[], Sample] | None
    interval_s: float = SAMPLE_INTERVAL_S
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        if self.read is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lpgemm-nvml", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self.read())
            except Exception:  # a failed read is a missing sample, not a failed measurement
                pass
            if self._stop.wait(self.interval_s):
                return

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def since(self, t0: float) -> list[Sample]:
        return [s for s in self.samples if s.t >= t0]


def settled(samples: list[Sample], window_s: float, tolerance: float) -> bool:
    """The SM clock has settled: the median clock of the last ``window_s`` differs from that of the window
    before it by at most ``tolerance`` (relative). Needs two full windows of samples."""
    if not samples:
        return False
    end = samples[-1].t
    last = [s.sm_clock_mhz for s in samples if s.t > end - window_s]
    before = [s.sm_clock_mhz for s in samples if end - 2 * window_s < s.t <= end - window_s]
    if not last or not before or samples[0].t > end - 2 * window_s + 0.1 * window_s:
        return False
    a, b = statistics.median(before), statistics.median(last)
    return abs(b - a) <= tolerance * a
