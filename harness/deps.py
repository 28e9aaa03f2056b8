"""What a workflow job depends on, computed from the code alone.

Plain Python, no Snakemake: ``workflow/rules/common.smk`` plans with these, and tests call them directly.

Snakemake reruns a job when its inputs change, not when code its script imports does, so a job's
code inputs are the *import closure* of the modules it uses: every first-party module reached by
``import`` statements (read with ``ast``, never executed), directly or transitively, and the CUDA sources a
module reads (``<module>.cuh`` or ``<module>_*.cuh`` beside it, e.g. kernels/dequant_w4_decode.cuh).
"""
from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path


def _find(name: str, roots: tuple[Path, ...]) -> Path | None:
    """The file of a dotted module name under the first root that has it (a package's __init__.py)."""
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for path in (base / "__init__.py", base.with_suffix(".py")):
            if path.is_file():
                return path
    return None


def _package_of(name: str, path: Path) -> str:
    """The package a module's relative imports are resolved against."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


@lru_cache(maxsize=None)
def _imported_names(path: Path, name: str, mtime_ns: int) -> tuple[str, ...]:
    """Every dotted name an import statement anywhere in the file (functions included) may load.

    ``from a.b import c`` may load a.b.c as a module, so it is listed too; names that are not
    modules are dropped when resolved.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(name, path)
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = ".".join(p for p in (package, node.module) if p)
            else:
                base = node.module or ""
            if base:
                found.append(base)
                found += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    return tuple(found)


def _with_parents(name: str) -> list[str]:
    """Importing a.b.c imports a and a.b first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def import_closure(modules: Iterable[str], repo: Path, scripts: Iterable[str | Path] = ()) -> list[str]:
    """Sorted repo-relative paths of every first-party module reached from ``modules`` (dotted names,
    e.g. ``kernels.dequant``) and from the imports of ``scripts`` (paths, absolute or relative to
    ``repo``), the named modules and their parent packages' ``__init__.py`` included, with the CUDA
    sources beside them that they read (``<module>.cuh``, ``<module>_*.cuh``).

    A script's own folder is searched before ``repo``, as for a script run with its folder on
    ``sys.path`` (a workflow script's ``import checkout_first``); the scripts themselves are not listed.
    Third-party and standard-library imports (nothing under ``repo``) are ignored; a named module
    that is not under ``repo`` is an error.
    """
    repo = Path(repo).resolve()
    seen: set[Path] = set()
    todo: list[tuple[str, Path, tuple[Path, ...]]] = []

    def visit(name: str, roots: tuple[Path, ...], required: bool = False) -> None:
        for part in _with_parents(name):
            path = _find(part, roots)
            if path is None:
                if required:
                    raise ValueError(f"module {name!r} is not a module of {repo}")
                return
            path = path.resolve()
            if path not in seen:
                seen.add(path)
                todo.append((part, path, roots))

    for mod in modules:
        visit(mod, (repo,), required=True)
    for script in scripts:
        path = (repo / script).resolve()
        roots = (path.parent, repo)
        for name in _imported_names(path, path.stem, path.stat().st_mtime_ns):
            visit(name, roots)
    while todo:
        name, path, roots = todo.pop()
        for imported in _imported_names(path, name, path.stat().st_mtime_ns):
            visit(imported, roots)
    sources = {c for p in seen if p.suffix == ".py" for pattern in (f"{p.stem}.cuh", f"{p.stem}_*.cuh")
               for c in p.parent.glob(pattern)}
    return sorted(str(p.relative_to(repo)) for p in seen | sources)

