# Used by every command that writes a run (through RunWriter) when its config names logger=[...].
"""Experiment trackers, TensorBoard and W&B, fed by RunWriter with exactly what it writes to the run.

metrics.jsonl stays the source of truth. A command opens its run with `create_run` or `open_run`,
which attach a `Feed` to the RunWriter; the writer hands it each record it has just written: a
metrics row (one scalar per key, named as in metrics.jsonl), an evaluation (eval/<split>/...), a
geometry entry (geometry/<side>/<metric>) and the final summary (summary/...); the config goes in
as hyperparameters. So what a tracker shows is what the run
directory holds, under the same names.

TensorBoard writes event files into <run>/tb/: `tensorboard --logdir runs` shows every run, and
`--logdir runs/sweeps/NAME` is one sweep's jobs, side by side, with their hyperparameters in the
HParams tab. W&B writes <run>/wandb/, offline unless WANDB_MODE or logger.wandb.mode says otherwise;
its run id lives in the run directory (trackers.json), so a resumed run continues the same W&B run,
and a sweep's jobs share the W&B group named after the sweep.

The packages are optional extras, imported only here and only when a run asks for them.
"""

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tiecli.config.compose import from_run
from tiecli.data.tokenizer import token_strings
from tiecli.data.tokens import load_corpus
from tiecli.errors import TiecliError
from tiecli.model import checkpoint
from tiecli.run.layout import CONFIG, MANIFEST
from tiecli.run.reader import RunReader
from tiecli.run.records import Summary, flatten
from tiecli.run.writer import RunWriter

TB_DIR = "tb"
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger name -> the module it needs
HPARAM_METRICS = ("val_loss", "eval/val/loss", "eval/val/perplexity")  # the HParams tab's columns


def check_installed(logger: dict | None) -> None:
    """One line naming the pip command when a logger the config picks lacks its package."""
    for name in logger or {}:
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name]) is None:
            raise TiecliError(f"logger={name} needs the {name} package: pip install 'tiecli[{name}]'")


def numbers(tree: dict, prefix: str = "") -> dict[str, float]:
    """The finite numeric leaves of nested dicts, keys joined with "/"; strings, lists, flags and None dropped."""
    flat: dict[str, float] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            flat[f"{prefix}{key}"] = value
    return flat


def sweep_of(run: Path) -> str | None:
    """The sweep a run belongs to: its folder's name, when that folder holds a sweep manifest."""
    return run.parent.name if (run.parent / MANIFEST).is_file() else None


class TensorBoard:
    """Event files in <run>/tb/. purge_step: a resumed run hides what it logged past its checkpoint."""

    def __init__(self, run: Path, settings: dict, config: dict, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.run, self.settings, self.config = run, settings, config
        self.writer = SummaryWriter(str(run / TB_DIR), purge_step=purge_step)
        # The hparams summaries go into this run's own event file, so each run (each sweep job) is
        # one session of the HParams tab; SummaryWriter.add_hparams would make a sub-run of its own.
        values = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in flatten(config).items()}
        file_writer = self.writer.file_writer
        assert file_writer is not None  # SummaryWriter opens it in __init__
        for summary in hparams(values, dict.fromkeys(HPARAM_METRICS, 0.0)):
            file_writer.add_summary(summary)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def summary(self, values: dict[str, float], step: int, completed: bool) -> None:
        self.scalars(values, step)
        if completed and self.settings.get("projector"):
            projector(self.writer, self.run, self.config, self.settings.get("projector_tokens"), step)

    def close(self, completed: bool) -> None:
        self.writer.close()


class Wandb:
    """A W&B run in <run>/wandb/; `run_id` continues an earlier one (a resumed run)."""

    def __init__(self, run: Path, settings: dict, config: dict, run_id: str | None):
        import wandb

        # WANDB_MODE wins when set, as W&B users expect; otherwise logger.wandb.mode (offline by default).
        mode: Any = os.environ.get("WANDB_MODE") or settings["mode"]
        self.wandb = wandb.init(
            project=settings["project"],
            entity=settings.get("entity"),
            dir=str(run),
            id=run_id,
            resume="allow" if run_id else None,
            name=run.name,
            group=sweep_of(run),
            config=config,
            mode=mode,
            settings=wandb.Settings(console="off", quiet=True),  # console="off": W&B leaves stdout to tiecli
        )
        self.record = {"id": self.wandb.id, "project": settings["project"], "group": sweep_of(run), "mode": mode}

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.wandb.log(values, step=step)

    def summary(self, values: dict[str, float], step: int, completed: bool) -> None:
        self.wandb.summary.update(values)

    def close(self, completed: bool) -> None:
        import wandb

        self.wandb.finish(exit_code=0 if completed else 1)
        wandb.teardown()  # waits until W&B's service has written everything: the run directory is complete on close


class Trackers:
    """The trackers a run's config.yaml names (none: every call does nothing), fed by its RunWriter."""

    def __init__(self, run: Path, config: dict, records: dict, purge_step: int | None):
        logger = config.get("logger") or {}
        check_installed(logger)
        self.active: list[TensorBoard | Wandb] = []
        self.completed = False
        if "tensorboard" in logger:
            self.active.append(TensorBoard(run, logger["tensorboard"], config, purge_step))
        if "wandb" in logger:
            # A run restarted from scratch (purge_step 0) starts a new W&B run; a resumed one continues its own.
            run_id = records.get("wandb", {}).get("id") if purge_step != 0 else None
            self.active.append(Wandb(run, logger["wandb"], config, run_id))

    def records(self) -> dict:
        """What the run directory keeps about its trackers (trackers.json): the W&B run id."""
        wandb = next((t for t in self.active if isinstance(t, Wandb)), None)
        return {"wandb": wandb.record} if wandb else {}

    def row(self, row: dict) -> None:
        values = numbers({k: v for k, v in row.items() if k != "step"})
        for t in self.active:
            t.scalars(values, row["step"])

    def geometry(self, entry: dict) -> None:
        values = numbers({k: v for k, v in entry.items() if k != "step"}, "geometry/")
        for t in self.active:
            t.scalars(values, entry["step"])

    def eval(self, result: dict) -> None:
        values = numbers({k: v for k, v in result.items() if k not in ("split", "step")}, f"eval/{result['split']}/")
        for t in self.active:
            t.scalars(values, result["step"])

    def summary(self, summary: dict) -> None:
        """The final summary (not the `running` one written at the start)."""
        if summary["status"] == "running":
            return
        self.completed = summary["status"] == "completed"
        keys = ("params", "tokens", "wall_time", "train_time", "tokens_per_s", "best_val_loss", "final_val")
        values = numbers({k: summary[k] for k in keys if summary.get(k) is not None}, "summary/")
        for t in self.active:
            t.summary(values, summary["step"], self.completed)

    def close(self) -> None:
        for t in self.active:
            t.close(self.completed)


class Feed:
    """A RunWriter listener: the trackers config.yaml's `logger` names (TensorBoard, W&B) get each
    metrics row, evaluation, geometry entry and final summary right after it is written, started on
    the first of them. Both trackers only append, so they get only steps from `track_from` on: the
    run's step when the writer took it, the step after the checkpoint when a resume rolls back
    (TensorBoard then hides what it had past that point), so an earlier step re-measured later
    (`geometry --write --step 0`) stays out of them.
    """

    def __init__(self, run: RunWriter):
        self.run = run
        self.track_from = run.start_step
        self.purge_step: int | None = None
        self.tracking: Trackers | None = None

    def _trackers(self, step: int) -> Trackers | None:
        """The run's trackers, started on first use, when `step` may still go to them; else None."""
        if step < self.track_from:
            return None
        if self.tracking is None:
            reader = self.run.reader
            self.tracking = Trackers(self.run.path, reader.config(), reader.trackers(), self.purge_step)
            if self.tracking.records():
                self.run.trackers(self.tracking.records())
        return self.tracking

    def written(self, kind: str, record: dict) -> None:
        if kind == "summary" and record["status"] == "running":  # only the final summary goes to the trackers
            return
        if tracking := self._trackers(record["step"]):
            send = {
                "metrics": tracking.row,
                "eval": tracking.eval,
                "geometry": tracking.geometry,
                "summary": tracking.summary,
            }
            send[kind](record)

    def truncated(self, last_step: int) -> None:
        self.track_from = self.purge_step = last_step + 1  # the trackers get the redone steps, and hide the old ones

    def close(self) -> None:
        if self.tracking is not None:
            self.tracking.close()
        self.tracking = None


def create_run(path: Path, files: dict[str, str], summary: Summary, init: bytes) -> RunWriter:
    """RunWriter.create, its records fed to the run's trackers; a missing tracker package is refused first."""
    if CONFIG in files:  # before anything is written: a tracker's missing package is one line
        check_installed((yaml.safe_load(files[CONFIG]) or {}).get("logger"))
    run = RunWriter.create(path, files, summary, init)
    run.listeners.append(Feed(run))
    return run


def open_run(path: Path) -> RunWriter:
    """RunWriter.open, its records fed to the run's trackers (a resume, `eval`, `geometry --write`)."""
    run = RunWriter.open(path, check=lambda reader: check_installed(reader.config().get("logger")))
    run.listeners.append(Feed(run))
    return run


def projector(writer, run: Path, config: dict, limit: int | None, step: int) -> None:
    """The final input and output matrices in TensorBoard's embedding projector, token id and string as labels.

    Read back from the run's last checkpoint; with `limit`, only the most frequent tokens of the
    training split (the projector holds every point in the browser).
    """
    c = from_run(config, RunReader(run).overrides().get("choices", {}), run / CONFIG)
    ckpt = checkpoint.load_last(run)
    emb = checkpoint.embeddings_of(ckpt, c.model, run.name)
    corpus = load_corpus(c.data, c.tokenizer)
    ids = np.argsort(-corpus.counts, kind="stable")[: limit or len(corpus.counts)]
    strings = token_strings(corpus.encoding)
    labels = [[str(i), label(strings[i], corpus.encoding, i)] for i in ids.tolist()]
    matrices = (
        {"shared_matrix": emb.input_matrix()}
        if emb.one_matrix
        else {
            "input_embedding": emb.input_matrix(),
            "output_matrix": emb.output_matrix(),
        }
    )
    for tag, matrix in matrices.items():
        writer.add_embedding(
            matrix.detach()[ids].float(), metadata=labels, metadata_header=["id", "token"], tag=tag, global_step=step
        )


def label(text: str | None, encoding, token: int) -> str:
    """A token's string for a TSV cell: quoted so spaces show, escapes for tabs and newlines; bytes when not UTF-8."""
    if text is None:
        return repr(encoding.decode_single_token_bytes(token))
    return repr(text)
