# Stage 2: cross-compile each TileLang variant, every tile for every configured target, on any host
# (one rule per variant, compile_<variant>; one process per variant keeps start-up costs down).
# A GPU host compiles its own arch at every shape it runs; every other target, and every target on a
# CPU-only host, at the sweeps.cpu_compile shapes only (enough to prove the kernel builds).
# A known refusal (declared arch or shape rule, TileLang's refusal of a dtype there) is recorded as
# unsupported; any other error as failed, with its reason (kernels/compile.py).


for _variant in [v for v in RUN_VARIANTS if is_tilelang(v)]:

    rule:
        name:
            f"compile_{_variant}"
        input:
            code=variant_code(_variant, "compile"),
        output:
            records=[f"results/{{platform}}/compile/{_variant}/{t}/{tile}.json"
                     for t in TARGETS for tile in tiles_for(_variant, t)],
            artifacts=directory(f"results/{{platform}}/compile/{_variant}/artifacts"),
        params:
            variant=impl(_variant).name,
            # (target, tile, shapes), in the order of records
            jobs=variant_compile_jobs(_variant),
        conda:
            "../../envs/gpu.yaml"
        log:
            f"results/logs/{{platform}}/compile/{_variant}.log",
        script:
            "../scripts/compile_kernel.py"
