# Build one (distribution, shape) input set: float32 operands and every needed format, one file each,
# with the sha256 of every tensor and of every file in the manifest.
import checkout_first  # noqa: F401  (this checkout first on sys.path)

from harness.atomic import write_json
from harness.jobs import setup

setup(snakemake)
from pathlib import Path  # noqa: E402

from harness.inputs import make_operands, save_operands, verified_file_sha256  # noqa: E402
from kernels.registry import get_format  # noqa: E402
from kernels.tiles import parse_shape  # noqa: E402


def saved(ops, path):
    # hashed here once: a run job reading the file on this host takes the hash recorded on it (harness/inputs.py)
    return {"tensors": save_operands(ops, Path(path)), "file_sha256": verified_file_sha256(Path(path))}


M, N, K = parse_shape(snakemake.wildcards.shape)
A, B = make_operands(snakemake.wildcards.dist, M, N, K, snakemake.params.seed, snakemake.threads)
manifest = {
    "seed": snakemake.params.seed,
    "dist": snakemake.wildcards.dist,
    "shape": snakemake.wildcards.shape,
    "fp32": saved({"A": A, "B": B}, snakemake.output.fp32),
    "formats": {},
}
for name, path in zip(snakemake.params.formats, snakemake.output.formats, strict=True):
    manifest["formats"][name] = saved(get_format(name).quantize(A, B), path)
    print(f"{name}: {manifest['formats'][name]}", flush=True)
write_json(snakemake.output.manifest, manifest)
