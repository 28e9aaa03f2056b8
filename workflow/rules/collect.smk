# Stage 4: one tidy table of every run of a platform (one row per target x config entry x distribution
# x shape x tile, unique), its limits (physical and measured best, roofs.csv) and the compile matrix.


rule collect:
    input:
        runs=lambda wc: run_outputs(wc.platform),
        compiled=lambda wc: compile_outputs(wc.platform),
        ceilings=ceilings_input,
        code=script_code("collect.py"),
    output:
        csv="results/{platform}/tidy.csv",
        parquet="results/{platform}/tidy.parquet",
        compile_matrix="results/{platform}/compile_matrix.csv",
        roofs="results/{platform}/roofs.csv",
        # a row per job with its wall time, memory and CPU time (harness/cost.py), for the report's cost section
        cost="results/{platform}/cost.csv",
    params:
        physical=lambda wc: physical_limits(wc.platform),
        # the benchmark files of the jobs these tables are made of, read where present (never inputs, nor
        # collect's own: common.smk job_benchmarks)
        benchmarks=lambda wc: job_benchmarks(wc.platform),
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/{platform}/collect.log",
    benchmark:
        benchmark_of("results/logs/{platform}/collect.log")
    script:
        "../scripts/collect.py"
