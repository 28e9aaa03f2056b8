# Stage 3: run. Per variant, one rule per kind of platform, so `--forcerun run_fp8_e4m3` reruns one
# variant on the GPU platforms and `--forcerun emulate_fp8_e4m3` its CPU emulation. One job covers a
# variant's whole shape sweep for one distribution (one process start, one CUDA context), writing a
# file per shape.
#   run_<variant>     results/<gpu platform>/...: on a node with that GPU (checked on landing),
#                     correctness, then timing, of each tile compiled for the platform's arch.
#   emulate_<variant> results/cpu/...: the variant's arithmetic emulated in torch, errors only.
# Every param and resource is a function of the {platform} wildcard and the config, never of the host
# that planned the run. GPU jobs of one platform share the group gpu_<platform>: on a cluster
# (profiles/slurm) they run one after another in one allocation, and different platforms at once.
# Emulation jobs share the group cpu_emulate, which the profile batches a few to a submission.


for _variant in RUN_VARIANTS:

    rule:
        name:
            f"run_{_variant}"
        input:
            unpack(run_inputs(_variant, "gpu", rule_name=f"run_{_variant}")),
        output:
            [f"results/{{platform}}/{_variant}/{{dist}}/{shape}.json" for shape in variant_shapes(_variant, "gpu")],
        wildcard_constraints:
            platform=GPU_PLATFORM,
        params:
            **run_params(_variant, "gpu"),
        resources:
            **{name: gpu_resource(name) for name in GPU_RESOURCES},
        group:
            "gpu_{platform}"
        # among ready jobs, a GPU host's serial GPU jobs first (their inputs and sweep compiles: 20); harness/plan.py
        priority: run_priority(impl(_variant))
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/{{platform}}/{_variant}/{{dist}}.log",
        benchmark:
            benchmark_of(f"results/logs/{{platform}}/{_variant}/{{dist}}.log")
        script:
            "../scripts/run_variant.py"

    rule:
        name:
            f"emulate_{_variant}"
        input:
            unpack(run_inputs(_variant, "cpu", rule_name=f"emulate_{_variant}")),
        output:
            [f"results/{{platform}}/{_variant}/{{dist}}/{shape}.json" for shape in variant_shapes(_variant, "cpu")],
        wildcard_constraints:
            platform="cpu",
        params:
            **run_params(_variant, "cpu"),
        group:
            "cpu_emulate"
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/{{platform}}/{_variant}/{{dist}}.log",
        benchmark:
            benchmark_of(f"results/logs/{{platform}}/{_variant}/{{dist}}.log")
        script:
            "../scripts/run_variant.py"


# The shape zoo (config zoo): the same run, at the zoo's shapes and distributions, for its entries and
# their peers; `--forcerun run_<variant>_zoo` reruns one variant's zoo.
for _variant in [v for v in RUN_VARIANTS if zoo_shapes(v)]:

    rule:
        name:
            f"run_{_variant}_zoo"
        input:
            unpack(run_inputs(_variant, "gpu", zoo=True, rule_name=f"run_{_variant}_zoo")),
        output:
            [f"results/{{platform}}/{_variant}/{{dist}}/{shape}.json" for shape in zoo_shapes(_variant)],
        wildcard_constraints:
            platform=GPU_PLATFORM,
            dist="|".join(zoo_dists(_variant)),
        params:
            **run_params(_variant, "gpu", zoo=True),
        resources:
            **{name: gpu_resource(name) for name in GPU_RESOURCES},
        group:
            "gpu_{platform}"
        priority: run_priority(impl(_variant))
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/{{platform}}/{_variant}/{{dist}}_zoo.log",
        benchmark:
            benchmark_of(f"results/logs/{{platform}}/{_variant}/{{dist}}_zoo.log")
        script:
            "../scripts/run_variant.py"


rule measure_ceilings:
    input:
        code=import_closure(["harness.ceilings", "harness.device"], REPO, ["workflow/scripts/measure_ceilings.py"]),
    output:
        "results/{platform}/ceilings.json",
    wildcard_constraints:
        platform=GPU_PLATFORM,
    params:
        platform_spec=lambda wc: platform_spec(wc.platform),
        reps=config["timing"]["reps"],
    resources:
        **{name: gpu_resource(name) for name in GPU_RESOURCES},
    group:
        "gpu_{platform}"
    priority: GPU_PRIORITY
    conda:
        "../../envs/gpu.yaml"
    log:
        "results/logs/{platform}/ceilings.log",
    benchmark:
        benchmark_of("results/logs/{platform}/ceilings.log")
    script:
        "../scripts/measure_ceilings.py"
