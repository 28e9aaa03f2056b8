# Helpers shared by every stage. Config validation and planning (platforms, shapes, tiles, outputs) are
# plain Python in harness/plan.py; here they meet Snakemake: its errors become WorkflowErrors, and what
# needs the workflow (code inputs, report items, the profile rule's host check) is added. Everything a
# job needs is a function of the config and its wildcards; only run_on's `auto` looks at the planning host.
import contextlib
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)  # on sys.path first (the Snakefile puts it there)

from harness.cost import published_cost_files  # noqa: E402
from harness.jobs import benchmark_of  # noqa: E402
from harness.deps import import_closure  # noqa: E402
from harness.device import detect_gpu, matching_platforms  # noqa: E402
from harness.plan import (  # noqa: E402
    CHECK_PRIORITY, GPU_PRIORITY, ConfigError, Plan,
    UnplannedTarget, kind, longest_first, published_points, reference_signature, run_priority, sweep_record,
    tune_record, validate)
from harness.records import failure_lines  # noqa: E402
from harness.resume import CONFLICTING_TRIGGERS, Inputs, finished, incomplete_outputs, job_key  # noqa: E402
from harness.tables import profile_summary_files  # noqa: E402
from kernels.registry import FAMILY_MODULES, FORMATS  # noqa: E402


@contextlib.contextmanager
def config_errors():
    """The planning module's errors (harness/plan.py) reach the user as WorkflowErrors."""
    try:
        yield
    except (ConfigError, UnplannedTarget) as e:
        raise WorkflowError(str(e)) from None


with config_errors():
    # the costly check (it quantizes) only in the planning process: a job re-parsing this file on a node
    # reads the config its planner already checked
    validate(config, workflow.config_settings.overwrite_config, check_shapes=getattr(workflow, "is_main_process", True))
    PLAN = Plan(config)
RUN_ON = PLAN.run_on
RUN_VARIANTS = PLAN.entries
FAMILIES = PLAN.families
# the GPU rules' {platform}: a catalogue slug; the CPU emulation rules' {platform}: "cpu"
GPU_PLATFORM = "|".join(sorted(config["platforms"]))
# what the rules plan with (harness/plan.py)
impl, is_tilelang, variant_shapes, check_compile_jobs = PLAN.impl, PLAN.is_tilelang, PLAN.variant_shapes, PLAN.check_compile_jobs
tiles_for_shape, sweep_shapes, sweep_tiles, run_outputs = PLAN.tiles_for_shape, PLAN.sweep_shapes, PLAN.sweep_tiles, PLAN.run_outputs
peer_points, zoo_shapes, zoo_dists, zoo_layers = PLAN.peer_points, PLAN.zoo_shapes, PLAN.zoo_dists, PLAN.zoo_layers
tune_points, tune_outputs, tune_entries = PLAN.tune_points, PLAN.tune_outputs, PLAN.tune_entries
# the entries tune_<entry> exists for: TileLang entries whose kernel has a tile space (kernels/tile_space.py)
TUNABLE = [v for v in RUN_VARIANTS if is_tilelang(v) and impl(v).tile_space is not None]

# What each job costs is recorded beside its log, `benchmark: benchmark_of(<its log>)` in every rule
# (harness/cost.py; results/logs/<X>.log -> results/benchmarks/<X>.tsv, a wildcard pattern staying a pattern).


def job_benchmarks(platform, entries=None):
    """The benchmark files of the jobs a platform's tables are made of (of ``entries``, default all): its run
    jobs, the input and compile jobs they need, its ceilings and its tune jobs (whose records its runs may
    use). collect and publish_family read those present (harness/cost.py), as params, never as inputs: a
    benchmark file is an output of its job, and a missing output that a dependent asks for is a reason to
    run that job again (snakemake's dag.py, update_needrun), so every job of a run made before benchmarks
    were recorded would rerun."""
    gpu = kind(platform) == "gpu"
    builds = {s: f"build_inputs_{name}" for name, (_, shapes) in INPUT_SETS.items() for s in shapes}

    def bench(rule, **wildcards):
        return str(getattr(rules, rule).benchmark).format(**wildcards)

    files = []
    for f in run_outputs(platform, entries):
        _, _, entry, dist, name = f.split("/")
        shape = name.removesuffix(".json")
        run = f"run_{entry}_zoo" if gpu and shape in zoo_shapes(entry) else f"{'run' if gpu else 'emulate'}_{entry}"
        files += [bench(run, platform=platform, dist=dist), bench(builds[shape], dist=dist, shape=shape)]
    for f in compile_outputs(platform, entries):
        entry, target, *sweep, tile = Path(f).with_suffix("").parts[2:]
        files.append(bench(f"compile_{entry}_sweep", target=target, tile=tile) if sweep else bench(f"compile_{entry}"))
    if gpu:
        files.append(bench("measure_ceilings", platform=platform))
        files += [bench(f"tune_{e}", platform=platform) for e in TUNABLE if e in (entries or RUN_VARIANTS)]
    return sorted(set(files))


def platform_spec(platform):
    """A GPU platform's catalogue entry, checked for what planning it needs; every message names the key."""
    with config_errors():
        return PLAN.platform_spec(platform)


def run_arch(platform):
    with config_errors():
        return PLAN.run_arch(platform)


def compile_outputs(platform, entries=None):
    with config_errors():
        return PLAN.compile_outputs(platform, entries)


def family_entries(family):
    with config_errors():
        return PLAN.family_entries(family)


def physical_limits(platform):
    """The platform's datasheet limits (config platforms.<slug>), None for CPU emulation."""
    if platform == "cpu":
        return None
    platform_spec(platform)
    return datasheet(platform)


def gpu_resources(platform):
    """A GPU job's resources: one GPU (the local profile's gpu=1 keeps them one at a time) and its
    platform's cluster request (profiles/slurm turns these into sbatch flags)."""
    c = platform_spec(platform)["cluster"]
    return {"gpu": 1, "slurm_partition": c["partition"], "gpu_model": c.get("gpu_model"),
            "constraint": c.get("constraint"), "runtime": c["runtime"], "mem_mb": c["mem_mb"],
            "cpus_per_task": c.get("cpus_per_task", 1)}


GPU_RESOURCES = ("gpu", "slurm_partition", "gpu_model", "constraint", "runtime", "mem_mb", "cpus_per_task")


def gpu_resource(name):
    return lambda wc: gpu_resources(wc.platform)[name]


FIGURES = ["headline", "throughput", "speedup", "roofline", "weight_bandwidth", "accuracy", "compile_matrix", "comparison"]

wildcard_constraints:
    platform="[a-z0-9]+",
    family="[a-z0-9]+",
    target="sm_[0-9]+a?",
    dist="[a-z0-9_]+",
    # canonical positive integers only: 0x64x128 or 064x64x128 match no rule
    shape="[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*",
    tile="[a-z0-9_]+",


def _module_of(obj):
    while hasattr(obj, "func"):  # functools.partial
        obj = obj.func
    return obj.__module__


# Snakemake reruns a job when its script changes, not when code it imports does: a job's code inputs
# are the import closure (harness/deps.py) of the modules it uses and of its script's imports, so
# editing any module a job reaches, directly or not, reruns that job.
STAGE_CODE = {"compile": (["harness.compile"], ["workflow/scripts/compile_kernel.py"]),
              "run": (["harness.compile", "harness.runner", "harness.bench", "harness.metrics", "harness.inputs",
                       "harness.device", "harness.stats", "harness.power"],
                      ["workflow/scripts/compile_kernel.py", "workflow/scripts/run_variant.py"]),
              "inputs": (["harness.inputs"], ["workflow/scripts/build_inputs.py"])}


def _format_modules(fmt):
    return {_module_of(f) for f in (FORMATS[fmt].quantize, FORMATS[fmt].dequantize)}


def variant_code(variant, stage):
    """Code inputs of a variant's compile or run job."""
    v = impl(variant)
    own = {_module_of(f) for f in (v.launch, v.emulate, v.kernel) if f is not None} | _format_modules(v.input_format)
    modules, scripts = STAGE_CODE[stage]
    return import_closure(sorted(own | set(modules)), REPO, scripts)


def script_code(script):
    """Code inputs of a collect or report job: its script's import closure and every family module
    (registry.load_all imports them by name, which the closure cannot see)."""
    return import_closure(list(FAMILY_MODULES), REPO, [f"workflow/scripts/{script}"])


def format_code(formats):
    """Code inputs of an inputs job: the modules of the formats it writes."""
    modules, scripts = STAGE_CODE["inputs"]
    own = set().union(*(_format_modules(f) for f in formats))
    return import_closure(sorted(own | set(modules)), REPO, scripts)


# Finished run jobs (harness/resume.py): a job whose records all carry its current key asks for its code
# alone, marked ancient, so nothing upstream of it is needed or can make it run again. Only where snakemake's
# `input` and `code` rerun triggers are off (the profiles turn them off: the key covers both), and never for
# a job the command line forces (-F, -f, -R naming its rule or an output).
# (snakemake attaches its DAG settings after parsing this file, before it calls input functions)
_RESUME = {}


def resumable():
    """Whether finished run jobs may be skipped, and the outputs snakemake marks incomplete (once per run)."""
    if not _RESUME:
        dag = getattr(workflow, "dag_settings", None)
        ok = dag is not None and not {t.name.lower() for t in dag.rerun_triggers} & set(CONFLICTING_TRIGGERS)
        _RESUME.update(ok=ok, incomplete=incomplete_outputs() if ok else set())
    return _RESUME["ok"], _RESUME["incomplete"]


def forced(rule_name, outputs):
    dag = workflow.dag_settings
    if dag.forceall or dag.forcetargets:
        return True
    named = {str(x) for x in (dag.forcerun or ())}
    return rule_name in named or not named.isdisjoint(outputs)


def run_shapes(variant, kind, zoo):
    """The shapes of one run job: the variant's sweep of its platform kind, or (``zoo``) its zoo shapes."""
    return zoo_shapes(variant) if zoo else variant_shapes(variant, kind)


def input_files(dist, shape, fmt):
    """The input files a run reads at one shape (inputs.smk writes them): fp32, format ``fmt``'s, the manifest."""
    folder = f"results/inputs/{dist}/{shape}"
    return f"{folder}/fp32.pt", f"{folder}/formats/{fmt}.pt", f"{folder}/manifest.json"


def run_is_finished(rule_name, variant, kind, zoo, wc):
    ok, incomplete = resumable()
    shapes = run_shapes(variant, kind, zoo)
    outputs = [f"results/{wc.platform}/{variant}/{wc.dist}/{s}.json" for s in shapes]
    if not ok or forced(rule_name, outputs):
        return False
    fmt = impl(variant).input_format
    inputs = [Inputs(manifest, fmt, (fp32, fmt_file))
              for fp32, fmt_file, manifest in (input_files(wc.dist, s, fmt) for s in shapes)]
    return finished(outputs, run_key(variant, kind, zoo)(wc), incomplete, inputs)


def run_inputs(variant, kind, zoo=False, rule_name=None):
    """All shapes of one (variant, distribution) (``zoo``: its zoo shapes): inputs, the code they depend on,
    and on a GPU platform its own arch's kernels compiled at those shapes (nothing of any other target);
    for a finished job, its code alone (above)."""
    def inputs(wc):
        if run_is_finished(rule_name, variant, kind, zoo, wc):
            return {"code": [ancient(f) for f in variant_code(variant, "run")]}
        fp32, formats, manifests = zip(*(input_files(wc.dist, s, impl(variant).input_format)
                                         for s in run_shapes(variant, kind, zoo)))
        files = {"fp32": list(fp32), "formats": list(formats), "manifest": list(manifests),
                 "code": variant_code(variant, "run")}
        arch = run_arch(wc.platform)
        if arch is not None and is_tilelang(variant):
            files["compiled"] = [sweep_record(variant, arch, t) for t in sweep_tiles(variant, arch)]
        if arch is not None:  # paired timing: each peer's own run (its checks, its fastest tile) and its inputs
            peers = [p for roles in peer_points(variant, wc.platform, wc.dist).values() for p in roles.values()]
            files["peer_runs"] = sorted({p["record"] for p in peers})
            files["peer_formats"] = sorted({p["format_file"] for p in peers})
        return files
    return inputs


def tile_choices(variant, platform, shapes):
    """{shape: {"tiles", "source", "record", "why"}} of the shapes whose tiles are selected (harness/selection.py)."""
    arch = run_arch(platform)
    return {s: vars(PLAN.choice(variant, platform, s)) for s in shapes if PLAN.selects(variant, arch)}


def run_params(variant, kind, zoo=False):
    """A run job's params. Snakemake reruns a job whose params change, so a CPU emulation gets none of what
    only a GPU run uses (timing, tiles, peers): changing those never reruns it. ``zoo``: the zoo's shapes."""
    gpu = kind == "gpu"
    shapes = run_shapes(variant, kind, zoo)
    return {"variant": impl(variant).name, "entry": variant, "shapes": shapes,
            "tolerance": config["variants"][variant]["tolerance"], "timing": config["timing"] if gpu else None,
            "platform_spec": (lambda wc: platform_spec(wc.platform)) if gpu else None,
            "arch": (lambda wc: run_arch(wc.platform)) if gpu else None,
            # shape -> the tiles of its class
            "tiles": (lambda wc: {s: tiles_for_shape(variant, run_arch(wc.platform), s, wc.platform) for s in shapes})
            if gpu else {},
            # shape -> where its tiles come from (tuned record, model), for the run record
            "tile_choice": (lambda wc: tile_choices(variant, wc.platform, shapes)) if gpu else {},
            # shape -> the zoo layers it is (model and layer)
            "zoo": {s: zoo_layers()[s] for s in shapes if s in zoo_layers()} if gpu else {},
            # shape -> role -> the peer's entry, run record and input file (paired timing)
            "peers": (lambda wc: peer_points(variant, wc.platform, wc.dist)) if gpu else {},
            # what every record of the job is stamped with (harness/resume.py)
            "job_key": run_key(variant, kind, zoo)}


_RUN_KEYS = {}


def run_key(variant, kind, zoo=False):
    """wc -> a run job's key: its other params resolved, its code's content, the inputs' seed (harness/resume.py)."""
    def key(wc):
        cached = (variant, kind, zoo, wc.platform, wc.dist)
        if cached not in _RUN_KEYS:
            params = {k: (v(wc) if callable(v) else v) for k, v in run_params(variant, kind, zoo).items() if k != "job_key"}
            _RUN_KEYS[cached] = job_key(params, variant_code(variant, "run"), seed=config["seed"],
                                        platform=wc.platform, dist=wc.dist)
        return _RUN_KEYS[cached]
    return key


def ceilings_input(wc):
    return [f"results/{wc.platform}/ceilings.json"] if kind(wc.platform) == "gpu" else []


def report_outputs(folder):
    return {name: report(f"{folder}/figures/{name}.png", caption=f"../report/{name}.rst", category="lpgemm")
            for name in FIGURES}


def datasheet(folder):
    """The datasheet limits of the platform a result folder is named after (None if it names none)."""
    spec = config["platforms"].get(Path(str(folder)).name)
    return {k: spec[k] for k in ("name", "peak", "hbm_TBps", "source")} if spec else None


def report_params(result_dir, label, references):
    """``result_dir``, ``label``: strings or functions of the wildcards; ``references``: (folder, label)."""
    return {"result_dir": result_dir, "label": label, "references": references,
            "limits": lambda wc: {str(d): datasheet(d) for d in
                                  [result_dir(wc) if callable(result_dir) else result_dir, *(d for d, _ in references)]},
            "regression_threshold": config["report"]["regression_threshold"],
            "captions": {n: (REPO / "workflow/report" / f"{n}.rst").read_text().strip() for n in FIGURES}}


INPUT_SETS = PLAN.input_sets()


def input_priority(wc):
    """An input build's place among the CPU jobs: by the first GPU run job in the GPU's queue that needs it
    (harness/plan.py Plan.cpu_priority)."""
    job = ("inputs", wc.dist, wc.shape)
    return PLAN.cpu_priority(job, PLAN.cpu_job_seconds(job))


def sweep_compile_priority(variant):
    """A sweep compile's place among the CPU jobs: by the first GPU run job in the GPU's queue that needs it
    (harness/plan.py Plan.cpu_priority)."""
    def priority(wc):
        job = ("sweep", variant, wc.target, wc.tile)
        return PLAN.cpu_priority(job, PLAN.cpu_job_seconds(job))
    return priority


def published_platform_points(platform):
    """The committed points of results/published/<platform>, or an error saying how to publish some."""
    points = published_points(f"results/published/{platform}")
    if not points:
        raise WorkflowError(f"results/published/{platform}/points: no published points; publish a family first, "
                            f"e.g. snakemake results/published/{platform}/points/{FAMILIES[0]}")
    return points


def host_platform():
    """The catalogue slug of this planning host's GPU ("cpu" without one, None if no entry matches)."""
    gpu = detect_gpu()
    if gpu is None:
        return "cpu"
    found = matching_platforms(gpu["gpu_name"], config["platforms"])
    return found[0] if len(found) == 1 else None


def profile_inputs(wc):
    """A profile's inputs: the point's input files, and for a TileLang entry its compile record and
    artifacts at this shape. Refuses, before anything runs, a point the entry does not time on that
    platform, and a local run on a host without that GPU (a cluster job is checked where it lands)."""
    where = f"results/{wc.platform}/profile/{wc.entry}/{wc.dist}/{wc.shape}/{wc.tile}"
    with config_errors():
        PLAN.check_profile_point(wc.platform, wc.entry, wc.dist, wc.shape, wc.tile)
    arch = run_arch(wc.platform)
    if workflow.local_exec and (here := host_platform()) != wc.platform:
        gpu = detect_gpu()
        raise WorkflowError(f"{where}: profiling runs on a {wc.platform} GPU (config platforms.{wc.platform}.match), "
                            f"and this host has {repr(gpu['gpu_name']) if gpu else 'no GPU'}; nothing was run. Run it on "
                            f"a {wc.platform} host, or through a cluster profile (--profile profiles/slurm)")
    files = {"fp32": f"results/inputs/{wc.dist}/{wc.shape}/fp32.pt",
             "formats": f"results/inputs/{wc.dist}/{wc.shape}/formats/{impl(wc.entry).input_format}.pt",
             "manifest": f"results/inputs/{wc.dist}/{wc.shape}/manifest.json",
             "code": variant_code(wc.entry, "run") + import_closure(["harness.profile"], REPO,
                                                                     ["workflow/scripts/profile_point.py"])}
    if is_tilelang(wc.entry):
        files["compiled"] = sweep_record(wc.entry, arch, wc.tile)
        files["artifacts"] = f"results/compile/{wc.entry}/{arch}/sweep/{wc.tile}"
    return files


def profile_summaries(folder):
    """The profile summaries present in a result folder (a report lists every one)."""
    return [str(p) for p in profile_summary_files(folder)]


def report_failures(limit=40):
    """After a run (onsuccess and onerror): every failed row of the planned platforms' results and every
    failed compile record, with the log that holds its traceback, and every unreadable one with its fix,
    on the console (harness/records.py: failure_lines); the failed jobs' logs are shown by Snakemake itself
    (show-failed-logs in the profiles)."""
    try:
        runs = [f for platform in RUN_ON for f in run_outputs(platform)]
        compiled = sorted({f for platform in RUN_ON for f in compile_outputs(platform)})
        lines = failure_lines(runs, compiled, limit)
    except Exception as e:  # the summary must never hide the run's own outcome
        lines = [f"lpgemm: no failure summary ({type(e).__name__}: {e})"]
    if lines:
        print(*lines, sep="\n", file=sys.stderr)
