# Build one (distribution, shape) input set: float32 operands and every needed format, hashed.
import sys

sys.path.insert(0, snakemake.scriptdir)
from script_setup import setup, write_json  # noqa: E402

setup(snakemake)
from pathlib import Path  # noqa: E402

from kernels.inputs import make_operands, save_operands  # noqa: E402
from kernels.registry import get_format  # noqa: E402
from kernels.tiles import parse_shape  # noqa: E402

M, N, K = parse_shape(snakemake.wildcards.shape)
A, B = make_operands(snakemake.wildcards.dist, M, N, K, snakemake.params.seed)
manifest = {
    "seed": snakemake.params.seed,
    "dist": snakemake.wildcards.dist,
    "shape": snakemake.wildcards.shape,
    "fp32": save_operands({"A": A, "B": B}, Path(snakemake.output.fp32)),
    "formats": {},
}
fmt_dir = Path(snakemake.output.formats)
fmt_dir.mkdir(parents=True, exist_ok=True)
for name in snakemake.params.formats:
    manifest["formats"][name] = save_operands(get_format(name).quantize(A, B), fmt_dir / f"{name}.pt")
    print(f"{name}: {manifest['formats'][name]}")
write_json(snakemake.output.manifest, manifest)
