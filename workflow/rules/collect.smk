# Stage 4: one tidy table of every run (one row per target x config entry x distribution x shape x
# tile, unique), its limits (physical and measured best, roofs.csv) and the compile matrix.


rule collect:
    input:
        runs=run_outputs(),
        compiled=compile_outputs(),
        ceilings=[f"results/{PLATFORM}/ceilings.json"] if RUN_ARCH else [],
        code=script_code("collect.py"),
    output:
        csv="results/{platform}/tidy.csv",
        parquet="results/{platform}/tidy.parquet",
        compile_matrix="results/{platform}/compile_matrix.csv",
        roofs="results/{platform}/roofs.csv",
    params:
        physical=PHYSICAL,
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/{platform}/collect.log",
    script:
        "../scripts/collect.py"
