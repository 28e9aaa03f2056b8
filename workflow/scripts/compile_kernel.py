# Compile one variant: every (target, tile) at its shapes; record each outcome, never crash.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import restore_missing, setup

setup(snakemake)
from pathlib import Path  # noqa: E402

from harness.compile import compile_record  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import parse_shape, parse_tile  # noqa: E402

p = snakemake.params
variant = get_variant(p.variant)
artifacts = Path(snakemake.output.artifacts)
artifacts.mkdir(parents=True, exist_ok=True)  # an output even when no target builds (all unsupported)
written = {}
for (target, tile_name, shapes), folder, out in zip(p.jobs, p.artifact_dirs, snakemake.output.records, strict=True):
    tile = parse_tile(tile_name)
    records = []
    for shape in shapes:
        rec = compile_record(variant, *parse_shape(shape), tile, target, Path(folder) / shape)
        print(target, tile_name, shape, rec["status"], rec.get("reason", ""), rec.get("compile_s"), flush=True)
        records.append(rec | {"shape": shape})
    written[out] = {"variant": variant.name, "target": target, "tile": tile_name, "records": records}
    write_json(out, written[out])
restore_missing(written)
