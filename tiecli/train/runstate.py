# Used by `tiecli train`: a run's state between steps and on disk.
"""Where training stands (TrainState), and the run directory's side of it: a new run's summary, a
resumed run's checkpoint restored into the Setup, checkpoints saved, and the final summary written.
"""

import math
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import tiecli
from tiecli.config.schema import Config
from tiecli.errors import TiecliError
from tiecli.measure import baselines
from tiecli.model import checkpoint
from tiecli.run.files import now
from tiecli.run.layout import CHECKPOINT, SUMMARY, new_run_id
from tiecli.run.reader import RunReader
from tiecli.run.records import Summary
from tiecli.run.writer import RunWriter
from tiecli.runtime import distributed
from tiecli.runtime.device import Threads, pick_device, use_threads
from tiecli.train import resume as resuming
from tiecli.train import trackers
from tiecli.train.prepare import Setup


class Diverged(TiecliError):
    """The training loss became NaN or infinite; the last checkpoint from before it stays."""


@dataclass
class TrainState:
    """Everything a checkpoint carries besides weights, optimizer and RNG, to resume exactly."""

    step: int = 0
    tokens: int = 0
    train_time: float = 0.0
    wall_time: float = 0.0
    best_val_loss: float | None = None
    best_val_step: int | None = None
    loss_sum: float = 0.0  # train loss summed since the last log line
    loss_n: int = 0
    run_id: str | None = None  # summary.json's: a resume refuses a checkpoint of another run
    logged_step: int | None = None  # the step of the last metrics.jsonl row: a resume checks the file still has it
    eval_tokens: int | None = None  # the final evaluation's tokens a split, decided before step 1 (None: whole splits)
    eval_bound: str = ""  # which setting decided eval_tokens: eval.max_tokens or eval.max_seconds


def new_summary(s: Setup, name: str) -> Summary:
    c = s.config
    return Summary(
        name=name,
        status="running",
        seed=c.seed,
        params=s.model.param_counts(),
        max_steps=c.max_steps,
        tokens_per_step=c.tokens_per_step,
        step=0,
        tokens=0,
        device=str(s.device),
        dtype=s.dtype,
        compile=s.compiled,
        world_size=distributed.world_size(),
        batch=distributed.batch_info(c.train, c.model.block_size),
        versions={"tiecli": tiecli.__version__, "torch": torch.__version__, "python": platform.python_version()},
        corpus={
            "key": s.corpus.key,
            "key_scheme": 2,  # 2: the input files' bytes and split settings (data/tokens.py); before: the split texts
            "train_tokens": len(s.corpus.tokens["train"]),
            "vocab_size": s.corpus.encoding.n_vocab,
            "baselines": baselines.of_corpus(s.corpus),
        },
        started=now(),
        run_id=new_run_id(),
    )


def open_run(s: Setup, run_dir: Path, resume: bool, files: dict[str, str]) -> tuple[RunWriter, TrainState, bool]:
    """The run's writer and where training stands: a new run at step 0, or a resumed one at its checkpoint."""
    if not resume:
        init, summary = checkpoint.to_bytes({"emb": s.model.emb.state_dict()}), new_summary(s, run_dir.name)
        return trackers.create_run(run_dir, files, summary, init), TrainState(run_id=summary.run_id), False
    run = trackers.open_run(run_dir)
    try:
        run.reader.check_corpus(s.corpus.key)
        resuming.check_files(run.reader, s.config.model)  # nothing is changed until all of them have been read
        run_id = run.reader.summary().run_id or new_run_id()  # a run from before run ids gets one now
        if not (run_dir / CHECKPOINT).is_file():
            if run.reader.summary().step > 0:  # never replace trained steps with a fresh start
                raise TiecliError(
                    f"run {run_dir.name} has no checkpoint ({CHECKPOINT}) to resume from; "
                    "its recorded steps are kept: start a new run with another --name"
                )
            run.truncate_after(-1)
            run.rewrite(files)
            return run, TrainState(run_id=run_id), False
        ckpt = checkpoint.load_last(run_dir)
        distributed.check_world_size(ckpt, run_dir.name)
        stored = run.reader.config().get("train", {}).get("log_interval", 1)  # what the checkpoint was written with
        resuming.check_checkpoint(run.reader, ckpt, max(stored, s.config.train.log_interval))
        state = restore(s, ckpt, run_dir.name)
        state.run_id = run_id
        if run.reader.summary().status == "completed":  # an extension that fails puts the run back (train.train)
            run.keep_restore_point()
        run.truncate_after(state.step)
        run.rewrite(files)  # config.yaml with what the overrides extend (train.max_steps=...)
        return run, state, True
    except BaseException:
        run.close()
        raise


def restore(s: Setup, ckpt: dict, name: str) -> TrainState:
    """Weights, optimizer, this rank's RNG streams and the loop's state from a checkpoint."""
    checkpoint.load_weights(s.model, ckpt["model"], name, "the model weights")
    try:  # a checkpoint whose optimizer, RNG or loop state is not this run's: one line, not a traceback
        state = TrainState(**ckpt["state"])
        s.optimizer.load_state_dict(ckpt["optimizer"])
        if s.scaler and "scaler" in ckpt:
            s.scaler.load_state_dict(ckpt["scaler"])
        rng = distributed.rng_of_rank(ckpt)
        torch.set_rng_state(rng["torch"])
        s.sampler.set_state(rng["sampler"])
        checkpoint.restore_device_rng(rng, s.device)
        state.loss_sum = rng.get("loss_sum", state.loss_sum)  # a rank's own train loss since the last log line
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        reason = (str(e).strip().splitlines() or [""])[0][:160]
        raise TiecliError(
            f"run {name}: checkpoint {CHECKPOINT.name} does not match this run ({type(e).__name__}: {reason})"
        ) from None
    return state


def open_on_ranks(
    s: Setup, run_dir: Path, resume: bool, files: dict[str, str]
) -> tuple[RunWriter | None, TrainState, bool]:
    """open_run on rank 0, which alone writes the run; the other ranks get no writer, and on a resume
    load the checkpoint rank 0 has checked. Rank 0's refusal (a bad checkpoint) is every rank's."""
    opened: tuple[RunWriter, TrainState, bool] | None = None

    def plan() -> bool:
        nonlocal opened
        opened = open_run(s, run_dir, resume, files)
        return opened[2]

    resumed = distributed.from_rank0(plan)
    if opened is not None:
        return opened
    if not resumed:
        return None, TrainState(), False
    return None, restore(s, checkpoint.load(run_dir / CHECKPOINT, run_dir.name), run_dir.name), True


def run_threads(config: Config, run_dir: Path, resume: bool) -> Threads:
    """This process's torch threads (runtime.use_threads); a resumed run keeps the count it trained with,
    since another count sums in another order (the last bits of its losses would differ)."""
    kept = RunReader(run_dir).summary().threads if resume and (run_dir / SUMMARY).is_file() else None
    return use_threads(pick_device(config.device), kept)


def mean_loss(loss_acc: torch.Tensor, state: TrainState, run: RunWriter | None) -> float:
    """The mean train loss since the last log line; a NaN or infinite one stops the run."""
    loss = loss_acc.item() / max(1, state.loss_n)
    if not math.isfinite(loss):
        kept = checkpoint.load_last(run.path)["state"]["step"] if run and (run.path / CHECKPOINT).is_file() else 0
        raise Diverged(
            f"the training loss became {loss} by step {state.step}; the checkpoint from step {kept} is kept "
            "(try a lower train.lr)"
        )
    return loss


def save_checkpoint(
    s: Setup, run: RunWriter | None, state: TrainState, loss_acc: torch.Tensor, keep: bool = False
) -> None:
    """last.pt: weights, optimizer, every RNG and the loop's state. Never one from after a NaN loss.

    Under DDP rank 0 writes it, with each other rank's RNG streams and train loss in `rank_rng`.
    keep: one of the checkpoint_interval's, which train.keep_checkpoints keeps as step_N.pt too."""
    state.loss_sum = loss_acc.item()
    if distributed.any_rank(not math.isfinite(state.loss_sum)):
        mean_loss(distributed.mean_(loss_acc.clone()), state, run)  # raises Diverged, naming the checkpoint kept
    # the sampler's state from before a prefetched draw, so a resume draws it again
    rng = {"torch": torch.get_rng_state(), "sampler": s.batches.state(), **checkpoint.device_rng(s.device)}
    ranks = distributed.gather({**rng, "loss_sum": state.loss_sum})
    if run is None or ranks is None:
        return
    ckpt: dict[str, object] = {
        "model": s.model.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "rng": rng,
        "state": asdict(state),
        "config": run.reader.config(),  # what it trained with: a resume refuses a config.yaml edited since
    }
    if len(ranks) > 1:
        ckpt["rank_rng"] = ranks[1:]
    if s.scaler:
        ckpt["scaler"] = s.scaler.state_dict()
    run.save(CHECKPOINT, checkpoint.to_bytes(ckpt))
    if keep:
        run.keep_checkpoint(state.step, s.config.train.keep_checkpoints)
    summary = run.reader.summary()  # still `running`: its step is where a resume starts, even after kill -9
    summary.step, summary.tokens = state.step, state.tokens
    run.summary(summary)


def finish(run: RunWriter, summary: Summary, state: TrainState, status: str, **fields) -> Summary:
    """The final summary.json; when even that cannot be written (a full disk), the original error still wins."""
    summary.wall_time = state.wall_time
    summary.status, summary.step, summary.tokens = status, state.step, state.tokens
    summary.train_time, summary.tokens_per_s = state.train_time, state.tokens / max(state.train_time, 1e-9)
    summary.best_val_loss, summary.best_val_step, summary.ended = state.best_val_loss, state.best_val_step, now()
    for key, value in fields.items():
        setattr(summary, key, value)
    try:
        run.summary(summary)
    except OSError:
        if status == "completed":
            raise
    return summary
