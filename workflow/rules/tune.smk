# Tile selection's tune step (harness/selection.py; docs/design/tile_selection.md). Per GPU platform and
# TileLang entry whose kernel has a tile space: at each of its GPU shapes (sweep and zoo), the cost
# model's best tile_selection.tune_candidates tiles are compiled in parallel (the job's threads), then
# checked and timed exactly as a run times a tile; the fastest within tolerance is the winner.
#   results/{platform}/tuning/{entry}/{shape}.json   one record: the key (variant, shape, arch, GPU,
#       TileLang, nvcc, kernel source), every candidate (model rank, prediction, status, time), the winner
#   results/published/{platform}/tuning/{family}/    the committed table: a family's records, copied
# Runs use a record while its key holds (a changed kernel source, compiler or GPU makes it stale: the
# model's pick runs instead until it is tuned again):
#   snakemake --cores 16 results/published/h200/tuning/fp8     tune a family and commit the table
#   snakemake --cores 16 --forcerun tune_int4_ws -- results/h200/tuning/int4_ws/4096x4096x4096.json


for _variant in TUNABLE:

    rule:
        name:
            f"tune_{_variant}"
        input:
            fp32=[f"results/inputs/{d}/{s}/fp32.pt" for s, d in tune_points(_variant)],
            formats=[f"results/inputs/{d}/{s}/formats/{impl(_variant).input_format}.pt" for s, d in tune_points(_variant)],
            manifest=[f"results/inputs/{d}/{s}/manifest.json" for s, d in tune_points(_variant)],
            code=variant_code(_variant, "run") + import_closure(["harness.selection", "harness.tryout"], REPO,
                                                                ["workflow/scripts/tune_variant.py"]),
        output:
            [f"results/{{platform}}/tuning/{_variant}/{s}.json" for s, _ in tune_points(_variant)],
        wildcard_constraints:
            platform=GPU_PLATFORM,
        params:
            variant=impl(_variant).name,
            entry=_variant,
            points=tune_points(_variant),
            # shape -> [(tile, predicted µs)], the model's best first
            candidates=lambda wc, v=_variant: {s: PLAN.tune_candidates(v, wc.platform, s) for s, _ in tune_points(v)},
            tolerance=config["variants"][_variant]["tolerance"],
            timing=config["timing"],
            platform_spec=lambda wc: platform_spec(wc.platform),
            arch=lambda wc: run_arch(wc.platform),
        threads: workflow.cores
        resources:
            **{name: gpu_resource(name) for name in GPU_RESOURCES},
        group:
            "gpu_{platform}"
        priority: GPU_PRIORITY
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/{{platform}}/tuning/{_variant}.log",
        benchmark:
            benchmark_of(f"results/logs/{{platform}}/tuning/{_variant}.log")
        script:
            "../scripts/tune_variant.py"


rule publish_tuning:
    input:
        lambda wc: [f for f in tune_outputs(wc.platform) if f.split("/")[3] in family_entries(wc.family)],
    output:
        directory("results/published/{platform}/tuning/{family}"),
    wildcard_constraints:
        platform=GPU_PLATFORM,
    conda:
        "../../envs/report.yaml"
    log:
        "results/logs/published/{platform}/tuning_{family}.log",
    benchmark:
        benchmark_of("results/logs/published/{platform}/tuning_{family}.log")
    script:
        "../scripts/publish_tuning.py"
