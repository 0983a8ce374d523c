# Used by `tiecli train`, `tiecli eval`, `tiecli geometry RUN` and every command that opens a run (export, sample).
"""Where a run lives and what a training command starts: a new run's directory and files, a resume's
plan, the ranks under --nproc; and, for the other commands, a run found by path or bare name, and
`eval` and `geometry` on it (read from its checkpoint, recorded through its trackers).

Imported inside the commands (it loads torch), so `tiecli --help` answers at once.
"""

import difflib
import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tiecli.config.checks import to_config
from tiecli.config.compose import compose, from_run, recompose, resume_config, to_yaml
from tiecli.config.naming import check_name, run_name
from tiecli.config.schema import Config
from tiecli.data.pairs import form_pairs
from tiecli.data.tokens import load_corpus
from tiecli.errors import AlreadyComplete, ConfigError, Interrupted, TiecliError
from tiecli.measure.diagnostics import embedding_geometry, row_sample
from tiecli.measure.evaluate import evaluate, final_windows
from tiecli.model import checkpoint
from tiecli.run.layout import CONFIG, INIT_CHECKPOINT, OVERRIDES, SNAPSHOTS, SUMMARY, is_run_dir, run_path
from tiecli.run.reader import RunReader
from tiecli.run.records import EvalResult, GeometryEntry, Summary, parse_record
from tiecli.run.writer import discard_unstarted
from tiecli.runtime import distributed, launcher
from tiecli.runtime.device import autocast_for, pick_device, pick_dtype
from tiecli.train import resume as resuming
from tiecli.train import trackers
from tiecli.train.loop import train


def plan_and_train(
    overrides: list[str], runs_dir: Path, name: str | None, resume: bool, config_dir: Path | None, nproc: int | None
) -> tuple[Path, Summary, Config] | None:
    """Plan the run on rank 0 (a refusal is every rank's), train it; rank 0 gets (path, summary, config)."""
    with distributed.process_group(), distributed.quiet_others():
        world = nproc or distributed.world_size()
        path, cfg, files = distributed.from_rank0(
            lambda: plan_run(overrides, runs_dir, name, resume, config_dir, world)
        )
        run_config = to_config(cfg)
        summary = run_training(run_config, path, resume, files, config_dir)
    return None if summary is None else (path, summary, run_config)  # None on ranks other than 0


def start_ranks(
    overrides: list[str], runs_dir: Path, name: str | None, resume: bool, config_dir: Path | None, nproc: int
) -> int:
    """`tiecli train --nproc N`: check everything once here, then the same command under torchrun on N
    processes; their exit code."""
    _, cfg, _ = plan_run(overrides, runs_dir, name, resume, config_dir, nproc)
    distributed.rank_shape(to_config(cfg).train, nproc)
    args = [*overrides, "--runs-dir", str(runs_dir), *(["--name", name] if name else [])]
    args += [*(["--resume"] if resume else []), *(["--config-dir", str(config_dir)] if config_dir else [])]
    return launcher.torchrun(nproc, ["train", *args])


def plan_run(overrides: list[str], runs_dir: Path, name: str | None, resume: bool, config_dir: Path | None, world: int):
    """The path, config and files of the run to train: a resume's plan on `world` ranks, or a new run's."""
    if resume:
        return plan_resume(runs_dir, name, overrides, config_dir, world)
    return plan_new_run(runs_dir, name, overrides, config_dir)


def run_place(overrides: list[str], resume: bool, runs_dir: Path, name: str | None, multirun: bool):
    """(runs_dir, name) of the run to train: `--resume runs/NAME` (or a bare NAME in --runs-dir) pops the
    run's path from the overrides, wherever it stands among them (Typer gathers every positional, before and after
    the options, into one list); -m and an empty --name are refused."""
    if multirun:
        raise ConfigError(
            f"-m: tiecli train trains one run; for several, `{shlex.join(['tiecli', 'sweep', *overrides])}`"
        )
    paths = [o for o in overrides if "=" not in o]  # every override is KEY=VALUE: the rest is a run's path
    if resume and paths:  # tiecli train --resume runs/NAME [OVERRIDES], the path anywhere among the overrides
        if len(paths) > 1:
            raise ConfigError(f"--resume continues one run; {paths[0]!r} and {paths[1]!r} are both run paths")
        run_arg = Path(paths[0])
        overrides.remove(paths[0])
        if not is_run_dir(run_arg) and is_run_dir(runs_dir / run_arg):  # a bare NAME in --runs-dir
            run_arg = runs_dir / run_arg
        runs_dir, name = run_arg.parent, run_arg.name
    if name is not None and not name.strip():
        raise TiecliError("--name is empty; give a name, or leave --name out for the default")
    return runs_dir, name


def run_training(run_config, path: Path, resume: bool, files, config_dir: Path | None):
    """train (tiecli/train/loop.py), with the resume command added to a stop's line (rank 0's)."""
    try:
        return train(run_config, path, resume, files)
    except Interrupted as e:
        launcher.said_stop()  # rank 0 prints the line: --nproc's launcher adds none
        if is_run_dir(path) and distributed.is_rank0():
            raise Interrupted(f"{e}\nresume with: {resume_command(path, config_dir)}") from None
        raise


def resume_command(path: Path, config_dir: Path | None) -> str:
    """The command that continues this run, to copy and paste: relative to here when it lies below."""
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    world = distributed.world_size()
    args = ["tiecli", "train", "--resume", str(shown), *(["--nproc", str(world)] if world > 1 else [])]
    return shlex.join(args + (["--config-dir", str(config_dir)] if config_dir else []))


def plan_new_run(runs_dir: Path, name: str | None, overrides: list[str], config_dir: Path | None):
    """The path, config and files of a new run; refuses a name taken by a run worth keeping."""
    cfg, choices = compose(overrides, config_dir)
    path = run_path(runs_dir, name if name is not None else run_name(choices, cfg, overrides))
    if name is not None:  # after run_path's checks (length, leaving runs_dir); --resume takes older names as they are
        check_name(name)
    if is_run_dir(path) and not discard_unstarted(path):
        raise TiecliError(
            f"run {path.name!r} already exists in {str(runs_dir)!r}; add --resume to continue it or --name for a new one"
        )
    files = {
        CONFIG: to_yaml(cfg),
        OVERRIDES: OmegaConf.to_yaml({"overrides": overrides, "choices": choices}),
    }
    return path, cfg, files


def plan_resume(
    runs_dir: Path, name: str | None, overrides: list[str], config_dir: Path | None, world_size: int = 1
) -> tuple[Path, DictConfig, dict]:
    """The run to resume, the config it continues with and the files to rewrite (config.yaml).

    AlreadyComplete when there is nothing to do: a completed run the overrides do not extend.
    world_size: the processes that would train it, which must be those that did (summary.json says;
    the checkpoint, checked again when it is loaded, has each rank's data and RNG streams).
    """
    if name is None:  # the run the same overrides would have named
        cfg, choices = compose(overrides, config_dir)
        name = run_name(choices, cfg, overrides)
    path = run_path(runs_dir, name)
    if not is_run_dir(path):
        raise TiecliError(f"there is no run {name!r} in {str(runs_dir)!r} to resume; leave out --resume to start it")
    reader = RunReader(path)
    choices = reader.overrides()["choices"]
    cfg = resume_config(recompose(reader.config(), choices), choices, overrides)
    summary = reader.summary()
    distributed.refuse_world_size(name, summary.world_size, world_size)
    if summary.status == "completed" and to_config(cfg).max_steps <= summary.step:
        raise AlreadyComplete(
            f"run {name} is already complete (step {summary.step}); extend it with e.g. train.max_steps={2 * summary.step}"
        )
    resuming.check_files(reader, to_config(cfg).model)  # at once, before the data and model are built
    return path, cfg, {CONFIG: to_yaml(cfg)}


def load_run_config(run: Path):
    """A run directory's config.yaml as a checked Config."""
    if not is_run_dir(run):
        raise TiecliError(f"{str(run)!r} is not a run directory (it has no {SUMMARY} or {CONFIG})")
    reader = RunReader(run)
    return from_run(reader.config(), reader.overrides().get("choices", {}), run / CONFIG)


def find_run(run: Path, runs_dir: Path) -> Path:
    """RUN as given, else a bare name under --runs-dir (as `train --name NAME --resume` finds it); one line
    naming the nearest run there when neither is a run."""
    if is_run_dir(run) or run.is_absolute():
        return run
    if is_run_dir(runs_dir / run):
        return runs_dir / run
    names = [str(p.parent.relative_to(runs_dir)) for p in runs_dir.rglob(SUMMARY)] if runs_dir.is_dir() else []
    by_last = {Path(n).name: n for n in names}  # a nested run's last part: `first` for ablation/first
    near = difflib.get_close_matches(str(run), names, n=1) or [
        by_last[m] for m in difflib.get_close_matches(run.name, list(by_last), n=1)
    ]
    hint = f"; did you mean {runs_dir / near[0]}?" if near else ""
    raise TiecliError(f"{str(run)!r} is not a run directory (it has no {SUMMARY} or {CONFIG}){hint}")


def evaluate_run(run_dir: Path, config: Config, split: str, step: str = "latest") -> EvalResult:
    """Reload a run's checkpoint and evaluate a whole split (or final_windows' subset).

    step: latest (last.pt), recorded in eval.json; or a step with full weights (last.pt's, or one that
    train.keep_checkpoints kept), only returned: eval.json keeps the latest checkpoint's, which `report` reads.
    """
    if step != "latest":
        return _evaluate(RunReader(run_dir), config, split, step)
    with trackers.open_run(run_dir) as run:
        result = _evaluate(run.reader, config, split, step)
        run.eval(result)
    return result


def _evaluate(reader: RunReader, config: Config, split: str, step: str) -> EvalResult:
    device = pick_device(config.device)
    corpus = load_corpus(config.data, config.tokenizer)
    reader.check_corpus(corpus.key)
    model, ckpt = checkpoint.load_model(reader.full_checkpoint(step), config.model, reader.name)
    checkpoint.check_step(ckpt, step, reader.kept_steps(), reader.name)
    autocast = autocast_for(device, pick_dtype(config.dtype, device))
    windows = final_windows(corpus, split, config.model.block_size, config.eval.max_tokens)
    metrics = evaluate(
        model.to(device), corpus, split, corpus.buckets(config.eval.buckets), device, autocast, windows=windows
    )
    return EvalResult(step=ckpt["state"]["step"], **metrics)


def geometry_of_run(run_dir: Path, config: Config, step: str, pairs_path: str | None, write: bool) -> GeometryEntry:
    """Recompute the geometry entry of a run at `step` (latest, init or a snapshot's step number).

    With write, the entry goes into geometry.json under the run's lock, so a running trainer's entries are never lost,
    and at `latest` the row sample into rows.npz (a run trained before either keeps them from then on).
    """
    reader, name = RunReader(run_dir), run_dir.name
    init = checkpoint.load_embeddings(run_dir / INIT_CHECKPOINT, config.model, name)
    if step == "latest":
        ckpt = checkpoint.load_last(run_dir)
        emb, number = checkpoint.embeddings_of(ckpt, config.model, name), ckpt["state"]["step"]
    elif step == "init":
        emb, number = init, 0
    else:
        saved = reader.snapshot_steps()
        if not step.isdigit() or int(step) not in saved:
            choices = ", ".join(["latest", "init", *map(str, saved)])
            raise TiecliError(
                f"--step {step!r} has no saved token matrices in {str(run_dir)!r}; choose one of {choices}"
            )
        number = int(step)
        emb = checkpoint.load_embeddings(run_dir / SNAPSHOTS / f"step_{number}.pt", config.model, name)
    corpus = load_corpus(config.data, config.tokenizer)
    reader.check_corpus(corpus.key)
    pairs, pairs_info = form_pairs(corpus.encoding, pairs_path or config.diag.pairs)
    buckets = corpus.buckets(config.eval.buckets)
    measured = embedding_geometry(emb, init, corpus.counts, buckets, pairs, pairs_info, config.diag.seed)
    entry = parse_record(GeometryEntry, {"step": number, **measured}, "a geometry entry")
    if write:
        with trackers.open_run(run_dir) as run:
            run.geometry(entry)
            if step == "latest":  # rows.npz holds the last step's rows, never an earlier step's
                run.row_sample(number, *row_sample(emb, corpus.counts))
    return entry
