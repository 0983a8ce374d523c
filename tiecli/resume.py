# Used by `tiecli train --resume`: which config a resumed run continues with.
"""A resumed run trains with its own config.yaml; overrides may only extend it.

Retyping the overrides is never needed. Overrides given with --resume may change the keys that do
not alter what was already trained (EXTENDABLE, and every diag.* key); any other key or group must
keep its value. Extending train.max_steps or train.max_tokens recomputes the cosine
schedule over the new total: from the resume step on, the learning rate is the new schedule's.

Before a resume changes anything, every file it will read is read (check_files) and the checkpoint
is matched to the run (check_checkpoint): its run id, and its step against summary.json and
metrics.jsonl. A refusal is one line and leaves every byte of the run as it was, so a completed run
that a resume could not extend stays completed.
"""

import copy
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from tiecli import checkpoint, distributed
from tiecli.config.checks import to_config
from tiecli.config.compose import check_unique, compose, parse_overrides, recompose, to_yaml
from tiecli.config.naming import run_name
from tiecli.config.schema import GROUPS
from tiecli.errors import ConfigError, TiecliError
from tiecli.model import GPTConfig
from tiecli.run.layout import CHECKPOINT, CONFIG, INIT_CHECKPOINT, METRICS, SUMMARY, is_run_dir, run_path
from tiecli.run.reader import RunReader
from tiecli.run.records import flatten

EXTENDABLE = (
    "train.max_steps",
    "train.max_tokens",
    "train.keep_checkpoints",  # how many past checkpoints stay on disk: nothing the run trains on
    "train.eval_interval",
    "train.evals",
    "train.eval_batches",
    "train.log_interval",
    "train.checkpoint_interval",
    "train.checkpoints",
    "eval.test",
)
EXTENDABLE_PREFIXES = ("diag.",)


def resume_config(stored: DictConfig, choices: dict[str, str], overrides: list[str]) -> DictConfig:
    """The stored config with the overrides applied; ConfigError naming the first key they may not change."""
    cfg = copy.deepcopy(stored)
    parsed = parse_overrides(overrides)
    check_unique(parsed, "on the command line")  # as for a new run: the last of two values never wins in silence
    for o in parsed:
        key = o.key_or_group
        if key in GROUPS:
            if str(o.value()) != choices.get(key):
                raise ConfigError(
                    f"this run was trained with {key}={choices.get(key)}; --resume cannot change it "
                    "(start a new run with another --name)"
                )
            continue
        if OmegaConf.select(cfg, key, default="__absent__") == "__absent__":
            raise ConfigError(f"unknown config key {key!r} in this run's config.yaml")
        OmegaConf.update(cfg, key, o.value(), merge=False)
    old = flatten(cast(dict, OmegaConf.to_container(stored, resolve=True)))
    new = flatten(cast(dict, OmegaConf.to_container(cfg, resolve=True)))
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) != new.get(key) and key not in EXTENDABLE and not key.startswith(EXTENDABLE_PREFIXES):
            raise ConfigError(
                f"{key} was {old.get(key)!r} in this run; --resume may only change "
                f"{', '.join(EXTENDABLE)} and diag.* keys (start a new run with another --name)"
            )
    return cfg


def plan(
    runs_dir: Path, name: str | None, overrides: list[str], config_dir: Path | None, world_size: int = 1
) -> tuple[Path | None, DictConfig, dict]:
    """The run to resume, the config it continues with and the files to rewrite (config.yaml).

    The path is None when there is nothing to do: a completed run the overrides do not extend.
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
        print(
            f"run {name} is already complete (step {summary.step}); extend it with e.g. train.max_steps={2 * summary.step}"
        )
        return None, cfg, {}
    check_files(reader, to_config(cfg).model)  # at once, before the data and model are built
    return path, cfg, {CONFIG: to_yaml(cfg)}


def check_files(reader: RunReader, model: GPTConfig) -> None:
    """Read every file of the run that training reads or rewrites, so that one unreadable file is
    refused before anything changes rather than failing the run after it trained (FormatError)."""
    try:
        reader.config(), reader.summary(), reader.trackers()  # overrides.yaml: read by plan(), for the choices
        reader.metrics(), reader.evals(), reader.geometry()
        checkpoint.load_embeddings(reader.path / INIT_CHECKPOINT, model, reader.name)  # geometry's reference
    except TiecliError as e:
        raise TiecliError(f"{e}; --resume left the run as it was") from None


def check_config(reader: RunReader, trained) -> None:
    """Refuse a config.yaml edited by hand since the checkpoint was saved (trained: the config.yaml it
    saw, None in checkpoints from before it was kept) in a key that --resume may not change."""
    if not isinstance(trained, dict):
        return
    old, now = flatten(trained), flatten(reader.config())
    for key in sorted(old.keys() | now.keys()):
        if old.get(key) != now.get(key) and key not in EXTENDABLE and not key.startswith(EXTENDABLE_PREFIXES):
            raise TiecliError(
                f"run {reader.name}: {CONFIG} says {key}={now.get(key)!r}, but the run trained with "
                f"{old.get(key)!r} ({CHECKPOINT.name} says so): {CONFIG} was edited; put back {old.get(key)!r}, "
                "or start a new run with another --name"
            )


def check_checkpoint(reader: RunReader, ckpt: dict, log_interval: int) -> None:
    """TiecliError, naming both sides, when last.pt is not where this run stands: another run's id,
    another step than summary.json's, or a step past metrics.jsonl's rows (a cut or emptied file).

    ckpt["state"]: logged_step, the last metrics row written before it; checkpoints older than that
    field are held to a row within log_interval steps before theirs (a row comes at least that often).
    """
    summary, state, name = reader.summary(), ckpt["state"], reader.name
    step, theirs = state["step"], state.get("run_id")
    if theirs is not None and summary.run_id is not None and theirs != summary.run_id:
        raise TiecliError(
            f"run {name}: {CHECKPOINT} belongs to run id {theirs}, but {SUMMARY} says this run is "
            f"{summary.run_id}: it was copied from another run; put back this run's own, or train that one"
        )
    ended = summary.status in ("completed", "interrupted")  # both save a checkpoint at the step they record
    if (step > summary.step and summary.status != "running") or (ended and step != summary.step):
        raise TiecliError(
            f"run {name}: {CHECKPOINT} is at step {step}, but {SUMMARY} says the run was "
            f"{summary.status} at step {summary.step}: the checkpoint is not this run's last one"
        )
    logged = [r.step for r in reader.metrics() if r.step <= step]
    last, expected = (logged[-1] if logged else None), state.get("logged_step")
    if expected is not None:
        fits, written = last == expected, f"written after the row of step {expected}"
    else:
        fits, written = last is not None and step - last < log_interval, f"with a row every {log_interval} steps"
    if not fits:
        rows = f"ends at step {last}" if last is not None else "has no rows"
        raise TiecliError(
            f"run {name}: {METRICS} {rows}, but {CHECKPOINT} is at step {step}, {written}: rows were "
            "lost (a cut or emptied file) or the checkpoint is another run's; resuming would leave a gap in the "
            "curves: put back the run's metrics.jsonl, or start a new run with another --name"
        )
    check_config(reader, ckpt.get("config"))  # last: a checkpoint of another run is better named above
