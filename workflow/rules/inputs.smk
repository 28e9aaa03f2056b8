# Stage 1: deterministic inputs. One job per (distribution, shape) writes the unquantized float32
# operands and every format the configured variants need, each with a sha256 manifest.


rule build_inputs:
    input:
        code=lambda wc: format_code(wc.shape),
    output:
        fp32="results/inputs/{dist}/{shape}/fp32.pt",
        formats=directory("results/inputs/{dist}/{shape}/formats"),
        manifest="results/inputs/{dist}/{shape}/manifest.json",
    params:
        seed=config["seed"],
        formats=lambda wc: input_formats(wc.shape),
    conda:
        "../../envs/gpu.yaml"
    log:
        "results/logs/inputs/{dist}/{shape}.log",
    script:
        "../scripts/build_inputs.py"
