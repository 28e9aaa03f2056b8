# Compile one variant x tile for one target at every shape of the sweep; record, never crash.
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import setup, write_json  # noqa: E402

setup(snakemake)
from pathlib import Path  # noqa: E402

from kernels.compile import compile_record  # noqa: E402
from kernels.registry import get_variant  # noqa: E402
from kernels.tiles import parse_shape, parse_tile  # noqa: E402

wc = snakemake.wildcards
variant = get_variant(wc.variant)
tile = parse_tile(wc.tile)
artifacts = Path(snakemake.output.artifacts)
artifacts.mkdir(parents=True, exist_ok=True)
records = []
for shape in snakemake.params.shapes:
    M, N, K = parse_shape(shape)
    rec = compile_record(variant, M, N, K, tile, wc.target, artifacts / shape)
    print(shape, rec["status"], rec.get("reason", ""), rec.get("compile_s"))
    records.append(rec | {"shape": shape})
write_json(snakemake.output.record, {"variant": wc.variant, "target": wc.target, "tile": wc.tile, "records": records})
