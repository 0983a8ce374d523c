# Used by `tiecli train`: set up, train, evaluate, and keep the run directory true throughout.
"""The training recipe: data -> model -> AdamW with warmup + cosine -> checkpoints -> final evaluation.

A run can be stopped (Ctrl-C or SIGTERM: the current step finishes, a checkpoint is saved, the run
is marked interrupted) and resumed with `--resume`, which restores model, optimizer, every RNG and
the data sampler, so on CPU the resumed run reproduces the uninterrupted one exactly.
"""

import math
import platform
import signal
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

import tiecli
from tiecli import checkpoint, diagnostics, rundir
from tiecli.config import Config, TrainConfig
from tiecli.data import get_batch, load_corpus
from tiecli.errors import TiecliError
from tiecli.evaluate import evaluate
from tiecli.model import GPT
from tiecli.runtime import autocast_for, pick_device, pick_dtype


class Interrupted(TiecliError):
    """The run stopped on Ctrl-C/SIGTERM after saving a checkpoint."""

    exit_code = 130


def make_optimizer(model: GPT, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; matrices decay, biases and LayerNorm gains never do, embeddings as train.decay_embeddings says."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # a tied matrix appears once: no duplicate in the groups
        is_embedding = name.startswith(("emb.", "wpe."))
        (decay if p.dim() >= 2 and (t.decay_embeddings or not is_embedding) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type in ("cuda", "cpu"))


def lr_at(step: int, t: TrainConfig, max_steps: int) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at max_steps."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, max_steps - t.warmup_steps)
    return t.min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (t.lr - t.min_lr)


def build_model(config: Config, device: torch.device) -> GPT:
    torch.manual_seed(config.seed)
    return GPT(config.model).to(device)


class StopFlag:
    """Ctrl-C and SIGTERM ask the loop to stop after the current step; a second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(config: Config, run_dir: Path, resume: bool, files: dict[str, str], console: Console | None = None) -> dict:
    """Train one run into run_dir (created here once the data is ready); returns summary.json's content.

    files: the config.yaml and overrides.yaml texts to write into a new run directory.
    """
    console = console or Console(stderr=True)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    autocast = autocast_for(device, dtype)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    corpus = load_corpus(config.data, config.tokenizer)
    buckets = corpus.buckets(config.eval.buckets)
    model = build_model(config, device)
    optimizer = make_optimizer(model, config.train, device)
    sampler = torch.Generator().manual_seed(config.seed)
    max_steps = config.max_steps
    t, d = config.train, config.diag
    pairs, pairs_info = diagnostics.form_pairs(corpus.encoding, d.pairs) if d.geometry else ([], {})

    ckpt_path = run_dir / rundir.CHECKPOINT
    # Everything a checkpoint must carry besides weights, optimizer and RNG to resume exactly.
    state = {"step": 0, "tokens": 0, "train_time": 0.0, "wall_time": 0.0,
             "best_val_loss": None, "best_val_step": None, "loss_sum": 0.0, "loss_n": 0}
    resumed = resume and ckpt_path.exists()
    if resumed:
        rundir.check_corpus(run_dir, corpus.key)
        ckpt = checkpoint.load(ckpt_path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        sampler.set_state(ckpt["rng"]["sampler"])
        if device.type == "cuda" and "cuda" in ckpt["rng"]:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"])
        state = ckpt["state"]
        rundir.truncate_after(run_dir, state["step"])
        console.print(f"resuming {run_dir.name} from step {state['step']}")
    else:
        rundir.truncate_after(run_dir, -1)
        for name, text in files.items():
            rundir.atomic_write(run_dir / name, text)
        checkpoint.save(run_dir / rundir.INIT_CHECKPOINT, {"emb": model.emb.state_dict()})
    # The token matrices at step 0, for drift: read back from disk, so they survive --resume.
    emb0 = diagnostics.embeddings_from_state(checkpoint.load(run_dir / rundir.INIT_CHECKPOINT)["emb"], config.model)
    geometry_log = rundir.read_json(run_dir / rundir.GEOMETRY) if (run_dir / rundir.GEOMETRY).exists() else []
    buckets_t = torch.from_numpy(buckets.astype("int64")).to(device)

    if config.compile:
        # The transformer blocks only: they hold the fusible work, while the token matrices stay
        # eager, so the gradient-recording hooks and views of diagnostics never break a graph.
        for block in model.h:
            block.compile()

    summary = {
        "name": run_dir.name,
        "status": "running",
        "error": None,
        "seed": config.seed,
        "params": model.param_counts(),
        "max_steps": max_steps,
        "tokens_per_step": config.tokens_per_step,
        "step": state["step"],
        "tokens": state["tokens"],
        "device": str(device),
        "dtype": dtype,
        "compile": config.compile,
        "versions": {"tiecli": tiecli.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "corpus": {"key": corpus.key, "train_tokens": len(corpus.tokens["train"]), "vocab_size": corpus.encoding.n_vocab},
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
    session_start, wall_before = time.perf_counter(), state["wall_time"]

    loss_acc = torch.tensor(state["loss_sum"], device=device)  # train loss summed since the last log line

    def save_checkpoint() -> None:
        state["loss_sum"] = loss_acc.item()
        rng = {"torch": torch.get_rng_state(), "sampler": sampler.get_state()}
        if device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        state["wall_time"] = wall_before + time.perf_counter() - session_start
        checkpoint.save(ckpt_path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng, "state": state})

    def val_subset() -> dict:
        return evaluate(model, corpus, "val", buckets, device, autocast, limit=t.eval_batches * t.batch_size)

    def record_geometry(step: int) -> None:
        if not d.geometry:
            return
        entry = diagnostics.embedding_geometry(model.emb, emb0, corpus.counts, buckets, pairs, pairs_info, d.seed)
        geometry_log.append({"step": step, **entry})
        rundir.write_json(run_dir / rundir.GEOMETRY, geometry_log)
        if d.snapshots:
            checkpoint.save(run_dir / rundir.SNAPSHOTS / f"step_{step}.pt", {"emb": model.emb.state_dict()})

    def finish(status: str, **fields) -> None:
        state["wall_time"] = wall_before + time.perf_counter() - session_start
        summary.update(status=status, step=state["step"], tokens=state["tokens"], wall_time=state["wall_time"],
                       train_time=state["train_time"], tokens_per_s=state["tokens"] / max(state["train_time"], 1e-9),
                       best_val_loss=state["best_val_loss"], best_val_step=state["best_val_step"],
                       ended=datetime.now(timezone.utc).isoformat(timespec="seconds"), **fields)
        rundir.write_json(run_dir / rundir.SUMMARY, summary)

    try:
        with StopFlag() as stop, _progress(console) as progress:
            task = progress.add_task(run_dir.name, total=max_steps, completed=state["step"], loss=float("nan"), tps=0.0)
            if not resumed:  # a checkpoint at step 0 (stopped before the first step) already has these
                _log(run_dir, state, {"step": 0, "tokens": 0, "lr": 0.0}, val_subset())
                record_geometry(0)
            interval_start, interval_tokens = time.perf_counter(), 0
            while state["step"] < max_steps and not stop.requested:
                step_start = time.perf_counter()
                lr = lr_at(state["step"], t, max_steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                diag_now = d.every > 0 and (state["step"] + 1) % d.every == 0
                model.emb.record_grads, model.emb.grads = diag_now, {}
                if diag_now:
                    present = torch.zeros(config.model.vocab_size, dtype=torch.bool, device=device)  # tokens in the inputs
                for _ in range(t.grad_accum):
                    x, y = get_batch(corpus.tokens["train"], t.batch_size, config.model.block_size, sampler)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    if diag_now:
                        present[x.flatten()] = True
                    with autocast():
                        loss = model(x, y) / t.grad_accum
                    loss.backward()
                    loss_acc += loss.detach().float()
                # Before clipping: the statistics describe the raw gradients that tying would sum.
                diag = diagnostics.interference(*diagnostics.gradient_paths(model.emb), present, buckets_t) if diag_now else {}
                model.emb.grads = {}
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip or float("inf"))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                state["tokens"] += config.tokens_per_step
                state["loss_n"] += 1
                state["train_time"] += time.perf_counter() - step_start
                interval_tokens += config.tokens_per_step
                progress.advance(task)

                step = state["step"]
                at_eval = step % t.eval_interval == 0 or step == max_steps
                if step % t.log_interval == 0 or at_eval or diag:
                    tps = interval_tokens / (time.perf_counter() - interval_start)
                    row = {"step": step, "tokens": state["tokens"], "loss": loss_acc.item() / state["loss_n"],
                           "lr": lr, "grad_norm": grad_norm.item(), "tokens_per_s": tps, **diag}
                    _log(run_dir, state, row, val_subset() if at_eval else None)
                    if at_eval:
                        record_geometry(step)
                    progress.update(task, loss=row["loss"], tps=tps)
                    loss_acc.zero_()
                    state["loss_n"] = 0
                    interval_start, interval_tokens = time.perf_counter(), 0
                if step % t.checkpoint_interval == 0 or step == max_steps:
                    save_checkpoint()
            if stop.requested and state["step"] < max_steps:
                save_checkpoint()
                finish("interrupted")
                raise Interrupted(f"interrupted at step {state['step']}/{max_steps}; checkpoint saved, continue with --resume")
            final = evaluate(model, corpus, "val", buckets, device, autocast)
            final["step"] = state["step"]
        rundir.record_eval(run_dir, final)
        finish("completed", final_val=_brief(final))
        return summary
    except Interrupted:
        raise
    except KeyboardInterrupt:
        finish("interrupted", error="stopped at once by a second Ctrl-C; --resume continues from the last checkpoint")
        raise Interrupted(f"stopped at once at step {state['step']}/{max_steps}; --resume continues from the last checkpoint") from None
    except BaseException as e:
        finish("failed", error=f"{type(e).__name__}: {e}".strip())
        raise


def _brief(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("loss", "perplexity", "bits_per_byte", "n_tokens")}


def _log(run_dir: Path, state: dict, row: dict, val: dict | None) -> None:
    """Append one metrics.jsonl line; with validation metrics, also track the best val loss."""
    if val is not None:
        row.update(val_loss=val["loss"], val_ppl=val["perplexity"], val_bpb=val["bits_per_byte"])
        if state["best_val_loss"] is None or val["loss"] < state["best_val_loss"]:
            state["best_val_loss"], state["best_val_step"] = val["loss"], row["step"]
    rundir.append_jsonl(run_dir / rundir.METRICS, row)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("step {task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(),
        console=console,
    )
