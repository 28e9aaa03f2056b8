# Stage 2: cross-compile each TileLang variant, on any host; records are per target, never per platform.
#   compile_<variant>:       every tile for every configured target at the sweeps.cpu_compile shapes
#                            (one process per variant keeps start-up costs down): proves each builds.
#   compile_<variant>_sweep: one tile for one target at every GPU shape it runs (those of its shape
#                            classes, when the variant's tiles are given per class); a GPU
#                            platform's run jobs need exactly these of their own arch, which they then
#                            load from the TileLang cache (a CPU node or a login node can build them).
# Both are of the group cpu_compile, so that on a cluster (profiles/slurm: group-components) a few of
# them share one submission instead of each paying a scheduler round trip and two parses of this
# workflow; run locally, groups are ignored.
# A known refusal (declared arch or shape rule, TileLang's refusal of a dtype there) is recorded as
# unsupported; any other error as failed, with its reason (harness/compile.py).


for _variant in [v for v in RUN_VARIANTS if is_tilelang(v)]:

    rule:
        name:
            f"compile_{_variant}"
        input:
            code=variant_code(_variant, "compile"),
        output:
            records=[f"results/compile/{_variant}/{t}/{tile}.json" for t, tile, _ in check_compile_jobs(_variant)],
            artifacts=directory(f"results/compile/{_variant}/artifacts"),
        params:
            variant=impl(_variant).name,
            # (target, tile, shapes) and the folder of its kernels, in the order of records
            jobs=check_compile_jobs(_variant),
            artifact_dirs=[f"results/compile/{_variant}/artifacts/{t}/{tile}" for t, tile, _ in check_compile_jobs(_variant)],
        group:
            "cpu_compile"
        # only the final tables need it: after everything the GPU's runs need, longest first (harness/plan.py)
        priority: longest_first(PLAN.check_compile_seconds(_variant), CHECK_PRIORITY)
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/compile/{_variant}.log",
        benchmark:
            benchmark_of(f"results/logs/compile/{_variant}.log")
        script:
            "../scripts/compile_kernel.py"

    rule:
        name:
            f"compile_{_variant}_sweep"
        input:
            code=variant_code(_variant, "compile"),
        output:
            records=[f"results/compile/{_variant}/{{target}}/sweep/{{tile}}.json"],
            artifacts=directory(f"results/compile/{_variant}/{{target}}/sweep/{{tile}}"),
        params:
            variant=impl(_variant).name,
            jobs=lambda wc, v=_variant: [(wc.target, wc.tile, sweep_shapes(v, wc.target, wc.tile))],
            artifact_dirs=lambda wc, output: [output.artifacts],
        group:
            "cpu_compile"
        # what a GPU host's TileLang run jobs need beside their inputs: in the GPU's queue order (harness/plan.py)
        priority: sweep_compile_priority(_variant)
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/compile/{_variant}/{{target}}/sweep/{{tile}}.log",
        benchmark:
            benchmark_of(f"results/logs/compile/{_variant}/{{target}}/sweep/{{tile}}.log")
        script:
            "../scripts/compile_kernel.py"
