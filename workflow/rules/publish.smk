# Stage 6: publish a GPU platform's results one family at a time, and rebuild the published tables
# from every family's points.
#   results/published/{platform}/points/{family}/: that family's run files (its entries and their
#   peers, kernels/registry.py), the ceilings and compile records of the same run, and provenance.json
#   (when, at which commit, on which GPU). Asking for this folder refreshes that family alone:
#     snakemake --cores 16 results/published/h200/points/fp8
#   then the published tables and report are rebuilt from all families' points:
#     snakemake --cores 1 results/published/h200/report.html


rule publish_family:
    input:
        runs=lambda wc: run_outputs(wc.platform, family_entries(wc.family)),
        ceilings="results/{platform}/ceilings.json",
        compiled=lambda wc: compile_outputs(wc.platform, family_entries(wc.family)),
    output:
        directory("results/published/{platform}/points/{family}"),
    wildcard_constraints:
        platform=GPU_PLATFORM,
    params:
        family="{family}",
        entries=lambda wc: family_entries(wc.family),
        # the benchmark files of the jobs its points were made of, read where present: the family's cost.csv
        benchmarks=lambda wc: job_benchmarks(wc.platform, family_entries(wc.family)),
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/published/{platform}/publish_{family}.log",
    benchmark:
        benchmark_of("results/logs/published/{platform}/publish_{family}.log")
    script:
        "../scripts/publish.py"


rule collect_published:
    input:
        points=lambda wc: published_platform_points(wc.platform),
        costs=lambda wc: published_cost_files(f"results/published/{wc.platform}"),
        code=script_code("collect.py"),
    output:
        csv="results/published/{platform}/tidy.csv",
        parquet="results/published/{platform}/tidy.parquet",
        compile_matrix="results/published/{platform}/compile_matrix.csv",
        roofs="results/published/{platform}/roofs.csv",
        point_sets="results/published/{platform}/point_sets.csv",
        cost="results/published/{platform}/cost.csv",
    params:
        physical=lambda wc: physical_limits(wc.platform),
        points_dir="results/published/{platform}/points",
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/published/{platform}/collect.log",
    benchmark:
        benchmark_of("results/logs/published/{platform}/collect.log")
    script:
        "../scripts/collect.py"
