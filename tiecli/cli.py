# tiecli --help   (entry point of the `tiecli` command and of `python -m tiecli`)
"""The command line: each command composes its config, finds its run directory and calls one function.

Heavy imports (torch) happen inside the commands, so `tiecli --help` answers at once.
"""

import contextlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from omegaconf import OmegaConf
from rich.console import Console
from rich.markup import escape

from tiecli import arguments as opt
from tiecli import display
from tiecli.errors import AlreadyComplete, ConfigError, Interrupted, TiecliError
from tiecli.run.reader import RunReader

app = typer.Typer(
    help="Train GPT-style models with the input embedding and output matrix tied or not, and compare them.\n\n"
    "Example: tiecli train tying=untied model=small",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help and usage errors: the error stays on one line, unboxed
)
console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def user_errors():
    """A TiecliError, or an error of the operating system, becomes one line on stderr and an exit code; no traceback."""
    try:
        yield
    except AlreadyComplete as e:
        console.print(str(e), highlight=False, markup=False, soft_wrap=True)
    except Interrupted as e:  # stopped on request (Ctrl-C, SIGTERM): what happened, not an error
        err_console.print(escape(str(e)), highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except TiecliError as e:
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


@app.command("train")
def train_and_show(
    overrides: opt.Overrides = None,
    name: opt.TrainName = None,
    resume: opt.Resume = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Folder that holds run directories")] = Path("runs"),
    config_dir: opt.ConfigDir = None,
    nproc: opt.Nproc = None,
    multirun: opt.Multirun = False,
):
    """Train one model and evaluate it into runs/<name>/.

    Example: tiecli train tying=untied model=small train.max_steps=500
    """
    overrides = list(overrides or [])
    with user_errors():
        from tiecli.commands import launch
        from tiecli.runtime import launcher

        runs_dir, name = launch.run_place(overrides, resume, runs_dir, name, multirun)
        if nproc is not None and not launcher.launched():  # check everything once, then start the ranks
            raise typer.Exit(launch.start_ranks(overrides, runs_dir, name, resume, config_dir, nproc))
        trained = launch.plan_and_train(overrides, runs_dir, name, resume, config_dir, nproc)
        if trained is not None:  # rank 0 reports
            show_trained(*trained)


def show_trained(path: Path, summary, run_config) -> None:
    """After training: the summary, the last geometry, where the run is and, with train.sample_tokens, a sample."""
    console.print(display.summary_table(summary))
    entries = RunReader(path).geometry()
    if entries:
        console.print(display.geometry_table(entries[-1].to_dict(), f"geometry at step {summary.step}"))
    console.print(f"run directory: {path}", highlight=False, soft_wrap=True)
    if run_config.train.sample_tokens:  # what `tiecli sample RUN --max-new-tokens N` prints, from the checkpoint
        from tiecli.commands.sample import DEFAULT_PROMPT, Options, load_sampling, stream_sample

        n = run_config.train.sample_tokens
        sampling = load_sampling(path, run_config, "latest", Options(DEFAULT_PROMPT, 1, n, 0.8, 200, 1.0, 0))
        stream_sample(sampling, console, err_console)


@app.command("eval")
def eval_(
    run: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/micro-tied-bpe4096-shakespeare-s0")],
    split: opt.EvalSplit = opt.Split.val,
    step: opt.EvalStep = "latest",
    runs_dir: opt.RunsDir = Path("runs"),
):
    """Reload a run's checkpoint; report loss, perplexity, bits per byte and perplexity by token frequency on a split.

    Example: tiecli eval runs/micro-tied-bpe4096-shakespeare-s0 --split test
    """
    with user_errors():
        from tiecli.commands.launch import evaluate_run, find_run, load_run_config

        opt.check_step_option(step)

        run = find_run(run, runs_dir)
        run_config = load_run_config(run)

        result = evaluate_run(run, run_config, split.value, step)
        console.print(display.eval_table(asdict(result), f"{run.name}: {split.value} at step {result.step}"))


@app.command()
def info(
    overrides: opt.Overrides = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of YAML and a table")] = False,
    config_dir: opt.ConfigDir = None,
):
    """Show the composed config and the parameter count by part, without training.

    Example: tiecli info model=gpt2 tokenizer=gpt2 tying=tied
    """
    with user_errors():
        from tiecli.config.checks import to_config
        from tiecli.config.compose import compose, to_yaml

        cfg, choices = compose(overrides or [], config_dir)
        run_config = to_config(cfg)
        from tiecli.model.gpt import count_params

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
    run: opt.GeometryRun = None,
    model: opt.GeometryModel = None,
    step: opt.GeometryStep = "latest",
    pairs: opt.GeometryPairs = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the entry as JSON instead of a table")] = False,
    write: opt.WriteEntry = False,
    out: opt.GeometryOut = None,
    runs_dir: opt.RunsDir = Path("runs"),
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
        from tiecli.commands.launch import find_run, geometry_of_run, load_run_config

        run = find_run(run, runs_dir)
        run_config = load_run_config(run)
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
    from tiecli.commands import pretrained

    measured = pretrained.geometry_of_model(model, pairs, out)
    if as_json:
        print(json.dumps(measured, indent=2))
        return
    for line in pretrained.summary_lines(measured):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(display.pretrained_table(measured, pretrained.label(measured)))
    if out is not None:
        console.print(f"written: {out / pretrained.PRETRAINED_FILE}", highlight=False, soft_wrap=True)


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A run directory with a checkpoint")],
    out_dir: opt.ExportOutDir,
    to: opt.ExportTo = opt.ExportTarget.hf,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT_DIR if it already holds files")] = False,
    runs_dir: opt.RunsDir = Path("runs"),
):
    """Export a run's last checkpoint for transformers (AutoModelForCausalLM) or as plain safetensors.

    Example: tiecli export runs/micro-tied-bpe4096-shakespeare-s0 --to hf exported/micro-tied
    """
    with user_errors():
        from tiecli.commands.launch import find_run, load_run_config

        run = find_run(run, runs_dir)
        run_config = load_run_config(run)
        from tiecli.commands.export import export_run

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
    temperature: opt.SampleTemperature = 0.8,
    top_k: Annotated[int, typer.Option(help="Sample among the k most likely tokens only (0: every token)")] = 200,
    top_p: opt.SampleTopP = 1.0,
    seed: Annotated[int, typer.Option(help="Seeds the samples: the same seed gives the same text")] = 0,
    step: Annotated[str, typer.Option(help="latest, or the step of the run's checkpoint")] = "latest",
    as_json: opt.SampleAsJson = False,
    compare: opt.SampleCompare = None,
    runs_dir: opt.RunsDir = Path("runs"),
):
    """Generate text from a run's checkpoint (every tying mode); the same seed gives the same text.

    Example: tiecli sample runs/micro-tied-bpe4096-shakespeare-s0 --prompt "ROMEO:" --num-samples 3
    """
    with user_errors():
        from tiecli.commands.launch import find_run, load_run_config
        from tiecli.commands.sample import Options, load_sampling, read_prompt, sample_run, show_samples, stream_sample

        options = Options(
            read_prompt(prompt, prompt_file), num_samples, max_new_tokens, temperature, top_k, top_p, seed
        )
        options.check()
        opt.check_step_option(step)
        chosen = [find_run(r, runs_dir) for r in [run, *([compare] if compare else [])]]
        if not as_json and len(chosen) == 1 and num_samples == 1:  # one text: printed as it is drawn
            stream_sample(load_sampling(chosen[0], load_run_config(chosen[0]), step, options), console, err_console)
            return
        results = [sample_run(r, load_run_config(r), step, options) for r in chosen]
        if as_json:
            for note in results[0].notes:
                err_console.print(note, highlight=False, markup=False, soft_wrap=True)
            print(json.dumps([r.to_dict() for r in results] if compare else results[0].to_dict(), indent=2))
        else:
            show_samples(results, console, err_console)


@app.command()
def sweep(
    overrides: opt.Overrides = None,
    name: opt.SweepName = None,
    jobs: opt.SweepJobs = None,
    launcher: opt.LauncherName = "basic",
    gpus_per_job: opt.GpusPerJob = None,
    status: opt.StatusOf = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Folder whose sweeps/ subfolder holds the sweep")] = Path(
        "runs"
    ),
    config_dir: opt.ConfigDir = None,
    dry_run: opt.DryRun = False,
    estimate: opt.Estimate = True,
):
    """Train every combination of the swept overrides (a,b,c, range(0,3), glob(*), study=NAME), one process per job.

    Re-running the same sweep skips completed jobs, resumes interrupted ones and retries failed ones.

    Example: tiecli sweep model=nano,micro tying=tied,untied seed=0,1,2 --launcher submitit_slurm launcher.slurm.partition=gpu
    """
    with user_errors():
        from tiecli.sweep import sweep as run_sweep

        code = run_sweep(
            overrides or [],
            name=name,
            status=status,
            launcher=launcher,
            jobs=jobs,
            gpus_per_job=gpus_per_job,
            runs_dir=runs_dir,
            config_dir=config_dir,
            dry_run=dry_run,
            estimate=estimate,
            console=console,
            err_console=err_console,
        )
    raise typer.Exit(code)


@app.command()
def report(
    paths: opt.ReportPaths = None,
    baseline: opt.ReportBaseline = "tying=untied",
    out: opt.ReportOut = None,
    select: opt.Select = None,
    sesoi: opt.Sesoi = None,
    target_loss: opt.TargetLoss = None,
    family: opt.Family = None,
    runs_dir: opt.ReportRunsDir = Path("runs"),
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
def figure(
    results: Annotated[
        list[str],
        typer.Argument(
            help="results.csv files written by `tiecli report`, each PATH or LABEL=PATH", show_default=False
        ),
    ],
    out: Annotated[Path, typer.Option(help="The figure: a .png or .svg file")] = Path("findings.png"),
    title: Annotated[
        str, typer.Option(help="The figure's title")
    ] = "Tied vs untied: test perplexity, 95% interval over seeds",
):
    """Draw reports' tied-vs-baseline test perplexity, by model size and by training tokens, from results.csv files.

    Example: tiecli figure English=runs/sweeps/ladder/report/results.csv Russian=report_ru/results.csv --out findings.png
    """
    with user_errors():
        from tiecli.report.figure import write_figure

        console.print(f"wrote {write_figure(results, out, title)}")


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
