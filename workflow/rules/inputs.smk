# Stage 1: deterministic inputs. One job per (distribution, shape) writes the unquantized float32
# operands and every format the configured variants need at that shape, each a file of its own with
# its sha256 in the manifest (so the scheduler sees each file, and a run job proves what it read).
# Shapes needing the same formats share a rule (the outputs of a rule are fixed): build_inputs_<the
# families whose formats it writes>, e.g. build_inputs_blockscaled_fp8 for the DeepSeek shapes.


for _name, (_formats, _shapes) in INPUT_SETS.items():

    rule:
        name:
            f"build_inputs_{_name}"
        input:
            code=format_code(_formats),
        output:
            fp32="results/inputs/{dist}/{shape}/fp32.pt",
            formats=[f"results/inputs/{{dist}}/{{shape}}/formats/{f}.pt" for f in _formats],
            manifest="results/inputs/{dist}/{shape}/manifest.json",
        wildcard_constraints:
            shape="|".join(_shapes),
        params:
            seed=config["seed"],
            formats=list(_formats),
        # a GPU host's run jobs start as early as possible (harness/plan.py GPU_PRIORITY), so what they need comes
        # first, in the order the GPU's queue needs it (harness/plan.py Plan.gpu_queue). One thread each (the values
        # do not depend on it): snakemake's scheduler maximises the sum of its jobs' priorities, so a job of more
        # threads than others of its priority waits until they are all done
        priority: input_priority
        conda:
            "../../envs/gpu.yaml"
        log:
            "results/logs/inputs/{dist}/{shape}.log",
        benchmark:
            benchmark_of("results/logs/inputs/{dist}/{shape}.log")
        script:
            "../scripts/build_inputs.py"
