"""The catalogue: input formats and GEMM variants, found by name.

A *format* turns the unquantized float32 operands A (M,K) and B (N,K) into a variant's operands
(quantized tensors plus scales) and back into float64 (for the kernel-error reference).
A *variant* is one GEMM implementation: a TileLang kernel (``kernel`` set) or a library baseline
(``kernel`` None); each has a CPU emulation of its arithmetic, so every host gets its numerics.
Family modules (``fp8``, ``int4``, ...) register theirs at import; ``load_all`` imports them.

``python -m kernels.registry list`` names every variant, family and library peer; ``python -m
kernels.registry describe <variant>`` says where each part of one variant is written (file:line) and
which Snakemake rules and result files the config gives it.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import functools
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
    # a library whose prepare compiles its kernels for each shape (a JIT: seconds of CPU per shape while the
    # GPU waits), so that its GPU job is best run when no other is ready
    prepare_compiles: bool = False
    # such a library's compiles made ahead for all of a job's shapes (M, N, K) at once, on the host's cores: a
    # warm-up of the library's own caches (untimed), after which prepare finds what it would have compiled
    precompile: Callable[[list[tuple[int, int, int]]], None] | None = None
    # (M, N, K) -> why this shape cannot run (e.g. a library's alignment rule), or None
    shape_limit: Callable[[int, int, int], str | None] | None = None
    # tile -> why this variant's kernel cannot take it, or None; None here: plain tiles only (no
    # ``_p`` promotion, no ``_swapab``), since a kernel that ignored them would mislabel its rows
    tile_check: Callable[[object], str | None] | None = None
    # whether its kernel takes ``_split<n>`` tiles (K split over n CTAs, reduced in the kernel); any other
    # variant refuses them, whatever its tile_check says
    split_k: bool = False
    # the tiles its kernel can take (kernels/tile_space.py): what the tile selection ranks and the tune
    # step times; None: its tiles come from config.yaml only
    tile_space: object | None = None
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


def register(*, name: str, family: str, input_format: str, emulate: Callable, launch: Callable, **fields) -> Variant:
    """Register one variant, given by keyword (``fields``: the other fields of ``Variant``), and return it.

    The one way a family module registers: write ``name`` as a string literal at the call, so that
    ``grep -rn '"<name>"' kernels/`` lands on it (tests/test_registry_cli.py checks)."""
    return register_variant(Variant(name=name, family=family, input_format=input_format, emulate=emulate,
                                    launch=launch, **fields))


def refuse_shape(limit: Callable[[int, int, int], str | None], M: int, N: int, K: int, who: str | None = None) -> None:
    """Raise ``limit``'s reason for (M, N, K) (after ``who``, when given) as Unsupported: a kernel factory
    refusing what its variant's declared ``shape_limit`` rules out, so the two never drift apart."""
    if reason := limit(M, N, K):
        raise Unsupported(f"{who}: {reason}" if who else reason)


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
    if tile.split_k > 1 and not variant.split_k:
        return f"{variant.name}'s kernel does not split K: no _split<n> tiles"
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


# ---------------------------------------------------------------------------------------------
# python -m kernels.registry list | describe <variant>: where a variant's parts are written
# ---------------------------------------------------------------------------------------------

KERNELS = Path(__file__).resolve().parent
REPO = KERNELS.parent
# the Snakemake rules a config entry gets, as workflow/rules/{compile,run,inputs}.smk name them, and the
# input file a build_inputs rule writes per format (tests/test_registry_cli.py holds them to those files)
ENTRY_RULES = {"compile": "compile_{entry}", "sweep": "compile_{entry}_sweep", "run": "run_{entry}",
               "emulate": "emulate_{entry}", "inputs": "build_inputs_{name}"}
INPUT_FILE = "results/inputs/{dist}/{shape}/formats/{fmt}.pt"


def _unwrap(fn) -> tuple[Callable, dict]:
    """A callable without its functools.partial layers, and the keywords they bind."""
    keywords: dict = {}
    while hasattr(fn, "func"):
        keywords = {**fn.keywords, **keywords}
        fn = fn.func
    return fn, keywords


def _relative(path: Path | str) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def source_line(fn: Callable) -> str:
    """``path:line`` (relative to the repository) where ``fn`` (partials unwrapped) is defined, then its name
    and the keywords a partial binds, e.g. ``kernels/fp8_pipelined.py:22 fp8_pipelined_kernel(in_dtype='float8_e5m2')``."""
    func, keywords = _unwrap(fn)
    where = f"{_relative(inspect.getsourcefile(func))}:{inspect.getsourcelines(func)[1]}"
    bound = ", ".join(f"{k}={getattr(v, 'name', v)!r}" for k, v in keywords.items())
    return f"{where} {func.__qualname__}" + (f"({bound})" if bound else "")


@functools.cache
def registration_sites() -> dict[str, str]:
    """Variant name -> ``path:line`` of the ``register(name="<variant>", ...)`` call that registers it, read
    from kernels/*.py with ``ast`` (never run); the line of the name's literal, where grep finds it."""
    sites = {}
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            called = getattr(node, "func", None)
            if not isinstance(node, ast.Call) or getattr(called, "id", getattr(called, "attr", None)) != "register":
                continue
            for kw in node.keywords:
                value = kw.value.value if isinstance(kw.value, ast.NamedExpr) else kw.value
                if kw.arg == "name" and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    sites[value.value] = f"{_relative(path)}:{value.lineno}"
    return sites


def format_site(fmt: Format) -> str:
    """``path:line`` of a format's name, written once as a literal in the module that defines its quantizer."""
    path = Path(inspect.getsourcefile(_unwrap(fmt.quantize)[0]))
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if f'"{fmt.name}"' in line:
            return f"{_relative(path)}:{number}"
    return _relative(path)


def kernel_module(v: Variant) -> str:
    """The file of a variant's kernel factory, or "library peer"."""
    return _relative(inspect.getsourcefile(_unwrap(v.kernel)[0])) if v.kernel is not None else "library peer"


def braced(paths: list[str]) -> list[str]:
    """``paths`` written shell-style, with braces where they differ (``results/cpu/x/{normal,student_t3}/a.json``;
    bash expands each line back into its paths), in their order."""
    def parts(p: str) -> tuple[str, ...]:
        *folders, name = p.split("/")
        stem, dot, ext = name.partition(".")
        return (*folders, stem, *([dot + ext] if dot else []))

    def render(rows: list[tuple[str, ...]]) -> list[str]:
        children: dict[str, list[tuple[str, ...]]] = {}
        for row in rows:
            children.setdefault(row[0], []).append(row[1:])
        alike: dict[tuple[str, ...], list[str]] = {}  # the heads whose subtrees read the same
        for head, tails in children.items():
            alike.setdefault(tuple(render([t for t in tails if t])), []).append(head)
        out = []
        for tails, heads in alike.items():
            head = heads[0] if len(heads) == 1 else "{" + ",".join(heads) + "}"
            out += [head + ("" if t.startswith(".") else "/") + t for t in tails] or [head]
        return out

    return render([parts(p) for p in dict.fromkeys(paths)])


def _peer_line(role: str, name: str | None) -> list[str]:
    if name is None:
        return [f"{role:<17} none"]
    peer = VARIANTS[name]
    what = f"kernel {source_line(peer.kernel)}" if peer.kernel is not None else f"library peer, launch {source_line(peer.launch)}"
    return [f"{role:<17} {name} ({what})"]


def _entry_lines(v: Variant, plan) -> list[str]:
    """The rules and result files of every config entry that runs ``v`` (``plan``: a harness.plan.Plan of
    every platform that can be planned)."""
    entries = [e for e in plan.entries if plan.impl(e).name == v.name]
    if not entries:
        return ["config entries    none: config.yaml's variants runs no entry of it"]
    gpus = [p for p in plan.run_on if p != "cpu"]
    lines = []
    for e in entries:
        rules: dict[str, list[str]] = {}
        if plan.is_tilelang(e):
            check = plan.compile_outputs("cpu", [e])
            rules[ENTRY_RULES["compile"].format(entry=e)] = check
            sweep = [r for p in gpus for r in plan.compile_outputs(p, [e]) if r not in check]
            rules[ENTRY_RULES["sweep"].format(entry=e)] = sweep
        rules[ENTRY_RULES["run"].format(entry=e)] = [r for p in gpus for r in plan.run_outputs(p, [e])]
        rules[ENTRY_RULES["emulate"].format(entry=e)] = plan.run_outputs("cpu", [e])
        shapes = set(plan.variant_shapes(e, "cpu")) | set(plan.variant_shapes(e, "gpu"))
        for name, (formats, members) in plan.input_sets().items():
            if v.input_format in formats and shapes & set(members):
                rules[ENTRY_RULES["inputs"].format(name=name)] = [
                    INPUT_FILE.format(dist=d, shape=s, fmt=v.input_format)
                    for d in plan.variant_dists(e) for s in members if s in shapes]
        lines.append(f"config entry      {e}" + (f" (uses {v.name})" if e != v.name else ""))
        for rule, outputs in rules.items():
            for i, path in enumerate(braced(outputs) or ["(none planned)"]):
                lines.append(f"  {rule if i == 0 else '':<32} {path}")
    return lines


def describe(name: str, plan=None, unplanned: dict[str, str] | None = None) -> list[str]:
    """What ``python -m kernels.registry describe <name>`` prints: where each part of the variant is written
    (``path:line``), its input format and quantizer, its peers and, given ``plan`` and ``unplanned``
    (``workflow_plan()``), the Snakemake rules and result files of every config entry that runs it."""
    v = get_variant(name)
    fmt = get_format(v.input_format)

    def part(label: str, fn: Callable | None, missing: str = "none") -> str:
        return f"{label:<17} {source_line(fn) if fn is not None else missing}"

    lines = [
        f"{v.name}: {v.description}",
        f"{'family':<17} {v.family}",
        f"{'registered':<17} {registration_sites().get(v.name, 'not by register(name=...) in kernels/')}",
        part("kernel factory", v.kernel, "none: a library peer, timed through its launch"),
        part("launch", v.launch),
        part("prepare", v.prepare),
        part("emulation", v.emulate),
        part("exact reference", v.exact_reference),
        part("shape limit", v.shape_limit),
        part("tile check", v.tile_check, "the default: plain tiles only (the factory checks the rest)" if v.kernel is not None else "none"),
        part("self checks", v.self_checks),
        f"{'input format':<17} {fmt.name} {format_site(fmt)}",
        part("quantizer", fmt.quantize),
        *_peer_line("matched peer", v.baseline),
        *_peer_line("second baseline", v.second_baseline),
    ]
    users = [f"{u.name} ({role})" for u in VARIANTS.values()
             for role, peer in (("matched", u.baseline), ("second", u.second_baseline)) if peer == v.name]
    lines.append(f"{'peer of':<17} {', '.join(users) or 'none'}")
    if plan is not None:
        lines += _entry_lines(v, plan)
        lines += [f"{'not planned':<17} {p}: {why}" for p, why in (unplanned or {}).items()]
    return lines


def listing() -> list[str]:
    """What ``python -m kernels.registry list`` prints: every variant (name, family, kernel module or
    "library peer"), every family (its modules and variants) and every library peer (whom it serves)."""
    load_all()
    sites = registration_sites()
    width = max(map(len, VARIANTS))
    lines = [f"variants ({len(VARIANTS)}): name, family, kernel module"]
    lines += [f"  {v.name:<{width}} {v.family:<12} {kernel_module(v)}" for v in VARIANTS.values()]
    families: dict[str, list[Variant]] = {}
    for v in VARIANTS.values():
        families.setdefault(v.family, []).append(v)
    lines.append(f"families ({len(families)}): registered in, variants")
    for family, members in families.items():
        homes = sorted({sites[v.name].rpartition(":")[0] for v in members if v.name in sites})
        lines.append(f"  {family:<12} {', '.join(homes)}: {', '.join(v.name for v in members)}")
    peers = [v for v in VARIANTS.values() if v.kernel is None]
    lines.append(f"peers ({len(peers)}): library calls, launched from")
    for v in peers:
        users = [u.name for u in VARIANTS.values() if v.name in (u.baseline, u.second_baseline)]
        lines.append(f"  {v.name:<{width}} {source_line(v.launch)}; peer of {', '.join(users) or 'none'}")
    return lines


def workflow_plan(config: Path | str = REPO / "config.yaml") -> tuple[object, dict[str, str]]:
    """The config's plan (a harness.plan.Plan) over every platform that can be planned, whatever this host is,
    and why any other cannot be. harness is imported here only, by importlib rather than an import statement:
    harness.deps counts every import statement of a file as code its users run, and no job runs this CLI."""
    plan = importlib.import_module("harness.plan")
    ConfigError, Plan = plan.ConfigError, plan.Plan

    cfg = plan.validate(plan.load_config_text(config), check_shapes=False)
    platforms, unplanned = ["cpu"], {}
    for p in cfg["platforms"]:
        try:
            Plan(dict(cfg, run_on=["cpu", p]))
            platforms.append(p)
        except ConfigError as e:
            unplanned[p] = " ".join(str(e).split("\n")[1:]).strip()
    return Plan(dict(cfg, run_on=platforms)), unplanned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.registry", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every variant, family and library peer")
    one = sub.add_parser("describe", help="where a variant's parts are written, its rules and result files")
    one.add_argument("variant")
    one.add_argument("--config", default=str(REPO / "config.yaml"), help="the config whose entries to plan")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(listing()))
        return 0
    try:
        get_variant(args.variant)
    except UnknownName as e:
        print(e, file=sys.stderr)
        return 2
    print("\n".join(describe(args.variant, *workflow_plan(args.config))))
    return 0


if __name__ == "__main__":
    # run as a script this file is __main__, a second copy: the tables the family modules fill are the
    # imported module's, so its main runs
    from kernels.registry import main as _main

    sys.exit(_main())
