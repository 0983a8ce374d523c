# tiecli --help   (entry point of the `tiecli` command and of `python -m tiecli`)
"""The command line: each command composes its config, finds its run directory and calls one function.

Heavy imports (torch) happen inside the commands, so `tiecli --help` answers at once.
"""

import contextlib
import difflib
import json
import re
import shlex
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from omegaconf import OmegaConf
from rich.console import Console
from rich.markup import escape

from tiecli import display, rundir
from tiecli.errors import ConfigError, TiecliError

app = typer.Typer(
    help="Train GPT-style models with the input embedding and output matrix tied or not, and compare them.\n\n"
    "Example: tiecli train tying=untied model=small",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help and usage errors: the error stays on one line, unboxed
)
console = Console()
err_console = Console(stderr=True)

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides: GROUP=CHOICE or KEY=VALUE, e.g. tying=untied train.lr=1e-3", show_default=False
    ),
]
ConfigDir = Annotated[
    Path | None,
    typer.Option(
        "--config-dir",
        help="A folder of your own config files: they add to tiecli's conf/ (e.g. model/huge.yaml) and replace its files of the same name",
    ),
]
# `tiecli train`'s and `tiecli geometry`'s longer options.
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue a run from its last checkpoint with its own config: "
        "`--resume RUN_DIR`, or `--name NAME --resume`; overrides may extend it (train.max_steps=...)",
    ),
]
Nproc = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        min=1,
        help="Train data-parallel on N processes of this machine: starts torchrun --nproc_per_node N "
        "(one GPU each on CUDA, gloo on CPU); the global batch stays train.batch_size x train.grad_accum",
    ),
]
WriteEntry = Annotated[
    bool,
    typer.Option("--write", help="Also record the entry in the run's geometry.json (replacing one for the same step)"),
]
# `tiecli sweep`'s options, named here so the command reads as its list of settings.
LauncherName = Annotated[
    str,
    typer.Option(
        "--launcher",
        help="basic (subprocesses here), submitit_local (submitit, here) or submitit_slurm (one SLURM job array); "
        "settings: conf/launcher/NAME.yaml, changed with launcher.KEY=VALUE",
    ),
]
GpusPerJob = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-job",
        min=1,
        help="GPUs per job (CUDA_VISIBLE_DEVICES, round-robin); more than 1 runs the job under torchrun",
        show_default=False,
    ),
]
StatusOf = Annotated[
    str | None,
    typer.Option(
        "--status", metavar="NAME", help="Show sweep NAME's jobs (state, job id, step, losses); submit nothing"
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the jobs, their run directories, steps, tokens, evaluations, disk use and the "
        "wall time estimated from a few steps measured here, and the total; run and write nothing",
    ),
]
Estimate = Annotated[
    bool, typer.Option("--estimate/--no-estimate", help="With --dry-run: time a few steps per model size here")
]
RunsDir = Annotated[
    Path, typer.Option("--runs-dir", help="Folder where a bare run NAME is looked up (RUN may also be a path)")
]
Multirun = Annotated[bool, typer.Option("-m", "--multirun", hidden=True, help="Hydra's multirun: tiecli sweep does it")]
# tiecli report's options, named here so that its signature reads as a list
Select = Annotated[
    list[str] | None,
    typer.Option(
        "--select",
        help="A dotted key (train.lr) whose best value, by seed-mean final val loss, "
        "is kept per group; the others are listed as not selected. Repeatable",
    ),
]
Sesoi = Annotated[
    list[str] | None,
    typer.Option(
        "--sesoi",
        help="Smallest effect of interest, KEY=VALUE: ppl (% perplexity, default 1), "
        "cos (default 0.05), cka (default 0.05), drift and gnorm (% of a tied/untied ratio, default 10), "
        "spikes (loss spikes per run, default 1). Repeatable",
    ),
]
TargetLoss = Annotated[
    float | None,
    typer.Option(
        "--target-loss",
        help="A fixed convergence target (val loss, nats) for every "
        "pair (default: per pair, the higher of the two groups' best losses)",
    ),
]
Family = Annotated[
    list[str] | None,
    typer.Option(
        "--family",
        help="A Holm family, NAME=CLAIM[,CLAIM...], replacing the families the sweeps declared "
        "(default: one per claim). Repeatable",
    ),
]
ReportRunsDir = Annotated[
    Path, typer.Option("--runs-dir", help="Folder where a bare name (a run, sweeps/NAME) is looked up")
]


@contextlib.contextmanager
def user_errors():
    """A TiecliError, or an error of the operating system, becomes one line on stderr and an exit code; no traceback."""
    try:
        yield
    except TiecliError as e:
        if e.exit_code == 130:  # stopped on request (Ctrl-C, SIGTERM): what happened, not an error
            err_console.print(escape(str(e)), highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
        fail(str(e), e.exit_code)
    except OSError as e:  # disk full, read-only folder, a name too long, a file where a folder should be
        where = f": {e.filename}" if e.filename else ""
        fail(f"{e.strerror or type(e).__name__}{where}", 1)
    except MemoryError:
        fail("out of memory; use a smaller train.batch_size or model", 1)
    except RuntimeError as e:
        if "allocate" not in str(e) and "out of memory" not in str(e):
            raise
        size = re.search(r"tried to allocate (\d+) bytes", str(e))  # torch's CPU allocator; CUDA's line says it in MiB
        detail = f"tried to allocate {int(size.group(1)) / 2**30:.1f} GiB" if size else str(e).splitlines()[0][:160]
        fail(f"out of memory ({detail}); use a smaller train.batch_size or model", 1)


def fail(message: str, code: int):
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def show_version(value: bool):
    if value:
        from tiecli import __version__

        print(f"tiecli {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=show_version, is_eager=True, help="Print the version and exit")
    ] = False,
):
    """Train GPT-style models with the input embedding and output matrix tied or not, and compare them.

    Example: tiecli train tying=untied model=small
    """


@app.command()
def train(
    overrides: Overrides = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="Run directory name: letters, digits, . _ - and / to nest it in a folder "
            "(default: the group choices, the seed and a hash of any other overrides)"
        ),
    ] = None,
    resume: Resume = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Folder that holds run directories")] = Path("runs"),
    config_dir: ConfigDir = None,
    nproc: Nproc = None,
    multirun: Multirun = False,
):
    """Train one model and evaluate it into runs/<name>/.

    Example: tiecli train tying=untied model=small train.max_steps=500
    """
    overrides = list(overrides or [])
    with user_errors():
        from tiecli import distributed
        from tiecli import resume as resuming
        from tiecli.config.checks import to_config

        runs_dir, name = run_place(overrides, resume, runs_dir, name, multirun)

        def plan():
            if resume:
                return resuming.plan(runs_dir, name, overrides, config_dir, nproc or distributed.world_size())
            return plan_new_run(runs_dir, name, overrides, config_dir)

        if nproc is not None and not distributed.launched():  # check everything once, then start the ranks
            path, cfg, _ = plan()
            if path is not None:
                distributed.rank_shape(to_config(cfg).train, nproc)
                args = [*overrides, "--runs-dir", str(runs_dir), *(["--name", name] if name else [])]
                raise typer.Exit(start_ranks(nproc, args, resume, config_dir))
            return
        with distributed.process_group(), distributed.quiet_others():
            path, cfg, files = distributed.from_rank0(plan)  # rank 0 plans; a refusal is every rank's
            if path is None:
                return
            run_config = to_config(cfg)
            summary = run_training(run_config, path, resume, files, config_dir)
        if summary is not None:  # None on ranks other than 0: rank 0 reports
            show_trained(path, summary, run_config)


def run_place(overrides: list[str], resume: bool, runs_dir: Path, name: str | None, multirun: bool):
    """(runs_dir, name) of the run to train: `--resume runs/NAME` (or a bare NAME in --runs-dir) pops the
    run's path from the overrides; -m and an empty --name are refused."""
    if multirun:
        raise ConfigError(
            f"-m: tiecli train trains one run; for several, `{shlex.join(['tiecli', 'sweep', *overrides])}`"
        )
    if resume and overrides and "=" not in overrides[0]:  # tiecli train --resume runs/NAME [OVERRIDES]
        run_arg = Path(overrides.pop(0))
        if not rundir.is_run_dir(run_arg) and rundir.is_run_dir(runs_dir / run_arg):  # a bare NAME in --runs-dir
            run_arg = runs_dir / run_arg
        runs_dir, name = run_arg.parent, run_arg.name
    if name is not None and not name.strip():
        raise TiecliError("--name is empty; give a name, or leave --name out for the default")
    return runs_dir, name


def run_training(run_config, path: Path, resume: bool, files, config_dir: Path | None):
    """tiecli.train.train, with the resume command added to a stop's line (rank 0's)."""
    from tiecli import distributed
    from tiecli.train import train as train_run

    try:
        return train_run(run_config, path, resume, files)
    except TiecliError as e:
        if e.exit_code == 130 and rundir.is_run_dir(path) and distributed.is_rank0():
            raise type(e)(f"{e}\nresume with: {resume_command(path, config_dir)}") from None
        raise


def resume_command(path: Path, config_dir: Path | None) -> str:
    """The command that continues this run, to copy and paste: relative to here when it lies below."""
    from tiecli import distributed

    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    world = distributed.world_size()
    args = ["tiecli", "train", "--resume", str(shown), *(["--nproc", str(world)] if world > 1 else [])]
    return shlex.join(args + (["--config-dir", str(config_dir)] if config_dir else []))


def start_ranks(nproc: int, args: list[str], resume: bool, config_dir: Path | None) -> int:
    """`tiecli train --nproc N`: the same command under torchrun, on N processes; their exit code."""
    from tiecli import distributed

    args = [*args, *(["--resume"] if resume else []), *(["--config-dir", str(config_dir)] if config_dir else [])]
    return distributed.torchrun(nproc, ["train", *args])


def show_trained(path: Path, summary, run_config) -> None:
    """After training: the summary, the last geometry, where the run is and, with train.sample_tokens, a sample."""
    console.print(display.summary_table(summary))
    entries = rundir.RunReader(path).geometry()
    if entries:
        console.print(display.geometry_table(entries[-1].to_dict(), f"geometry at step {summary.step}"))
    console.print(f"run directory: {path}", highlight=False, soft_wrap=True)
    if run_config.train.sample_tokens:  # what `tiecli sample RUN --max-new-tokens N` prints, from the checkpoint
        from tiecli.sample import DEFAULT_PROMPT, Options, prepare

        n = run_config.train.sample_tokens
        stream_sample(prepare(path, run_config, "latest", Options(DEFAULT_PROMPT, 1, n, 0.8, 200, 1.0, 0)))


def plan_new_run(runs_dir: Path, name: str | None, overrides: list[str], config_dir: Path | None):
    """The path, config and files of a new run; refuses a name taken by a run worth keeping."""
    from tiecli.config.compose import compose, to_yaml
    from tiecli.config.naming import check_name, run_name

    cfg, choices = compose(overrides, config_dir)
    path = rundir.run_path(runs_dir, name if name is not None else run_name(choices, cfg, overrides))
    if name is not None:  # after run_path's checks (length, leaving runs_dir); --resume takes older names as they are
        check_name(name)
    if rundir.is_run_dir(path) and not rundir.discard_unstarted(path):
        raise TiecliError(
            f"run {path.name!r} already exists in {str(runs_dir)!r}; add --resume to continue it or --name for a new one"
        )
    files = {
        rundir.CONFIG: to_yaml(cfg),
        rundir.OVERRIDES: OmegaConf.to_yaml({"overrides": overrides, "choices": choices}),
    }
    return path, cfg, files


class Split(str, Enum):
    val = "val"
    test = "test"
    train = "train"


@app.command("eval")
def eval_(
    run: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/micro-tied-bpe4096-shakespeare-s0")],
    split: Annotated[
        Split,
        typer.Option(
            help="Split to evaluate: val or test in full; train in full when it is at most "
            "4 times the validation split, else a fixed evenly spaced subset of that size"
        ),
    ] = Split.val,
    step: Annotated[
        str,
        typer.Option(
            help="latest (last.pt; recorded in eval.json), or a step with a full checkpoint "
            "(train.keep_checkpoints keeps them): printed only"
        ),
    ] = "latest",
    runs_dir: RunsDir = Path("runs"),
):
    """Reload a run's checkpoint; report loss, perplexity, bits per byte and perplexity by token frequency on a split.

    Example: tiecli eval runs/micro-tied-bpe4096-shakespeare-s0 --split test
    """
    with user_errors():
        from tiecli.evaluate import evaluate_run
        from tiecli.sample import check_step

        check_step(step)
        run = find_run(run, runs_dir)
        run_config = load_run_config(run)

        result = evaluate_run(run, run_config, split.value, step)
        console.print(display.eval_table(asdict(result), f"{run.name}: {split.value} at step {result.step}"))


@app.command()
def info(
    overrides: Overrides = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of YAML and a table")] = False,
    config_dir: ConfigDir = None,
):
    """Show the composed config and the parameter count by part, without training.

    Example: tiecli info model=gpt2 tokenizer=gpt2 tying=tied
    """
    with user_errors():
        from tiecli.config.checks import to_config
        from tiecli.config.compose import compose, to_yaml

        cfg, choices = compose(overrides or [], config_dir)
        run_config = to_config(cfg)
        from tiecli.model import count_params

        counts = count_params(run_config.model)
        if as_json:
            print(
                json.dumps(
                    {"choices": choices, "config": OmegaConf.to_container(cfg, resolve=True), "params": counts},
                    indent=2,
                )
            )
            return
        console.print(to_yaml(cfg), highlight=False, markup=False)
        console.print(display.params_table(counts, f"parameters ({', '.join(f'{k}={v}' for k, v in choices.items())})"))


@app.command()
def geometry(
    run: Annotated[
        Path | None, typer.Argument(help="A run directory (or --model PATH instead)", show_default=False)
    ] = None,
    model: Annotated[
        str | None,  # a str, not a Path: Path("") would read as "." and hide an empty value
        typer.Option(
            "--model",
            help="A pretrained model instead of a run: a .gguf file or a Hugging Face folder with config.json and "
            "*.safetensors; only its token matrices and vocabulary are read",
        ),
    ] = None,
    step: Annotated[
        str,
        typer.Option(help="latest (the last checkpoint), init (step 0), or a step with a snapshot in checkpoints/emb/"),
    ] = "latest",
    pairs: Annotated[
        Path | None,
        typer.Option(
            help="Related word forms: a UTF-8 file, one tab-separated pair a line "
            "(default: the run's diag.pairs; with --model, the shipped en)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the entry as JSON instead of a table")] = False,
    write: WriteEntry = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="With --model: write DIR/pretrained.json, which `tiecli report DIR ...` shows as a reference row"
        ),
    ] = None,
    runs_dir: RunsDir = Path("runs"),
):
    """Recompute the geometry of a run's token matrices from its checkpoint, or measure a pretrained model's.

    Example: tiecli geometry runs/micro-untied-bpe4096-shakespeare-s0 --pairs ru_pairs.tsv

    Example: tiecli geometry --model SmolLM2-135M-Instruct.Q4_1.gguf --out refs/smollm2
    """
    with user_errors():
        check_geometry_args(run, model, step, write, out)
        if model is not None:
            show_pretrained(Path(model), pairs, out, as_json)
            return
        assert run is not None  # check_geometry_args: a RUN or --model
        run = find_run(run, runs_dir)
        run_config = load_run_config(run)
        from tiecli.diagnostics import geometry_of_run

        entry = geometry_of_run(run, run_config, step, str(pairs) if pairs else None, write)
        if as_json:
            print(json.dumps(entry.to_dict(), indent=2))
        else:
            console.print(display.geometry_table(entry.to_dict(), f"{run.name}: geometry at step {entry.step}"))


def check_geometry_args(run: Path | None, model: str | None, step: str, write: bool, out: Path | None) -> None:
    """geometry measures a RUN, or with --model a pretrained model; the options of the one refused with the other."""
    if model is not None:
        if not model.strip():
            raise ConfigError(
                "--model is empty; give a .gguf file or a Hugging Face folder (config.json, *.safetensors)"
            )
        if run is not None or step != "latest" or write:
            raise ConfigError("--model measures a pretrained model: give it without a RUN, --step or --write")
    elif run is None:
        raise ConfigError("give a RUN directory, or --model PATH for a pretrained model")
    elif out is not None:
        raise ConfigError("--out is for --model; a run's entry goes into its own geometry.json with --write")


def show_pretrained(model: Path, pairs: Path | None, out: Path | None, as_json: bool) -> None:
    """`tiecli geometry --model`: measure a pretrained model's token matrices, print them, and write them with --out."""
    from tiecli import pretrained

    measured = pretrained.geometry_of_model(model, pairs, out)
    if as_json:
        print(json.dumps(measured, indent=2))
        return
    for line in pretrained.summary_lines(measured):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(pretrained.table(measured))
    if out is not None:
        console.print(f"written: {out / pretrained.PRETRAINED_FILE}", highlight=False, soft_wrap=True)


class ExportTarget(str, Enum):
    hf = "hf"
    safetensors = "safetensors"


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A run directory with a checkpoint")],
    out_dir: Annotated[
        Path, typer.Argument(help="Folder to write (created; refused if it holds files, unless --force)")
    ],
    to: Annotated[
        ExportTarget,
        typer.Option(
            help="hf: a transformers GPT2LMHeadModel folder with tokenizer.json; "
            "safetensors: tiecli's own state dict with the run's config as metadata"
        ),
    ] = ExportTarget.hf,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT_DIR if it already holds files")] = False,
    runs_dir: RunsDir = Path("runs"),
):
    """Export a run's last checkpoint for transformers (AutoModelForCausalLM) or as plain safetensors.

    Example: tiecli export runs/micro-tied-bpe4096-shakespeare-s0 --to hf exported/micro-tied
    """
    with user_errors():
        run = find_run(run, runs_dir)
        run_config = load_run_config(run)
        from tiecli.export import export_run

        result = export_run(run, run_config, to.value, out_dir, force)
        check = f"; logits match tiecli's to {result['max_logit_diff']:.2g}" if "max_logit_diff" in result else ""
        console.print(
            f"exported {run.name} (step {result['step']}, {result['tying']}) to {out_dir}: "
            f"{', '.join(result['files'])}{check}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


@app.command()
def sample(
    run: Annotated[Path, typer.Argument(help="A run directory with a checkpoint")],
    prompt: Annotated[str | None, typer.Option(help="Text to continue (default: a newline)")] = None,
    prompt_file: Annotated[Path | None, typer.Option(help="Read the prompt from this UTF-8 file")] = None,
    num_samples: Annotated[int, typer.Option(help="Samples to draw")] = 1,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate per sample")] = 200,
    temperature: Annotated[
        float, typer.Option(help="Divide the logits by this; 0 always takes the most likely token")
    ] = 0.8,
    top_k: Annotated[int, typer.Option(help="Sample among the k most likely tokens only (0: every token)")] = 200,
    top_p: Annotated[
        float, typer.Option(help="Sample among the fewest most likely tokens that reach this probability (1: all)")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seeds the samples: the same seed gives the same text")] = 0,
    step: Annotated[str, typer.Option(help="latest, or the step of the run's checkpoint")] = "latest",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON with the token ids and each token's log-probability")
    ] = False,
    compare: Annotated[
        Path | None, typer.Option(help="A second run, sampled with the same prompt and seed, printed side by side")
    ] = None,
    runs_dir: RunsDir = Path("runs"),
):
    """Generate text from a run's checkpoint (every tying mode); the same seed gives the same text.

    Example: tiecli sample runs/micro-tied-bpe4096-shakespeare-s0 --prompt "ROMEO:" --num-samples 3
    """
    with user_errors():
        from tiecli.sample import Options, check_step, prepare, read_prompt, sample_run

        options = Options(
            read_prompt(prompt, prompt_file), num_samples, max_new_tokens, temperature, top_k, top_p, seed
        )
        options.check()
        check_step(step)
        chosen = [find_run(r, runs_dir) for r in [run, *([compare] if compare else [])]]
        if not as_json and len(chosen) == 1 and num_samples == 1:  # one text: printed as it is drawn
            stream_sample(prepare(chosen[0], load_run_config(chosen[0]), step, options))
            return
        results = [sample_run(r, load_run_config(r), step, options) for r in chosen]
        if as_json:
            for note in results[0].notes:
                err_console.print(note, highlight=False, markup=False, soft_wrap=True)
            print(json.dumps([r.to_dict() for r in results] if compare else results[0].to_dict(), indent=2))
        else:
            show_samples(results)


PROMPT_SHOWN = 200  # a longer prompt is echoed before its continuation by its last this many characters


def shown_prompt(prompt: str) -> str:
    return prompt if len(prompt) <= PROMPT_SHOWN else "…" + prompt[-PROMPT_SHOWN:]


def show_header(samples) -> None:
    """The notes (clamped options) and one line naming the prompt (its start and length, when long) and options."""
    for note in samples.notes:
        err_console.print(note, highlight=False, markup=False, soft_wrap=True)
    o, prompt = samples.options, samples.prompt
    about = repr(prompt) if len(prompt) <= 60 else f"{prompt[:40]!r}... ({len(prompt):,} characters)"
    console.print(
        f"prompt {about}, seed {o['seed']}, temperature {o['temperature']}, top-k {o['top_k']}, top-p {o['top_p']}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def stream_sample(sampling) -> None:
    """One sample, its text printed token by token as it is drawn."""
    from rich.text import Text

    from tiecli.sample import draw

    show_header(sampling.header)
    console.print(Text(shown_prompt(sampling.header.prompt)), end="", soft_wrap=True)
    draw(sampling, stream=lambda text: console.print(Text(text), end="", soft_wrap=True))
    console.print()
    console.print("-" * 40)


def show_samples(results) -> None:
    """Each run's samples (prompt and continuation), one column per run when there are two."""
    from rich.table import Table
    from rich.text import Text

    show_header(results[0])
    if len(results) == 1:
        for s in results[0].samples:
            console.print(Text(shown_prompt(results[0].prompt) + s.text), soft_wrap=True)
            console.print("-" * 40)
        return
    table = Table(*(f"{r.run} (step {r.step})" for r in results), show_lines=True)
    for row in zip(*(r.samples for r in results)):
        table.add_row(*(Text(shown_prompt(r.prompt) + s.text) for r, s in zip(results, row)))
    console.print(table)


def load_run_config(run: Path):
    """A run directory's config.yaml as a checked Config."""
    from tiecli.config.compose import from_run

    if not rundir.is_run_dir(run):
        raise TiecliError(f"{str(run)!r} is not a run directory (it has no {rundir.SUMMARY} or {rundir.CONFIG})")
    reader = rundir.RunReader(run)
    stored = reader.config()
    return from_run(stored, reader.overrides().get("choices", {}), run / rundir.CONFIG)


def find_run(run: Path, runs_dir: Path) -> Path:
    """RUN as given, else a bare name under --runs-dir (as `train --name NAME --resume` finds it); one line
    naming the nearest run there when neither is a run."""
    if rundir.is_run_dir(run) or run.is_absolute():
        return run
    if rundir.is_run_dir(runs_dir / run):
        return runs_dir / run
    names = [str(p.parent.relative_to(runs_dir)) for p in runs_dir.rglob(rundir.SUMMARY)] if runs_dir.is_dir() else []
    by_last = {Path(n).name: n for n in names}  # a nested run's last part: `first` for ablation/first
    near = difflib.get_close_matches(str(run), names, n=1) or [
        by_last[m] for m in difflib.get_close_matches(run.name, list(by_last), n=1)
    ]
    hint = f"; did you mean {runs_dir / near[0]}?" if near else ""
    raise TiecliError(f"{str(run)!r} is not a run directory (it has no {rundir.SUMMARY} or {rundir.CONFIG}){hint}")


@app.command()
def sweep(
    overrides: Overrides = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="Sweep name, letters, digits and . _ - only: its folder is <runs-dir>/sweeps/<name> "
            "(default: the study name, or built from the overrides)"
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            min=1,
            help="Jobs to run at once on this machine (basic, submitit_local; default 1)",
            show_default=False,
        ),
    ] = None,
    launcher: LauncherName = "basic",
    gpus_per_job: GpusPerJob = None,
    status: StatusOf = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Folder whose sweeps/ subfolder holds the sweep")] = Path(
        "runs"
    ),
    config_dir: ConfigDir = None,
    dry_run: DryRun = False,
    estimate: Estimate = True,
):
    """Train every combination of the swept overrides (a,b,c, range(0,3), glob(*), study=NAME), one process per job.

    Re-running the same sweep skips completed jobs, resumes interrupted ones and retries failed ones.

    Example: tiecli sweep model=nano,micro tying=tied,untied seed=0,1,2 --launcher submitit_slurm launcher.slurm.partition=gpu
    """
    with user_errors():
        from tiecli import sweep as sweeps

        if status is not None:
            if overrides:
                raise ConfigError(f"--status {status} shows a sweep; give it no overrides ({overrides[0]!r})")
            sweeps.show_status(runs_dir, status, console)
            return
        launch = sweeps.launch_options(launcher, overrides or [], config_dir, jobs, gpus_per_job)
        options = sweeps.launch_command(launch, jobs)
        sweep_dir, manifest, configs = sweeps.plan(overrides or [], config_dir, runs_dir, name, options)
        if dry_run:
            lines = sweeps.dry_run_lines(sweep_dir, manifest, configs, launch, estimate, err_console)
            for line in lines:
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            return
        code = sweeps.run(sweep_dir, manifest, launch.parallel, console, launch=launch)
    raise typer.Exit(code)


@app.command()
def report(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Run directories, sweep folders or any folders holding runs (default: runs/)", show_default=False
        ),
    ] = None,
    baseline: Annotated[
        str, typer.Option(help="KEY=VALUE picking the baseline among groups equal in every other key")
    ] = "tying=untied",
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: report/ inside the one sweep given, else ./report)")
    ] = None,
    select: Select = None,
    sesoi: Sesoi = None,
    target_loss: TargetLoss = None,
    family: Family = None,
    runs_dir: ReportRunsDir = Path("runs"),
):
    """Compare runs over seeds, at equal architecture, parameters and compute, and judge each claim.

    Writes report.md, a self-contained report.html, results.csv, results.json and PNG plots.

    Example: tiecli report runs/sweeps/tying_vs_size --baseline tying=untied --select train.lr --sesoi ppl=2
    """
    with user_errors():
        from tiecli.report import Options
        from tiecli.report import report as write_report

        options = Options(tuple(select or ()), tuple(sesoi or ()), target_loss, tuple(family or ()))
        found = [
            p if p.exists() or p.is_absolute() or not (runs_dir / p).exists() else runs_dir / p for p in paths or []
        ]
        write_report(found or [runs_dir], baseline, out, console, options)


@app.command()
def runs(
    runs_dir: Annotated[Path, typer.Argument(help="Folder to search for run directories, at any depth")] = Path("runs"),
):
    """List run directories: name, state, size, mode, steps, val perplexity.

    Example: tiecli runs runs/sweeps/tying_vs_size
    """
    with user_errors():
        from tiecli.report import runs_table

        console.print(runs_table(runs_dir))
