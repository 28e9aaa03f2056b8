# Stage 2: cross-compile every TileLang variant x tile for every configured target, on any host.
# A target that cannot build a variant is recorded as unsupported (with the compiler's reason).


rule compile_kernel:
    input:
        code=lambda wc: variant_code(wc.variant, "compile"),
    output:
        record="results/{platform}/compile/{target}/{variant}/{tile}.json",
        artifacts=directory("results/{platform}/compile/{target}/{variant}/{tile}"),
    params:
        shapes=lambda wc: variant_shapes(wc.variant),
    conda:
        "../../envs/gpu.yaml"
    log:
        "results/logs/{platform}/compile/{target}/{variant}/{tile}.log",
    script:
        "../scripts/compile_kernel.py"
