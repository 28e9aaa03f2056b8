# Stage 5: the comparison report (Markdown + seaborn figures) from the tidy table alone.


rule report:
    input:
        tidy="results/{platform}/tidy.parquet",
        compile_matrix="results/{platform}/compile_matrix.csv",
        ceilings=[f"results/{PLATFORM}/ceilings.json"] if RUN_ARCH else [],
    output:
        md="results/{platform}/report.md",
        figures=directory("results/{platform}/figures"),
    params:
        platform=PLATFORM,
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/{platform}/report.log",
    script:
        "../scripts/report.py"
