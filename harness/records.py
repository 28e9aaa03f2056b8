"""Reading the pipeline's JSON files: one reader (``read_json``) that every JSON the pipeline reads goes
through, one exception (``DamagedFile``) and the shapes of the files it reads.

A damaged file never surfaces as a bare ``JSONDecodeError`` or ``KeyError``: the message names the file,
says what is wrong (missing, unreadable, truncated, not JSON, or of the wrong shape: which key, what
type was expected) and how to fix it (the exact command that recomputes it; for a committed published
point, ``git checkout`` or republishing). Callers decide what a damaged file costs: a failed row, a
listed warning, or the job.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

NUMBER = (int, float)


def utc(t: float) -> str:
    """A POSIX time as records write it: a UTC ISO timestamp, to the millisecond."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class DamagedFile(ValueError):
    """A file the pipeline reads that is missing, unreadable, truncated or of the wrong shape. ``path``,
    ``problem`` and ``fix`` are kept apart; the message is "<path>: <problem>; <fix>"."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.fix = fix if fix is not None else fix_for(path)
        super().__init__(f"{self.path}: {problem}; {self.fix}")

    def __reduce__(self):  # the default would call __init__ with the message alone
        return type(self), (self.path, self.problem, self.fix)


def recompute_command(path: str | os.PathLike) -> str:
    # --cores is required by snakemake 8+: without it the printed command fails as printed
    return f"snakemake --cores 1 -f {shlex.quote(str(path))}"


def fix_for(path: str | os.PathLike) -> str:
    """How to get a good copy of ``path``: a committed published file is restored from git (or its family
    republished on a host with that GPU); anything else under results/ is recomputed."""
    parts = Path(path).parts
    for i in range(1, len(parts) - 1):
        if parts[i - 1] == "results" and parts[i] == "published":
            restore = f"restore the committed file: git checkout -- {shlex.quote(str(path))}"
            if len(parts) > i + 4 and parts[i + 2] == "points":  # results/published/<gpu>/points/<family>/...
                family_dir = Path(*parts[: i + 4])
                restore += (f" (or republish the {parts[i + 3]} family on a {parts[i + 1]} host: "
                            f"{recompute_command(family_dir)})")
            return restore
    return f"recompute it: {recompute_command(path)}"


# ---------------------------------------------------------------- shapes

# A shape, written compactly beside each reader: a type or tuple of types (the value's type); {key: shape}
# (an object with those keys, a key ending in "?" optional, "*" every value of the object); [shape] (an
# array whose every element has it). It is checked as the JSON Schema it stands for (jsonschema).
_SCHEMA_TYPE = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean",
                type(None): "null"}
_NAME = {"object": "an object", "array": "an array", "string": "a string", "integer": "an integer",
         "number": "a number", "boolean": "a boolean", "null": "null"}
_validators: dict[int, tuple[Any, Any]] = {}  # id(shape) -> (shape, its validator)


def _schema(shape: Any) -> dict:
    if isinstance(shape, Mapping):
        keys = [k for k in shape if k != "*"]
        schema = {"type": "object", "required": [k for k in keys if not k.endswith("?")],
                  "properties": {k.removesuffix("?"): _schema(shape[k]) for k in keys}}
        if "*" in shape:
            schema["patternProperties"] = {"": _schema(shape["*"])}
        return schema
    if isinstance(shape, list):
        return {"type": "array", "items": _schema(shape[0])}
    return {"type": [_SCHEMA_TYPE[t] for t in (shape if isinstance(shape, tuple) else (shape,))]}


def _validator(shape: Any):
    if id(shape) not in _validators:
        import jsonschema

        _validators[id(shape)] = (shape, jsonschema.Draft202012Validator(_schema(shape)))
    return _validators[id(shape)][1]


def _expected(schema_type: str | list) -> str:
    types = [schema_type] if isinstance(schema_type, str) else schema_type
    return "a number" if set(types) == {"integer", "number"} else " or ".join(_NAME[t] for t in types)


def _json_type(value: Any) -> str:
    return _NAME.get(_SCHEMA_TYPE.get(type(value), ""), type(value).__name__)


def _key(where: str, path) -> str:
    key = where
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def shape_problem(value: Any, shape: Any, where: str = "") -> str | None:
    """What keeps ``value`` from having ``shape`` (the first thing found), or None; ``where``: the key
    path of ``value`` in its file."""
    error = next(iter(_validator(shape).iter_errors(value)), None)
    if error is None:
        return None
    at = _key(where, error.absolute_path)
    if error.validator == "required":
        missing = next(k for k in error.validator_value if k not in error.instance)
        return f"key '{_key(at, [missing])}' is missing (expected {_expected(error.schema['properties'][missing]['type'])})"
    what = f"'{at}' is" if at else "the file holds"
    return f"{what} {_json_type(error.instance)}, expected {_expected(error.validator_value)}"


# the files the pipeline reads (Snakefile header: results path grammar); only what readers rely on
RUN_POINT = {k: str for k in ("platform", "target", "variant", "entry", "family", "dist", "shape")} | {k: int for k in "MNK"}
RUN = {"point": RUN_POINT, "env": dict, "tolerance?": dict, "rows": [{"tile": str}]}
COMPILE = {"variant": str, "target": str, "tile": str, "records": [{"shape": str, "status": str}]}
CEILINGS = {"env?": dict, "ceilings": {"*": dict}}
PROVENANCE = {"family": str, "platform": str}
# a tune job's record (harness/selection.py tune_record) and a platform's fitted model constants
TUNE = {"key": {k: str for k in ("variant", "shape", "arch", "gpu_name", "tilelang", "nvcc", "source_sha256")},
        "candidates": [{"tile": str, "status": str}]}
CALIBRATION = {"platform": str, "constants": {"*": dict}}
MANIFEST = {"fp32": {"tensors": {"*": {"sha256": str}}, "file_sha256": str}, "formats": dict}
MANIFEST_FORMAT = {"tensors": {"*": {"sha256": str}}, "file_sha256": str}
PROFILE_SUMMARY = {"point": {k: str for k in ("entry", "dist", "shape", "tile", "target")},
                   "kernels": [{"name": str, "top_stalls": [{"reason": str, "cycles_per_issue": NUMBER}]}],
                   "main_kernel": str, "limiter": str, "duration_us": NUMBER, "dram_read_bytes": NUMBER,
                   "dram_write_bytes": NUMBER, "kernel_names": [str]}

# what is left of a token when a file ends in the middle of it (a number, true, false, null)
_PARTIAL_TOKEN = re.compile(r"-?[0-9.eE+-]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?")


def _decode_problem(text: str, e: json.JSONDecodeError) -> str:
    where = f"{e.msg}: line {e.lineno}, column {e.colno}"
    if not text.strip():
        return "empty file (truncated when it was written?)"
    rest = text[e.pos:].rstrip()
    if not rest or e.msg.startswith("Unterminated string") or _PARTIAL_TOKEN.fullmatch(rest):
        return f"truncated JSON, it stops before the end of the document (JSONDecodeError: {where})"
    return f"not valid JSON (JSONDecodeError: {where})"


def read_json(path: str | os.PathLike, shape: Any = None, *, fix: str | None = None,
              error: type[DamagedFile] = DamagedFile) -> Any:
    """The JSON value in ``path``, checked against ``shape`` (see shape_problem) when given. Raises
    ``error`` (DamagedFile or a subclass) naming the file, what is wrong and ``fix`` (default: fix_for)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise error(path, "missing", fix) from None
    except UnicodeDecodeError as e:
        raise error(path, f"unreadable: not UTF-8 text ({e.reason} at byte {e.start})", fix) from e
    except OSError as e:
        raise error(path, f"unreadable ({type(e).__name__}: {e.strerror or e})", fix) from e
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(path, _decode_problem(text, e), fix) from e
    except ValueError as e:  # e.g. an integer too long to convert
        raise error(path, f"not valid JSON ({type(e).__name__}: {' '.join(str(e).split())[:200]})", fix) from e
    if shape is not None and (p := shape_problem(value, shape)) is not None:
        raise error(path, f"wrong shape: {p}", fix)
    return value


def missing_status(path: str | os.PathLike, i: int, row: dict) -> DamagedFile:
    """A run row without its status (the runner always gives one): no measurement, never a NaN status."""
    return DamagedFile(path, f"wrong shape: key 'rows[{i}].status' is missing (tile {row.get('tile')})")


def note(damaged: list | None, error: DamagedFile) -> None:
    """Record a damaged file the caller works around (the list a report or collect shows at its end)."""
    if damaged is not None and all(d.path != error.path for d in damaged):
        damaged.append(error)


def warn(damaged: Iterable[DamagedFile], stream=None) -> None:
    """Each damaged file on stderr, once, with its fix."""
    for e in damaged:
        print(f"lpgemm: warning: damaged input: {e}", file=stream or sys.stderr)


# ---------------------------------------------------------------- readers of the pipeline's records

def _sweep_tile(path: str | os.PathLike) -> str:
    return Path(path).stem  # results/compile/{variant}/{target}/sweep/{tile}.json


def compile_outcomes(files: Iterable[str | os.PathLike],
                     shapes: Sequence[str]) -> dict[str, dict[str, tuple[str, str]]]:
    """{shape: {tile: (status, reason)}} from a GPU run's sweep compile records. A damaged record fails its
    tile at every shape in ``shapes``, the reason naming the file and the fix; the other tiles are kept."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for f in files:
        try:
            d = read_json(f, COMPILE)
        except DamagedFile as e:
            print(f"lpgemm: warning: {e}", file=sys.stderr, flush=True)
            for s in shapes:
                out.setdefault(s, {})[_sweep_tile(f)] = ("failed", str(e))
            continue
        for r in d["records"]:
            out.setdefault(r["shape"], {})[d["tile"]] = (r["status"], r.get("reason") or "")
    return out


def compile_log(path: str | os.PathLike) -> str:
    """The log of the job that wrote a compile record: results/compile/{v}/{target}/{tile}.json ->
    results/logs/compile/{v}.log; .../{target}/sweep/{tile}.json -> results/logs/compile/{v}/{target}/sweep/{tile}.log."""
    p = Path(path)
    parts = p.parts
    if len(parts) >= 6 and parts[-2] == "sweep":
        return str(Path(*parts[:-5], "logs", "compile", parts[-4], parts[-3], "sweep", f"{p.stem}.log"))
    if len(parts) >= 4:
        return str(Path(*parts[:-4], "logs", "compile", f"{parts[-3]}.log"))
    return ""


# the failure summary reads only what it prints: a damaged point elsewhere still shows as a failed row
_RUN_SUMMARY = {"point": dict, "rows": [dict]}


def failure_lines(run_files: Iterable[str | os.PathLike], compile_files: Iterable[str | os.PathLike],
                  limit: int = 40) -> list[str]:
    """The end-of-run failure summary, one string per line to print (none when nothing failed): a header
    with the counts, then every failed run
    row with the log holding its traceback, every failed compile record with its compile job's log, and
    every unreadable run or compile file (counted as a failed row or record, as the tidy table and the
    compile matrix count it) with its fix. Files that do not exist (not made yet) are skipped; at most
    ``limit`` entries are listed, then how many more."""
    rows: list[str] = []
    for f in run_files:
        if not os.path.exists(f):
            continue
        try:
            d = read_json(f, _RUN_SUMMARY)
        except DamagedFile as e:
            rows.append(f"  {f} [?]: {e}")
            continue
        log = d["point"].get("log") or ""
        for i, r in enumerate(d["rows"]):
            status = r.get("status")
            if status == "failed" or not isinstance(status, str):
                reason = (r.get("reason") or "") if status == "failed" else str(missing_status(f, i, r))
                rows.append(f"  {f} [{r.get('tile', '?')}]: {reason}" + (f"\n      log: {log}" if log else ""))
    records: list[str] = []
    for f in compile_files:
        if not os.path.exists(f):
            continue
        log = compile_log(f)
        try:
            d = read_json(f, {"records": [dict]})
        except DamagedFile as e:
            records.append(f"  {f} [?]: {e}" + (f"\n      log: {log}" if log else ""))
            continue
        for r in d["records"]:
            if r.get("status") == "failed":
                records.append(f"  {f} [{r.get('shape', '?')}]: {r.get('reason') or ''}"
                               + (f"\n      log: {log}" if log else ""))
    entries = rows + records
    if not entries:
        return []
    counts = [f"{n} {what}" for n, what in ((len(rows), "failed row(s)"), (len(records), "failed compile record(s)")) if n]
    lines = [f"lpgemm: {', '.join(counts)}:"]
    for e in entries[:limit]:
        lines += e.split("\n")
    if len(entries) > limit:
        lines.append(f"  ... and {len(entries) - limit} more (status == failed in results/<platform>/tidy.csv "
                     "and compile_matrix.csv)")
    return lines
