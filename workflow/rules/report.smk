# Stage 5: the comparison report, from tidy tables alone: a platform's run (its collect outputs), and any
# reference set (report.compare_with: a published set's per-family points, or another finished run's
# tables; existing files, checked at planning, never rebuilt by the main job).
# Each figure is also a Snakemake report item: snakemake --report results/report.zip


rule report:
    input:
        tidy="results/{platform}/tidy.parquet",
        compile_matrix="results/{platform}/compile_matrix.csv",
        roofs="results/{platform}/roofs.csv",
        cost="results/{platform}/cost.csv",
        ceilings=ceilings_input,
        # every profile of this run present: a new one re-renders the report
        profiles=lambda wc: profile_summaries(f"results/{wc.platform}"),
        code=script_code("report.py"),
    output:
        html="results/{platform}/report.html",
        **report_outputs("results/{platform}"),
    params:
        **report_params(lambda wc: f"results/{wc.platform}", lambda wc: f"{wc.platform} (this run)",
                        [(d, f"{Path(d).name} (published)") for d in config["report"]["compare_with"]]),
        # the reference sets (report.compare_with), read and never made: their content (points or tables,
        # profiles) reruns the report (harness/plan.py: reference_signature)
        reference_content=reference_signature(config["report"]["compare_with"], also=profile_summary_files),
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/{platform}/report.log",
    benchmark:
        benchmark_of("results/logs/{platform}/report.log")
    script:
        "../scripts/report.py"


rule report_published:
    input:
        points=lambda wc: published_platform_points(wc.platform),
        profiles=lambda wc: profile_summaries(f"results/published/{wc.platform}"),
        # the point sets' cost tables present (an older point set has none)
        costs=lambda wc: published_cost_files(f"results/published/{wc.platform}"),
        code=script_code("report.py"),
    output:
        html="results/published/{platform}/report.html",
        **report_outputs("results/published/{platform}"),
    params:
        **report_params(lambda wc: f"results/published/{wc.platform}", lambda wc: f"{wc.platform} (published)", []),
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/published/{platform}/report.log",
    benchmark:
        benchmark_of("results/logs/published/{platform}/report.log")
    script:
        "../scripts/report.py"


rule report_screenshot:
    # the report's first screen as a picture (README links the published one); needs Chromium
    input:
        "{folder}/report.html",
    output:
        "{folder}/report-first-screen.png",
    conda:
        # Chromium itself comes from the system (Debian's chromium package)
        "../../envs/report.yaml"
    log:
        "results/logs/screenshots/{folder}.log",
    benchmark:
        benchmark_of("results/logs/screenshots/{folder}.log")
    shell:
        "chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
        " --disable-background-networking --disable-component-update --disable-sync"
        " --user-data-dir=$(mktemp -d) --hide-scrollbars --window-size=1400,900 --virtual-time-budget=10000"
        " --screenshot={output} file://$(realpath {input}) > {log} 2>&1"
