"""The catalogue: input formats and GEMM variants, found by name.

A *format* turns the unquantized float32 operands A (M,K) and B (N,K) into a variant's operands
(quantized tensors plus scales) and back into float64 (for the kernel-error reference).
A *variant* is one GEMM implementation: a TileLang kernel (``kernel`` set) or a library baseline
(``kernel`` None); each has a CPU emulation of its arithmetic, so every host gets its numerics.
Family modules (``fp8``, ``int4``, ...) register theirs at import; ``load_all`` imports them.
"""
from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Operands = dict[str, torch.Tensor]


class Unsupported(Exception):
    """A known refusal, never a failure in disguise: a declared arch rule, a library's documented shape
    limit, or TileLang's refusal of a dtype for a target. The message says which and why."""

FAMILY_MODULES = ("kernels.baselines", "kernels.fp8", "kernels.int4", "kernels.blockscaled", "kernels.dequant")


@dataclass(frozen=True)
class Format:
    name: str
    # (A, B) float32 on CPU -> operands; deterministic (no randomness)
    quantize: Callable[[torch.Tensor, torch.Tensor], Operands]
    # operands -> (A_hat (M,K), B_hat (N,K)) float64: what the kernel actually multiplies
    dequantize: Callable[[Operands], tuple[torch.Tensor, torch.Tensor]]
    # the stored tensors a kernel on this format reads (its compulsory memory traffic); other stored
    # tensors (e.g. a transposed copy of the scales kept for another consumer) are not counted
    reads: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Variant:
    name: str  # also its rule suffix and its results folder
    family: str  # fp8 | int4 | blockscaled | dequant
    input_format: str
    # CPU emulation of the variant's arithmetic: operands -> output (M, N)
    emulate: Callable[[Operands], torch.Tensor]
    # GPU: (compiled kernel or None, prepared operands on the GPU) -> output (M, N); the timed call,
    # so it must launch nothing but the variant's own kernels
    launch: Callable[[object, Operands], torch.Tensor]
    # once per input set, untimed: helper work on the GPU operands (scale products, layout changes)
    # -> extra operands ``launch`` reads; done with the operands, never inside the timed window
    prepare: Callable[[Operands], Operands] | None = None
    # TileLang kernel factory (M, N, K, tile) -> PrimFunc; None for a library baseline. It refuses M, N or
    # K <= 0 with a ValueError naming the dimension (kernels.formats.check_gemm_shape)
    kernel: Callable | None = None
    out_idx: tuple[int, ...] = ()
    # arch -> regex that must appear in the generated CUDA source (a silent fallback fails loudly)
    instructions: dict[str, str] = field(default_factory=dict)
    # arch -> regex one tensor-core opcode of the kernel's SASS must match in full, modifiers included
    # (``QGMMA.64x128x32.F32.E4M3.E4M3``): what ptxas emitted, checked before the source
    sass: dict[str, str] = field(default_factory=dict)
    # arch -> reason the variant cannot build there (recorded as unsupported, not attempted)
    unsupported: dict[str, str] = field(default_factory=dict)
    # TileLang pass configs per arch, e.g. disabling warp specialization: a dict, or a function of the
    # tile (a kernels.tiles.Tile) giving one, when the tile selects the kernel's form
    pass_configs: dict[str, dict | Callable[[object], dict]] = field(default_factory=dict)
    # integer GEMMs: operands -> int64 reference the output must equal bit for bit
    exact_reference: Callable[[Operands], torch.Tensor] | None = None
    # output -> float64 in the units of A·Bᵀ (e.g. an int32 product times s_a·s_b); None: as is
    to_real: Callable[[torch.Tensor, Operands], torch.Tensor] | None = None
    # extra correctness checks run before timing: (launch_fn(ops)->out, M, N, K, device) -> {name: ok}
    self_checks: Callable | None = None
    ops_unit: str = "TFLOP/s"
    # the tensor-core precision its throughput is bounded by (a key of the platform's datasheet peaks)
    precision: str = "bf16"
    # the matched peer: the library variant with the same accumulation semantics (e.g. fp8 without
    # promotion against cuBLAS fast accumulation); the speedup is taken against it
    baseline: str | None = None
    # a second library variant reported beside the matched peer (another column, never the headline)
    second_baseline: str | None = None
    # run time: (regex on the library's error message, what it means) for the documented refusals of
    # a library call; a matching error is unsupported with the library's message, any other is failed
    run_refusals: tuple[tuple[str, str], ...] = ()
    # minimum arch (compute capability) for a library baseline to run, e.g. 89 for fp8
    min_cc: int = 0
    # (M, N, K) -> why this shape cannot run (e.g. a library's alignment rule), or None
    shape_limit: Callable[[int, int, int], str | None] | None = None
    # tile -> why this variant's kernel cannot take it, or None; None here: plain tiles only (no
    # ``_p`` promotion, no ``_swapab``), since a kernel that ignored them would mislabel its rows
    tile_check: Callable[[object], str | None] | None = None
    description: str = ""


FORMATS: dict[str, Format] = {}
VARIANTS: dict[str, Variant] = {}


def register_format(fmt: Format) -> Format:
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} registered twice")
    FORMATS[fmt.name] = fmt
    return fmt


def register_variant(v: Variant) -> Variant:
    if v.name in VARIANTS:
        raise ValueError(f"variant {v.name!r} registered twice")
    VARIANTS[v.name] = v
    return v


def load_all() -> None:
    for mod in FAMILY_MODULES:
        importlib.import_module(mod)


class UnknownName(KeyError):
    """A name no variant (or format) is registered under; a KeyError whose message reads as written."""

    def __str__(self) -> str:  # KeyError's own str() would show the message as a quoted repr
        return str(self.args[0]) if self.args else ""


def _lookup(table: dict, what: str, name: str):
    load_all()
    if not isinstance(name, str):
        hint = f"; pass its .name, {name.name!r}" if isinstance(getattr(name, "name", None), str) else ""
        raise TypeError(f"look up the {what} by its name (a str), got {type(name).__name__}{hint}")
    try:
        return table[name]
    except KeyError:
        pass
    hints = []
    if table is FORMATS and name in VARIANTS:
        hints.append(f"{name!r} is a variant; its input format is {VARIANTS[name].input_format!r}")
    elif table is VARIANTS and name in FORMATS:
        users = sorted(v.name for v in VARIANTS.values() if v.input_format == name)
        hints.append(f"{name!r} is an input format; its variants: {', '.join(users)}")
    else:
        close = difflib.get_close_matches(name, table, n=3)
        if close:
            hints.append(f"did you mean {' or '.join(map(repr, close))}?")
    raise UnknownName(f"unknown {what} {name!r}; " + "".join(h + "; " for h in hints) + f"known: {', '.join(sorted(table))}")


def get_variant(name: str) -> Variant:
    return _lookup(VARIANTS, "variant", name)


def unchecked_targets(variant: Variant, targets: list[str]) -> list[str]:
    """The targets a TileLang variant would compile for with nothing to prove its instructions: no declared
    unsupported reason, and no SASS or no source instruction check. Library baselines compile nothing: []."""
    if variant.kernel is None:
        return []
    return [t for t in targets if t not in variant.unsupported and (t not in variant.instructions or t not in variant.sass)]


def tile_problem(variant: Variant, tile) -> str | None:
    """Why ``tile`` (a kernels.tiles.Tile) is not one ``variant``'s kernel takes, or None; checked with the config."""
    if variant.tile_check is not None:
        return variant.tile_check(tile)
    if tile.promote or tile.swap_ab:
        return f"{variant.name}'s kernel takes plain tiles only: no _p<n> (promotion) and no _swapab"
    return None


def pass_configs_for(variant: Variant, arch: str, tile) -> dict | None:
    """The TileLang pass configs ``variant`` compiles ``tile`` with for ``arch`` (None: TileLang's defaults)."""
    configs = variant.pass_configs.get(arch)
    if callable(configs):
        configs = configs(tile)
    return configs or None


def get_format(name: str) -> Format:
    return _lookup(FORMATS, "input format", name)


def bytes_moved(per_element: tuple, M, N, K):
    """The bytes a GEMM reads and writes once each: A (M,K), B (N,K) with their scales, C (M,N), from
    ``bytes_per_element``'s (a, b, c); M, N, K may be numbers or pandas columns."""
    a, b, c = per_element
    return M * K * a + N * K * b + M * N * c


@functools.cache
def bytes_per_element(variant_name: str, K: int = 512) -> tuple[float, float, float]:
    """Bytes per element of A and of B (scales included) that the kernel reads, and of C it writes.
    A pure function of the registered variant, so computed once per process.

    Only the tensors the format names in ``reads`` count. Measured by quantizing two small problems
    that differ in M and N only (bytes = a·M·K + b·N·K), so packing and scale layouts are accounted
    for without per-format arithmetic.
    """
    v = get_variant(variant_name)
    fmt = get_format(v.input_format)
    if not fmt.reads:
        raise ValueError(f"format {fmt.name!r} does not name the tensors its kernels read (Format.reads)")
    g = torch.Generator().manual_seed(0)

    def total(M: int, N: int) -> tuple[int, torch.Tensor]:
        ops = fmt.quantize(torch.randn(M, K, generator=g), torch.randn(N, K, generator=g))
        missing = set(fmt.reads) - set(ops)
        if missing:
            raise ValueError(f"format {fmt.name!r} reads {sorted(missing)}, which its quantize does not produce")
        return sum(ops[k].numel() * ops[k].element_size() for k in fmt.reads), v.emulate(ops)

    t1, out = total(64, 64)
    t2, _ = total(128, 64)
    t3, _ = total(64, 128)
    return (t2 - t1) / (64 * K), (t3 - t1) / (64 * K), float(out.element_size())
