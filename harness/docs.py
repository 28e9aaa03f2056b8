"""The generated parts of README.md and docs/: blocks between marker comments, rendered from what the code,
the configuration schema and the published results hold, so that no number or name in them is typed by hand.

    python -m harness.docs --write    # rewrite every generated block in place
    python -m harness.docs --check    # exit 1, naming each stale block (tests/test_docs.py runs this in-process)

A block is ``<!-- generated: NAME -->`` ... ``<!-- end generated -->`` in README.md or any docs/**/*.md; NAME is
one of ``BLOCKS``:

- ``headline``: per family, its best TileLang variant by geometric-mean speedup over its matched peer, that
  speedup, its worst errors and where and when it was measured, read from the published tidy table
  (``PUBLISHED``/tidy.csv) and each family's ``provenance.json``. The speedup is the report's (``harness.report``
  ``timed_tables``: per point the best tile's paired speedup, else the ratio of best-tile throughputs; geometric
  mean over the points), the errors ``harness.tables.accuracy``'s.
- ``variants``: every registered variant (``kernels.registry``), its family, the module of its kernel factory or
  "library peer", and its matched peer.
- ``config``: every key of ``workflow/schemas/config.schema.yaml`` with its type, default and description.
- ``paths``: the results path grammar, as the Snakefile's header states it.
- ``rules``: per stage file under ``workflow/rules/``, what it does (its header's first sentence) and its rules.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = "results/published/h200"
SCHEMA = "workflow/schemas/config.schema.yaml"
# markers stand on lines of their own (a marker quoted inside a line of prose is not one)
BLOCK = re.compile(r"^<!-- generated: (?P<name>[a-z_]+) -->\n(?P<body>.*?)^<!-- end generated -->$", re.S | re.M)
OPEN = re.compile(r"^<!-- generated: (?P<name>[^ ]*) -->$", re.M)


def documents(root: Path = REPO) -> list[Path]:
    """README.md and every page under docs/: the files that may hold generated blocks."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Context:
    """What a block renderer needs: where the sources are, and the document it is rendered into (for links)."""
    sources: Path  # the checkout whose code and results the block is rendered from
    document: Path  # the file the block goes into
    root: Path  # the folder holding README.md and docs/ (links are relative to the document within it)

    def href(self, path: str) -> str:
        """The relative address of ``path`` (relative to the repository root) from the document."""
        return os.path.relpath(self.root / path, self.document.parent)

    def link(self, path: str) -> str:
        return f"[`{path}`]({self.href(path)})"


# ------------------------------------------------------------------------------------------------ headline


def _provenance(sources: Path, point_set: str) -> dict:
    return json.loads((sources / PUBLISHED / "points" / point_set / "provenance.json").read_text())


def _when_where(prov: dict) -> str:
    start, end = prov["measured_from"], prov["measured_to"]
    when = f"{start[:10]} {start[11:16]}–{end[11:16] if end[:10] == start[:10] else end[:16]}Z"
    commits = ", ".join(f"`{c[:7]}`" for c in prov["git_commits"])
    return f"{', '.join(prov['gpu_names'])}, {when}, commit {commits}"


def headline(ctx: Context) -> str:
    import pandas as pd

    from harness import report, tables

    METHOD = {tables.PAIRED: "paired", tables.UNPAIRED: "unpaired"}
    from kernels.registry import VARIANTS, load_all

    load_all()
    tidy = pd.read_csv(ctx.sources / PUBLISHED / "tidy.csv", low_memory=False)
    peers = report.Peers.of(VARIANTS)
    timed = report.timed_tables({"tidy": tidy, "label": PUBLISHED, "roofs": pd.DataFrame()}, peers)
    worst = tables.accuracy(tidy).groupby("variant").agg(total=("total_rel_fro", "max"), kernel=("kernel_rel_fro", "max"))
    # a contender is a TileLang variant that is no other variant's peer (int8_tilelang is int4_ws's second baseline)
    peer_names = set(peers.baseline_of.values()) | set(peers.second_of.values())
    geo = timed.geomean[timed.geomean["variant"].map(lambda v: VARIANTS[v].kernel is not None and v not in peer_names)]
    geo = geo.dropna(subset=["geomean_speedup"])
    sp = timed.speedups
    rows = []
    families = list(dict.fromkeys(v.family for v in VARIANTS.values()))
    for family in [f for f in families if f in set(geo["family"])]:
        best = geo[geo["family"] == family].sort_values("geomean_speedup", ascending=False).iloc[0]
        mine = sp[sp["variant"] == best["variant"]]
        point_set = mine["point_set"].iloc[0]
        methods = ", ".join(sorted({METHOD[m] for m in mine["speedup_method"].dropna()}))
        rows.append(
            f"| {family} | `{best['variant']}` | `{best['baseline']}` | **{best['geomean_speedup']:.3f}×** "
            f"({mine['speedup'].min():.2f}–{mine['speedup'].max():.2f}, {int(best['shapes'])} points, {methods}) "
            f"| {worst.loc[best['variant'], 'kernel']:.2g} / {worst.loc[best['variant'], 'total']:.2g} "
            f"| {_when_where(_provenance(ctx.sources, point_set))} |")
    return ("| family | best variant | matched peer | speedup over the peer: geomean (range) "
            "| worst error: kernel / total | measured |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"Read from {ctx.link(PUBLISHED + '/tidy.csv')} (the committed points of "
            f"{ctx.link(PUBLISHED + '/points')}; report: {ctx.link(PUBLISHED + '/report.html')}). Best variant: the "
            "TileLang variant of the family, other than a peer of another, with the highest geometric mean over its "
            "points (shape × input distribution) of the best tile's speedup over the matched peer of the same run. "
            "Errors: relative Frobenius norm, worst over every row of the variant; kernel = against float64 of the "
            "operands it was given, total = against float64 of the unquantized inputs (an integer GEMM is exact: its "
            "kernel error is float64 rounding, its total error its format's). Unpaired: the variant and its peer timed "
            "in separate jobs of one run (sets published before paired timing); paired: the median of per-round "
            "ratios of the two timed alternated ([methodology](" + ctx.href("docs/methodology.md") + "#how-a-speedup-is-taken)).\n")


# ------------------------------------------------------------------------------------------------ variants


def variants(ctx: Context) -> str:
    from kernels.registry import VARIANTS, kernel_module, load_all

    load_all()
    rows = []
    # by name, never by registration order (which depends on what imported the family modules first)
    for v in sorted(VARIANTS.values(), key=lambda v: (v.family, v.kernel is None, v.name)):
        where = ctx.link(kernel_module(v)) if v.kernel else "library peer"
        rows.append(f"| `{v.name}` | {v.family} | {where} | {f'`{v.baseline}`' if v.baseline else '–'} |")
    return "| variant | family | kernel | matched peer |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------ config


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _resolve(node: dict, defs: dict) -> dict:
    if "$ref" in node:
        return {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type(node: dict, defs: dict) -> str:
    node = _resolve(node, defs)
    if "enum" in node:
        vals = [str(v) for v in node["enum"]]
        return "one of " + (", ".join(vals) if len(vals) <= 6 else f"{vals[0]}, …, {vals[-1]} ({len(vals)})")
    if "oneOf" in node:  # say the kinds; the options' own descriptions say the rest
        return " or ".join(dict.fromkeys({"array": "list", "object": "mapping"}.get(_resolve(n, defs).get("type"), "value")
                                         for n in node["oneOf"]))
    t = node.get("type", "")
    if t == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if t == "object" and "additionalProperties" in node and not node.get("properties"):
        values = node["additionalProperties"]
        return f"mapping to {_type(values, defs)}" if isinstance(values, dict) and "properties" not in values else "mapping"
    return " or ".join(t) if isinstance(t, list) else t


def _constraints(node: dict) -> list[str]:
    out = []
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in node:
            out.append(f"{sign} {node[key]}")
    if node.get("minItems"):
        out.append(f"at least {node['minItems']} item{'s' if node['minItems'] > 1 else ''}")
    if node.get("uniqueItems"):
        out.append("unique")
    items = node.get("items", {})
    pattern = node.get("pattern") or (items.get("pattern") if isinstance(items, dict) else None)
    if pattern:
        out.append(f"pattern `{pattern}`")
    if node.get("format") == "regex":
        out.append("a regular expression")
    names = node.get("propertyNames", {})
    if "pattern" in names:
        out.append(f"keys match `{names['pattern']}`" + (f", not {', '.join(names['not']['enum'])}" if "not" in names else ""))
    if "anyOf" in node:
        out.append("needs " + " or ".join(sorted({k for alt in node["anyOf"] for k in alt.get("required", [])})))
    return out


# how a mapping's free keys are named in the reference (the schema has no word for them)
KEY_NAMES = {"platforms": "<slug>", "variants": "<entry>", "tiles": "<target>", "peak": "<precision>"}


def _rows(node: dict, path: str, required: bool, defs: dict) -> list[str]:
    node = _resolve(node, defs)
    rows = []
    if path:
        extra = _constraints(node)
        desc = " ".join(filter(None, [node.get("description", ""), f"({'; '.join(extra)})" if extra else ""]))
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
        rows.append(f"| `{path}` | {_cell(_type(node, defs))} | {'yes' if required else ''} | {default} | {_cell(desc)} |")
    req = set(node.get("required", []))
    for key, child in node.get("properties", {}).items():
        rows += _rows(child, f"{path}.{key}" if path else key, key in req, defs)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:
        rows += _rows(extra, f"{path}.{KEY_NAMES.get(path.rsplit('.', 1)[-1], '<key>')}", False, defs)
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        rows += _rows(items, f"{path}[]", False, defs)
    return rows


def config(ctx: Context) -> str:
    schema = yaml.safe_load((ctx.sources / SCHEMA).read_text())
    return (f"Generated from {ctx.link(SCHEMA)}; `.` separates nested keys, `<slug>`/`<entry>`/`<target>`/`<precision>` "
            "stand for a key you choose, `[]` for each item of a list.\n\n"
            "| key | type | required | default | description |\n|---|---|---|---|---|\n"
            + "\n".join(_rows(schema, "", True, schema.get("$defs", {}))) + "\n")


# ------------------------------------------------------------------------------------------------ paths, rules


def paths(ctx: Context) -> str:
    lines = (ctx.sources / "Snakefile").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# Results path grammar")) + 1
    body = []
    for ln in lines[start:]:
        if not ln.startswith("#"):
            break
        body.append(ln[1:].strip())
    return (f"From the header of {ctx.link('Snakefile')}:\n\n```text\n" + "\n".join(body) + "\n```\n")


TEMPLATED = re.compile(r"name:\s*\n\s*f\"(?P<head>\w*)\{_(?P<var>\w+)\}(?P<tail>\w*)\"")
STATIC = re.compile(r"^rule (\w+):", re.M)
INCLUDE = re.compile(r'^include: "(workflow/rules/\w+\.smk)"', re.M)


def rules(ctx: Context) -> str:
    rows = []
    for rel in INCLUDE.findall((ctx.sources / "Snakefile").read_text()):
        text = (ctx.sources / rel).read_text()
        names = [f"`{m['head']}<{m['var']}>{m['tail']}`" for m in TEMPLATED.finditer(text)]
        names += [f"`{n}`" for n in STATIC.findall(text)]
        lead = []
        for ln in text.splitlines():
            if not ln.startswith("#"):
                break
            lead.append(ln)
        header = " ".join(ln.lstrip("# ").strip() for ln in lead if not ln.startswith("#  ")).split(". ")[0].rstrip(".")
        if not names:
            continue
        rows.append(f"| {ctx.link(rel)} | {', '.join(names)} | {_cell(header)}. |")
    return "| stage file | rules | what |\n|---|---|---|\n" + "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------ rendering


BLOCKS: dict[str, Callable[[Context], str]] = {
    "headline": headline, "variants": variants, "config": config, "paths": paths, "rules": rules}


class DocsError(Exception):
    """A document's markers are broken (an unknown block, an opening marker without its end)."""


def render(text: str, document: Path, sources: Path = REPO, cache: dict | None = None, root: Path | None = None) -> str:
    """``text`` with every generated block rendered afresh (``cache``: block output per (name, document folder))."""
    cache = {} if cache is None else cache
    opened = [m["name"] for m in OPEN.finditer(text)]
    closed = [m["name"] for m in BLOCK.finditer(text)]
    if opened != closed:
        raise DocsError(f"{document}: generated block(s) {sorted(set(opened) - set(closed)) or opened} "
                        "have no '<!-- end generated -->' of their own")

    def one(m: re.Match) -> str:
        name = m["name"]
        if name not in BLOCKS:
            raise DocsError(f"{document}: unknown generated block {name!r} (known: {', '.join(BLOCKS)})")
        key = (name, document.parent)
        if key not in cache:
            cache[key] = BLOCKS[name](Context(sources, document, root or sources))
        return f"<!-- generated: {name} -->\n{cache[key]}<!-- end generated -->"

    return BLOCK.sub(one, text)


def stale(root: Path = REPO, sources: Path | None = None) -> list[str]:
    """Each generated block under ``root`` whose text differs from what it renders to, as 'file: block name'."""
    sources = sources or REPO
    out, cache = [], {}
    for doc in documents(root):
        if not doc.exists():
            continue
        text = doc.read_text()
        fresh = render(text, doc, sources, cache, root)
        old = {m.start(): m for m in BLOCK.finditer(text)}
        new = list(BLOCK.finditer(fresh))
        for m_old, m_new in zip(old.values(), new, strict=True):
            if m_old.group(0) != m_new.group(0):
                out.append(f"{doc.relative_to(root)}: {m_old['name']}")
    return out


def write(root: Path = REPO, sources: Path | None = None) -> list[Path]:
    """Render every generated block under ``root`` in place; return the files that changed."""
    sources = sources or REPO
    fresh, cache = {}, {}
    for doc in documents(root):  # every document rendered before any is written: a broken one changes none
        if doc.exists():
            text = doc.read_text()
            if (new := render(text, doc, sources, cache, root)) != text:
                fresh[doc] = new
    for doc, text in fresh.items():
        doc.write_text(text)
    return list(fresh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.docs", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every generated block")
    mode.add_argument("--check", action="store_true", help="exit 1, naming each stale block")
    parser.add_argument("--root", type=Path, default=REPO, help="the folder holding README.md and docs/ (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        if args.write:
            for doc in write(args.root):
                print(f"rewrote {doc.relative_to(args.root)}")
            return 0
        out = stale(args.root)
    except DocsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name in out:
        print(f"stale generated block: {name} (python -m harness.docs --write)", file=sys.stderr)
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main())
