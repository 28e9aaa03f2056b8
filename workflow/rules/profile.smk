# Stage 4b: where a timed point's time goes, with Nsight Compute, on a node with the platform's GPU.
#   results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.ncu-rep        the report (ncu-ui opens it)
#   results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.raw.csv        its raw page (every metric)
#   results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.summary.json   what the report lists: SOL %,
#       occupancy, DRAM bytes vs the point's counted bytes, top stalls, registers, kernels, limiter
# tile: a tile the entry runs on that platform's arch, or "lib" for a library baseline. Nothing asks for
# a profile by default; ask for the summary file. The published copy of a summary and its raw page:
#   results/published/{platform}/profile/{entry}/{dist}/{shape}/{tile}/summary.json, raw.csv
#   (snakemake --cores 1 results/published/h200/profile/<entry>/<dist>/<shape>/<tile>)


rule profile:
    input:
        unpack(profile_inputs),
    output:
        report="results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.ncu-rep",
        raw="results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.raw.csv",
        summary="results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.summary.json",
    wildcard_constraints:
        platform=GPU_PLATFORM,
        entry="[a-z0-9_]+",
    params:
        variant=lambda wc: impl(wc.entry).name,
        arch=lambda wc: run_arch(wc.platform),
        platform_spec=lambda wc: platform_spec(wc.platform),
    resources:
        **{name: gpu_resource(name) for name in GPU_RESOURCES},
    group:
        "gpu_{platform}"
    conda:
        "../../envs/gpu.yaml"
    log:
        "results/logs/{platform}/profile/{entry}/{dist}/{shape}/{tile}.log",
    benchmark:
        benchmark_of("results/logs/{platform}/profile/{entry}/{dist}/{shape}/{tile}.log")
    script:
        "../scripts/profile_point.py"


rule publish_profile:
    # a folder per point, like the published points: its files are committed sources, which no job
    # rebuilds when a report reads them
    input:
        summary="results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.summary.json",
        raw="results/{platform}/profile/{entry}/{dist}/{shape}/{tile}.raw.csv",
    output:
        directory("results/published/{platform}/profile/{entry}/{dist}/{shape}/{tile}"),
    wildcard_constraints:
        platform=GPU_PLATFORM,
        entry="[a-z0-9_]+",
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/published/{platform}/profile/{entry}/{dist}/{shape}/{tile}.log",
    benchmark:
        benchmark_of("results/logs/published/{platform}/profile/{entry}/{dist}/{shape}/{tile}.log")
    shell:
        "(mkdir -p {output} && cp {input.summary} {output}/summary.json && cp {input.raw} {output}/raw.csv) 2> {log}"
