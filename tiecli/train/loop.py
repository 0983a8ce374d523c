# Used by `tiecli train`: set up, train, evaluate; every file of the run goes through its RunWriter.
"""The training recipe: data -> model -> AdamW with warmup + cosine -> checkpoints -> final evaluation.

A run can be stopped (Ctrl-C or SIGTERM: the current step finishes, a checkpoint is saved, the run
is marked interrupted) and resumed with `--resume`, which restores model, optimizer, every RNG and
the data sampler, so on CPU the resumed run reproduces the uninterrupted one exactly.
"""

import signal
import time
from pathlib import Path

import torch
from rich.console import Console

from tiecli.config.schema import Config
from tiecli.errors import Interrupted, TiecliError
from tiecli.formats import TrainProgress
from tiecli.measure import cancellation, diagnostics
from tiecli.measure.evaluate import budget_tokens, evaluate, expected_line, final_windows
from tiecli.model import checkpoint
from tiecli.model.gpt import Embeddings
from tiecli.run.files import now
from tiecli.run.layout import INIT_CHECKPOINT, SNAPSHOTS
from tiecli.run.records import EvalResult, GeometryEntry, MetricsRow, Summary, parse_record
from tiecli.run.writer import RunWriter
from tiecli.runtime import distributed
from tiecli.runtime.device import full_fp32, peak_memory, synchronize
from tiecli.runtime.launcher import launched
from tiecli.train.optim import lr_at, untie, untie_step
from tiecli.train.prepare import Setup, set_up
from tiecli.train.runstate import TrainState, finish, mean_loss, open_on_ranks, run_threads, save_checkpoint


class StopFlag:
    """Ctrl-C and SIGTERM (SIGUSR2: a cluster's time limit) ask the loop to stop after the current step.

    After the first Ctrl-C, SIGINT gets its default action back, so a second Ctrl-C ends the process
    at once, even inside a long native op; the last checkpoint stays valid (it is written atomically)
    and the run then reads `interrupted`, since its lock is gone.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

    def __init__(self):
        self.requested = False
        self.previous = {}

    def __enter__(self) -> "StopFlag":
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame) -> None:
        self.requested = True
        if signum == signal.SIGINT and not launched():  # torchrun passes a Ctrl-C on: a second one
            signal.signal(signal.SIGINT, signal.SIG_DFL)

    def check(self) -> None:
        """Raise Interrupted if a stop was asked for: long evaluations call this between batches."""
        if self.requested:
            raise Interrupted(
                "interrupted during the final evaluation; the checkpoint is kept, --resume evaluates again"
            )

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(
    config: Config, run_dir: Path, resume: bool, files: dict[str, str], console: Console | None = None
) -> Summary | None:
    """Train one run into run_dir and evaluate it; returns its final Summary (None on ranks other than 0).

    files: the config.yaml and overrides.yaml texts of a new run directory; with resume, the
    config.yaml the overrides extended, written once the checkpoint has been found to fit.
    """
    console = console or Console(stderr=True, quiet=not distributed.is_rank0())
    with StopFlag() as stop:
        threads = run_threads(config, run_dir, resume)
        s = set_up(config)
        if distributed.any_rank(stop.requested):  # every rank stops here, so rank 0 alone says so
            raise Interrupted("interrupted before the run started; nothing was written")
        run, state, resumed = open_on_ranks(s, run_dir, resume, files)
        if run is None:  # a rank other than 0: trains in step with rank 0 and writes nothing
            with TrainProgress(
                console, run_dir.name, config.max_steps, state.step, config.train.log_interval, s.compiled
            ) as p:
                fit(s, None, state, p, stop, fresh=not resumed)
            final_evals(s, state, stop)  # its share of the windows: rank 0 gets the reduced numbers
            return None
        with run:
            if resumed:
                console.print(f"resuming {run_dir.name} from step {state.step}", highlight=False)
            if threads.warning():
                console.print(threads.warning(), highlight=False, markup=False, soft_wrap=True)
            console.print(distributed.batch_line(config.train, config.model.block_size), highlight=False)
            warning = distributed.small_batch_warning(s.device, config.train, config.model.block_size)
            if warning:
                console.print(warning, style="yellow", highlight=False)
            summary = run.reader.summary()
            summary.status, summary.error, summary.started = "running", None, now()
            summary.run_id = state.run_id
            summary.max_steps, summary.threads = config.max_steps, threads.n
            run.summary(summary)
            try:
                with TrainProgress(
                    console, run_dir.name, config.max_steps, state.step, config.train.log_interval, s.compiled
                ) as progress:
                    fit(s, run, state, progress, stop, fresh=not resumed)
                    finals = final_evals(s, state, stop)
                for result in finals:
                    run.eval(result)
                peak = peak_memory(s.device)
                summary = finish(run, summary, state, "completed", final_val=finals[0].brief(), peak_memory=peak)
                run.drop_restore_point()
                return summary
            except Interrupted as e:
                finish(run, summary, state, "interrupted", error=str(e), peak_memory=peak_memory(s.device))
                run.drop_restore_point()  # a stopped extension continues with --resume
                raise
            except BaseException as e:
                if run.has_restore_point():
                    undo_extension(run, e)
                error = f"{type(e).__name__}: {e}".strip()
                finish(run, summary, state, "failed", error=error, peak_memory=peak_memory(s.device))
                raise


def undo_extension(run: RunWriter, e: BaseException) -> None:
    """Put back a completed run whose extension failed (a full disk, a folder it may not write) as it was,
    completed, and raise the error saying so; returns only when the run could not be put back (the
    caller then marks it failed)."""
    try:
        run.undo()
    except OSError:
        return
    note = f"the extension was undone: run {run.path.name} is completed at step {run.reader.summary().step}, as before"
    if isinstance(e, TiecliError):
        raise type(e)(f"{e}; {note}") from None
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename else ""
        raise TiecliError(f"{e.strerror or type(e).__name__}{where}; {note}") from None
    raise e


def fit(
    s: Setup, run: RunWriter | None, state: TrainState, progress: TrainProgress, stop: StopFlag, fresh: bool
) -> None:
    """The training loop: set lr -> micro-steps -> diagnostics -> clip -> step -> log/eval/checkpoint.

    Under DDP every rank runs it in step; rank 0 alone (run is not None) evaluates and writes."""
    c, t, d = s.config, s.config.train, s.config.diag
    max_steps, model, optimizer = c.max_steps, s.model, s.optimizer
    switch = untie_step(c)  # None but in tying=tied_then_untied
    emb0 = checkpoint.load_embeddings(run.path / INIT_CHECKPOINT, c.model, run.path.name) if run else None
    buckets_t = torch.from_numpy(s.buckets.astype("int64")).to(s.device)
    pair_index = diagnostics.pair_index(s.pairs, s.corpus.counts, d.seed, s.device) if d.every > 0 else None
    loss_acc = torch.tensor(state.loss_sum, device=s.device)  # train loss summed since the last log line
    if fresh and run:  # a checkpoint at step 0 (stopped before the first step) already has these
        log_step_0(s, run, state, progress, emb0)
    interval_time, interval_tokens = 0.0, 0  # the steps' own time since the last log line: no evaluation, no save
    tick = time.perf_counter()
    while state.step < max_steps and not distributed.any_rank(stop.requested):  # a signal to any rank stops all
        step_start = time.perf_counter()
        state.wall_time += step_start - tick  # everything between steps too: logging, evaluation, checkpoints
        tick = step_start
        if switch is not None and model.emb.untie_pending and state.step >= switch:  # tied_then_untied's switch
            untie_now(s, state.step, progress)
        lr = set_lr(optimizer, state.step, c)
        diag_now = d.every > 0 and (state.step + 1) % d.every == 0
        present = micro_steps(s, loss_acc, diag_now)
        diag = grad_stats(s, present, buckets_t, state.step, pair_index)
        model.emb.clear_split_grads()
        grad_norm = clip_and_step(s)
        state.step += 1
        if state.step < max_steps:
            s.batches.prefetch()  # the host reads the next step's windows while the device runs this one
        state.tokens += c.tokens_per_step
        state.loss_n += 1
        at_eval, at_save = c.is_eval_step(state.step), c.is_checkpoint_step(state.step)
        log_now = state.step % t.log_interval == 0 or at_eval or bool(diag)
        if log_now or at_save:  # a GPU runs behind the host: wait, so the times measure its work, not the queue
            synchronize(s.device)
        step_time = time.perf_counter() - step_start
        state.train_time += step_time
        interval_time += step_time
        interval_tokens += c.tokens_per_step
        progress.advance(state.step)

        if log_now:
            tps = interval_tokens / max(interval_time, 1e-9)
            loss = mean_loss(distributed.mean_(loss_acc), state, run)
            if run:  # rank 0 evaluates and writes; the others wait for it in the next step
                row = MetricsRow(state.step, state.tokens, lr, loss, grad_norm.item(), tps, diag=diag)
                log(run, state, row, subset_evals(s) if at_eval else None, progress)
                if at_eval:
                    record_geometry(s, run, emb0, state.step)
            loss_acc.zero_()
            state.loss_n = 0
            interval_time, interval_tokens = 0.0, 0
        if at_save:
            save_checkpoint(s, run, state, loss_acc, keep=True)
    if state.step < max_steps:
        save_checkpoint(s, run, state, loss_acc)
        raise Interrupted(f"interrupted at step {state.step}/{max_steps}; checkpoint saved")


def untie_now(s: Setup, step: int, progress: TrainProgress) -> None:
    """tying=tied_then_untied: the shared matrix becomes two, each with its AdamW state; said in one line."""
    untie(s.model, s.optimizer)
    progress.plain(f"step {step}: the shared matrix is now two (tying.untie_at={s.config.model.untie_at})")


def set_lr(optimizer: torch.optim.Optimizer, step: int, c: Config) -> float:
    """The schedule's peak-relative rate at this step, set on every group at its own scale; returns it."""
    lr = lr_at(step, c)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    return lr


def log_step_0(s: Setup, run: RunWriter, state: TrainState, progress: TrainProgress, emb0) -> None:
    """The step-0 evaluation and geometry; the final evaluation's budget (eval.max_tokens, eval.max_seconds
    at the pace just measured), kept in the state so a resume evaluates the same, and its expected time."""
    c, t = s.config, s.config.train
    start = time.perf_counter()
    log(run, state, MetricsRow(step=0, tokens=0, lr=0.0), subset_evals(s), progress)
    pace = 2 * t.eval_batches * t.batch_size * c.model.block_size / (time.perf_counter() - start)
    splits = ["val", "train", *(["test"] if c.eval.test else [])]
    pace *= distributed.world_size()  # the final evaluation is sharded across the ranks
    b = c.model.block_size
    state.eval_tokens, state.eval_bound = budget_tokens(c.eval.max_tokens, c.eval.max_seconds, len(splits), pace, b)
    progress.plain(expected_line(s.corpus, splits, b, state.eval_tokens, pace, state.eval_bound))
    record_geometry(s, run, emb0, 0)


def clip_and_step(s: Setup) -> torch.Tensor:
    """Clip the global gradient norm and step the optimizer; returns the norm before clipping."""
    optimizer = s.optimizer
    if s.scaler:  # fp16: clip the true gradients; a step whose gradients overflowed is skipped
        s.scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.config.train.grad_clip or float("inf"))
    if s.scaler:
        s.scaler.step(optimizer)
        s.scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def grad_stats(
    s: Setup, present: torch.Tensor | None, buckets: torch.Tensor, step: int, pairs: diagnostics.PairIndex | None
) -> dict:
    """Gradient interference of the token matrices (present: the input tokens, None off diag steps), and
    at the related-form pairs. Before clipping: the statistics describe the raw gradients that tying would sum."""
    if present is None:
        return {}
    emb = s.model.emb
    g_in, g_out, present = distributed.across_ranks(emb, *diagnostics.gradient_paths(emb), present)
    if s.scaler:  # fp16: the gradients are still multiplied by the loss scale
        g_in, g_out = g_in / s.scaler.get_scale(), g_out / s.scaler.get_scale()
    stats = diagnostics.interference(g_in, g_out, present, buckets, seed=s.config.diag.seed, step=step)
    assert pairs is not None  # fit draws them whenever diag.every > 0, which present requires
    matrices = diagnostics.path_matrices(emb)
    stats |= diagnostics.pair_gradients(g_in, g_out, *matrices, pairs)
    return stats | cancellation.pair_cancellation(g_in, g_out, *matrices, pairs, s.optimizer)


def micro_steps(s: Setup, loss_acc: torch.Tensor, diag_now: bool) -> torch.Tensor | None:
    """Forward and backward over grad_accum micro-batches; returns which tokens were inputs (for diagnostics)."""
    present = torch.zeros(s.config.model.vocab_size, dtype=torch.bool, device=s.device) if diag_now else None
    batches = s.batches.next()  # this rank's share of one process's draws, on the device
    for i, (x, y) in enumerate(batches):
        distributed.sync_grads(s.forward, now=i == len(batches) - 1)
        if present is not None:
            present[x.flatten()] = True
        with s.autocast():
            loss = s.forward(x, y) / len(batches)
        (s.scaler.scale(loss) if s.scaler else loss).backward()
        loss_acc += loss.detach().float()
    return present


def subset_evals(s: Setup) -> dict[str, dict]:
    """The in-training evaluation: the same eval_batches x batch_size fixed windows of the validation and
    the training split every time, so val_loss - train_eval_loss is the generalisation gap."""
    t = s.config.train
    return {
        split: evaluate(s.model, s.corpus, split, s.buckets, s.device, s.autocast, limit=t.eval_batches * t.batch_size)
        for split in ("val", "train")
    }


def final_evals(s: Setup, state: TrainState, stop: StopFlag) -> list[EvalResult]:
    """The validation split, the training split and, with eval.test, the test split: each whole, or a
    fixed subset past eval.max_tokens (final_windows). Every rank evaluates its share (shard).

    One process stops between batches on Ctrl-C; ranks, whose shares differ by a batch, agree on a
    stop before each split (a rank that left alone would leave the others waiting in the reduction)."""
    block_size, alone = s.config.model.block_size, distributed.world_size() == 1
    budget = distributed.from_rank0(lambda: state.eval_tokens)  # rank 0 decided it at step 0
    if budget is None and not state.eval_bound:  # a checkpoint from before the time budget: eval.max_tokens
        budget = s.config.eval.max_tokens
    results = []
    for split in ["val", "train", *(["test"] if s.config.eval.test else [])]:
        if distributed.any_rank(stop.requested):
            stop.requested = True
            stop.check()
        windows = final_windows(s.corpus, split, block_size, budget)
        check = stop.check if alone else None
        result = evaluate(
            s.model, s.corpus, split, s.buckets, s.device, s.autocast, check=check, windows=windows, shard=True
        )
        results.append(EvalResult(step=state.step, **result))
    return results


def log(
    run: RunWriter, state: TrainState, row: MetricsRow, evals: dict[str, dict] | None, progress: TrainProgress
) -> None:
    """Append one metrics.jsonl line; with evaluation metrics, also track the best val loss."""
    if evals is not None:
        val = evals["val"]
        row.val_loss, row.val_ppl, row.val_bpb = val["loss"], val["perplexity"], val["bits_per_byte"]
        row.train_eval_loss = evals["train"]["loss"]
        if state.best_val_loss is None or val["loss"] < state.best_val_loss:
            state.best_val_loss, state.best_val_step = val["loss"], row.step
    run.log(row)
    state.logged_step = row.step
    progress.log(row)


def record_geometry(s: Setup, run: RunWriter, emb0: Embeddings | None, step: int) -> None:
    d = s.config.diag
    if not d.geometry or emb0 is None:  # emb0: rank 0's, the only rank that records
        return
    with full_fp32():  # the geometry is float32 by design: no TF32 matmuls, which training enables on CUDA
        entry = diagnostics.embedding_geometry(
            s.model.emb, emb0, s.corpus.counts, s.buckets, s.pairs, s.pairs_info, d.seed
        )
    run.geometry(parse_record(GeometryEntry, {"step": step, **entry}, "a geometry entry"))
    run.row_sample(step, *diagnostics.row_sample(s.model.emb, s.corpus.counts))
    if d.snapshots and snapshot_due(s.config, step):
        run.save(SNAPSHOTS / f"step_{step}.pt", checkpoint.to_bytes({"emb": s.model.emb.state_dict()}))
        for kept in run.reader.snapshot_steps():  # a resume that changed the schedule leaves some off the plan
            if not snapshot_due(s.config, kept):
                run.remove_snapshot(kept)


def snapshot_due(c: Config, step: int) -> bool:
    """Whether checkpoints/emb/ keeps step's token matrices: of the geometry steps (0 and each
    evaluation), at most diag.max_snapshots, evenly spread by index, the first and the last among them."""
    if step != 0 and not c.is_eval_step(step):
        return False
    last, most = c.n_evals, c.diag.max_snapshots  # geometry steps are numbered 0..last
    return last < most or c.evals_by(step) in {round(i * last / (most - 1)) for i in range(most)}
