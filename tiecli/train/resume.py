# Used by `tiecli train --resume`: the run directory and its checkpoint checked before training goes on.
"""The checks a resumed run passes before training goes on (which config it continues with, and the
plan, are config/compose.py's resume_config and launch.py's plan_resume).

Before a resume changes anything, every file it will read is read (check_files) and the checkpoint
is matched to the run (check_checkpoint): its run id, and its step against summary.json and
metrics.jsonl. A refusal is one line and leaves every byte of the run as it was, so a completed run
that a resume could not extend stays completed.
"""

from tiecli.config.compose import fixed_changes
from tiecli.errors import TiecliError
from tiecli.model import checkpoint
from tiecli.model.gpt import GPTConfig
from tiecli.run.layout import CHECKPOINT, CONFIG, INIT_CHECKPOINT, METRICS, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.records import flatten


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
    changed = fixed_changes(old, now)
    if changed:
        key = changed[0]
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
