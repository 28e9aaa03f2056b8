# Stage 3: run. One rule per variant (run_<variant>), so `--forcerun run_fp8_e4m3` reruns one variant;
# one job covers a variant's whole shape sweep for one distribution (one process start, one CUDA
# context), writing a file per shape. On a GPU host: correctness, then timing, of each tile compiled
# for this GPU's arch. On a CPU-only host: the variant's arithmetic emulated in torch, errors only.


for _variant in RUN_VARIANTS:

    rule:
        name:
            f"run_{_variant}"
        input:
            unpack(run_inputs(_variant)),
        output:
            [f"results/{{platform}}/{_variant}/{{dist}}/{shape}.json" for shape in variant_shapes(_variant)],
        params:
            variant=impl(_variant).name,
            entry=_variant,
            shapes=variant_shapes(_variant),
            arch=RUN_ARCH,
            tiles=tiles_for(_variant, RUN_ARCH) if RUN_ARCH else [],
            tolerance=config["variants"][_variant]["tolerance"],
            timing=config["timing"],
        resources:
            gpu=0 if RUN_ARCH is None else 1,
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/{{platform}}/{_variant}/{{dist}}.log",
        script:
            "../scripts/run_variant.py"


rule measure_ceilings:
    input:
        code=import_closure(["kernels.ceilings", "kernels.device"], REPO, ["workflow/scripts/measure_ceilings.py"]),
    output:
        "results/{platform}/ceilings.json",
    params:
        arch=RUN_ARCH,
        reps=config["timing"]["reps"],
    resources:
        gpu=1,
    conda:
        "../../envs/gpu.yaml"
    log:
        "results/logs/{platform}/ceilings.log",
    script:
        "../scripts/measure_ceilings.py"
