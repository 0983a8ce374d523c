# tiecli --help   (entry point of the `tiecli` command and of `python -m tiecli`)
"""The command line: each command composes its config, finds its run directory and calls one function.

Heavy imports (torch) happen inside the commands, so `tiecli --help` answers at once.
"""

import contextlib
import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from omegaconf import OmegaConf
from rich.console import Console

from tiecli import display, rundir
from tiecli.errors import ConfigError, TiecliError

app = typer.Typer(
    help="Train GPT-style models with the input embedding and output matrix tied or not, and compare them.\n\n"
    "Example: tiecli train tying=untied model=small",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help and usage errors: the error stays on one line, unboxed
)
console = Console()
err_console = Console(stderr=True)

Overrides = Annotated[list[str] | None, typer.Argument(help="Hydra overrides: GROUP=CHOICE or KEY=VALUE, e.g. tying=untied train.lr=1e-3", show_default=False)]
ConfigDir = Annotated[Path | None, typer.Option("--config-dir", help="A folder of your own config files: they add to tiecli's conf/ (e.g. model/huge.yaml) and replace its files of the same name")]


@contextlib.contextmanager
def user_errors():
    """A TiecliError becomes one line on stderr and its exit code; no traceback."""
    try:
        yield
    except TiecliError as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None


@app.command()
def train(
    overrides: Overrides = None,
    name: Annotated[str | None, typer.Option(help="Run directory name (default: built from the group choices and seed)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the named run from its last checkpoint")] = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Folder that holds run directories")] = Path("runs"),
    config_dir: ConfigDir = None,
):
    """Train one model and evaluate it into runs/<name>/.

    Example: tiecli train tying=untied model=small train.max_steps=500
    """
    overrides = overrides or []
    with user_errors():
        from tiecli import config

        cfg, choices = config.compose(overrides, config_dir)
        run_config = config.to_config(cfg)
        path = rundir.run_path(runs_dir, name or config.run_name(choices, cfg, overrides))
        if rundir.is_run_dir(path):
            if not resume:
                raise TiecliError(f"run {path.name!r} already exists in {str(runs_dir)!r}; add --resume to continue it or --name for a new one")
            config.check_unchanged(config.load_yaml(path / rundir.CONFIG), cfg)
        files = {rundir.CONFIG: config.to_yaml(cfg), rundir.OVERRIDES: OmegaConf.to_yaml({"overrides": overrides, "choices": choices})}
        from tiecli.train import train as train_run

        summary = train_run(run_config, path, resume, files)
        console.print(display.summary_table(summary))
        if (path / rundir.GEOMETRY).exists():
            console.print(display.geometry_table(rundir.read_json(path / rundir.GEOMETRY)[-1], f"geometry at step {summary['step']}"))
        console.print(f"run directory: {path}")


class Split(str, Enum):
    val = "val"
    test = "test"


@app.command("eval")
def eval_(
    run: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/micro-tied-bpe4096-shakespeare-s0")],
    split: Annotated[Split, typer.Option(help="Held-out split to evaluate in full")] = Split.val,
):
    """Reload a run's checkpoint; report loss, perplexity, bits per byte and perplexity by token frequency.

    Example: tiecli eval runs/micro-tied-bpe4096-shakespeare-s0 --split test
    """
    with user_errors():
        run_config = load_run_config(run)
        from tiecli.evaluate import evaluate_run

        metrics = evaluate_run(run, run_config, split.value)
        console.print(display.eval_table(metrics, f"{run.name}: {split.value} at step {metrics['step']}"))


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
        from tiecli import config

        cfg, choices = config.compose(overrides or [], config_dir)
        run_config = config.to_config(cfg)
        from tiecli.model import count_params

        counts = count_params(run_config.model)
        if as_json:
            print(json.dumps({"choices": choices, "config": OmegaConf.to_container(cfg, resolve=True), "params": counts}, indent=2))
            return
        console.print(config.to_yaml(cfg), highlight=False, markup=False)
        console.print(display.params_table(counts, f"parameters ({', '.join(f'{k}={v}' for k, v in choices.items())})"))


@app.command()
def geometry(
    run: Annotated[Path, typer.Argument(help="A run directory")],
    step: Annotated[str, typer.Option(help="latest (the last checkpoint), init (step 0), or a step with a snapshot in checkpoints/emb/")] = "latest",
    pairs: Annotated[Path | None, typer.Option(help="Related word forms: a UTF-8 file, one tab-separated pair a line (default: the run's diag.pairs)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the entry as JSON instead of a table")] = False,
    write: Annotated[bool, typer.Option("--write", help="Also record the entry in the run's geometry.json (replacing one for the same step)")] = False,
):
    """Recompute the geometry of a run's token matrices from its checkpoint.

    Example: tiecli geometry runs/micro-untied-bpe4096-shakespeare-s0 --pairs ru_pairs.tsv
    """
    with user_errors():
        run_config = load_run_config(run)
        from tiecli.diagnostics import geometry_of_run

        entry = geometry_of_run(run, run_config, step, str(pairs) if pairs else None, write)
        if as_json:
            print(json.dumps(entry, indent=2))
        else:
            console.print(display.geometry_table(entry, f"{run.name}: geometry at step {entry['step']}"))


def load_run_config(run: Path):
    """A run directory's config.yaml as a checked Config."""
    from tiecli import config

    if not rundir.is_run_dir(run):
        raise TiecliError(f"{str(run)!r} is not a run directory (it has no {rundir.CONFIG})")
    try:
        return config.to_config(config.load_yaml(run / rundir.CONFIG))
    except ConfigError as e:
        raise TiecliError(f"{str(run / rundir.CONFIG)!r} is not a valid tiecli config: {e}") from None


@app.command()
def sweep(
    overrides: Overrides = None,
    name: Annotated[str | None, typer.Option(help="Sweep name: its folder is <runs-dir>/sweeps/<name> (default: the study name, or built from the overrides)")] = None,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Jobs to run at once")] = 1,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Folder whose sweeps/ subfolder holds the sweep")] = Path("runs"),
    config_dir: ConfigDir = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the jobs and their run directories; run and write nothing")] = False,
):
    """Train every combination of the swept overrides (a,b,c, range(0,3), glob(*), study=NAME), one process per job.

    Re-running the same sweep skips completed jobs, resumes interrupted ones and retries failed ones.

    Example: tiecli sweep model=nano,micro tying=tied,untied seed=0,1,2
    """
    with user_errors():
        from tiecli import sweep as sweeps

        sweep_dir, manifest = sweeps.plan(overrides or [], config_dir, runs_dir, name)
        if dry_run:
            for line in sweeps.dry_run_lines(sweep_dir, manifest):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            return
        code = sweeps.run(sweep_dir, manifest, jobs, console)
    raise typer.Exit(code)


@app.command()
def report(
    paths: Annotated[list[Path] | None, typer.Argument(help="Run directories, sweep folders or any folders holding runs (default: runs/)", show_default=False)] = None,
    baseline: Annotated[str, typer.Option(help="KEY=VALUE picking the baseline among groups equal in every other key")] = "tying=untied",
    out: Annotated[Path | None, typer.Option(help="Output folder (default: report/ inside the one sweep given, else ./report)")] = None,
):
    """Compare runs over seeds, at equal architecture and equal parameter count, and judge each claim.

    Writes report.md, a self-contained report.html, results.csv, results.json and PNG plots.

    Example: tiecli report runs/sweeps/tying_vs_size --baseline tying=untied
    """
    with user_errors():
        from tiecli.report import report as write_report

        write_report(paths or [Path("runs")], baseline, out, console)


@app.command()
def runs(runs_dir: Annotated[Path, typer.Argument(help="Folder to search for run directories, at any depth")] = Path("runs")):
    """List run directories: name, state, size, mode, steps, val perplexity.

    Example: tiecli runs runs/sweeps/tying_vs_size
    """
    with user_errors():
        from tiecli.report import runs_table

        console.print(runs_table(runs_dir))
