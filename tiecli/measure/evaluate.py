# Used by `tiecli train` (validation during and after training) and `tiecli eval RUN`.
"""Loss, perplexity, bits per byte and perplexity by token-frequency bucket on a held-out split."""

import contextlib
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from tiecli.data.batches import eval_windows
from tiecli.data.tokens import BUCKETS, Corpus
from tiecli.model.gpt import GPT

TRAIN_EVAL_FACTOR = (
    4  # the training split's whole-split evaluation covers at most this many times the validation split's windows
)


def whole_split_limit(corpus: Corpus, split: str, block_size: int) -> int | None:
    """Windows a whole-split evaluation reads: all of them (None), except in the training split.

    The training split is evaluated whole when it is at most TRAIN_EVAL_FACTOR times the validation
    split's windows, else on that many of them, a fixed random subset (final_windows; the same in `tiecli train`
    and `tiecli eval --split train`): a 90% split would cost 18 validation passes, and a few times the
    validation split's tokens already measure the training loss as precisely as the validation loss.
    """
    if split != "train":
        return None
    return TRAIN_EVAL_FACTOR * len(eval_windows(len(corpus.tokens["val"]), block_size))


EVAL_TOKENS = 32768  # tokens per evaluation batch: 4x a training step's, as no autograd state is kept
SUBSET_SEED = 0  # which windows a split past eval.max_tokens keeps: the same in every run and every `tiecli eval`


def final_windows(corpus: Corpus, split: str, block_size: int, max_tokens: int | None) -> tuple[list, int]:
    """The windows a whole-split evaluation reads, and how many the whole split has.

    All of them, unless the split is past eval.max_tokens (or is the training split past
    whole_split_limit): then that many full windows, a fixed random subset (SUBSET_SEED), so the
    mean loss over them estimates the split's without bias and with a standard error (evaluate).
    """
    windows = eval_windows(len(corpus.tokens[split]), block_size)
    limits = [whole_split_limit(corpus, split, block_size), None if max_tokens is None else max_tokens // block_size]
    keep = min((k for k in limits if k is not None), default=len(windows))
    if keep >= len(windows):
        return windows, len(windows)
    full = [w for w in windows if w[1] == block_size]
    picked = np.sort(np.random.default_rng(SUBSET_SEED).choice(len(full), max(1, keep), replace=False))
    return [full[i] for i in picked], len(windows)


MIN_BUDGET_WINDOWS = 8  # a time budget never cuts a split below this many windows: enough for a standard error


def budget_tokens(
    max_tokens: int | None, max_seconds: float | None, splits: int, tokens_per_s: float, block_size: int
) -> tuple[int | None, str]:
    """The tokens a split of the final evaluation may read, and which setting bounds it ("" when none does).

    eval.max_tokens bounds it in tokens; eval.max_seconds in time: all the splits together at most
    that long at tokens_per_s (the step-0 evaluation's pace), so each split max_seconds / splits of it,
    never under MIN_BUDGET_WINDOWS windows, and rounded down to a power of two windows, so that runs on
    one machine, whose paces differ by a little, read the same subset. Decided before step 1, so the
    run states it up front."""
    if max_seconds is None:
        return max_tokens, "" if max_tokens is None else "eval.max_tokens"
    windows = max(MIN_BUDGET_WINDOWS, int(max_seconds / splits * tokens_per_s / block_size))
    timed = 2 ** (windows.bit_length() - 1) * block_size
    if max_tokens is not None and max_tokens <= timed:
        return max_tokens, "eval.max_tokens"
    return timed, "eval.max_seconds"


def expected_line(
    corpus: Corpus, splits: list[str], block_size: int, max_tokens: int | None, tokens_per_s: float, bound: str = ""
) -> str:
    """The final evaluation's size and its expected time at the pace of an evaluation just measured."""
    tokens = sum(len(final_windows(corpus, split, block_size, max_tokens)[0]) * block_size for split in splits)
    capped = "" if max_tokens is None else f", at most {max_tokens:,} a split ({bound or 'eval.max_tokens'})"
    return (
        f"final evaluation: {', '.join(splits)}, {tokens:,} tokens{capped}; "
        f"about {tokens / max(tokens_per_s, 1e-9):,.0f} s at the step-0 evaluation's pace"
    )


def eval_batch_size(block_size: int) -> int:
    """Windows per evaluation batch: about EVAL_TOKENS tokens, whatever the vocabulary, since the fused
    head (head.py: linear_cross_entropy) never holds more than a chunk of the (tokens, V) logits."""
    return max(1, EVAL_TOKENS // block_size)


@torch.inference_mode()
def evaluate(
    model: GPT,
    corpus: Corpus,
    split: str,
    buckets: np.ndarray,
    device: torch.device,
    autocast=contextlib.nullcontext,
    limit: int | None = None,
    check: Callable[[], None] | None = None,
    windows: tuple[list, int] | None = None,
    shard: bool = False,
) -> dict:
    """Metrics over every token of `split` (or over `limit` fixed windows of it), without autograd.

    loss: mean next-token NLL in nats; perplexity: exp(loss); bits_per_byte: total NLL in bits over
    the UTF-8 bytes of the predicted tokens, which does not depend on the tokenizer.
    by_bucket: the same loss and perplexity over targets in each frequency bucket.
    check: called between batches; it raises to stop a long evaluation (Ctrl-C).
    windows: final_windows' (windows, windows in the split), instead of `limit`; a subset adds
    `subset`: its size, the split's, and the standard error of its loss as an estimate of the split's.
    shard: in a process group, each rank evaluates every world-th window and the sums are all-reduced:
    every rank gets the numbers one process would.
    """
    block_size = model.config.block_size
    picked, of = windows or (eval_windows(len(corpus.tokens[split]), block_size, limit), None)
    sharded = shard and dist.is_initialized()
    mine = picked[dist.get_rank() :: dist.get_world_size()] if sharded else picked
    sums = _summed(model, corpus, split, buckets, device, autocast, mine, check)
    if sharded:
        dist.all_reduce(sums)
    nll, count, n_bytes, window_sum, window_sq = sums.cpu().split([len(BUCKETS), len(BUCKETS), 1, 1, 1])
    metrics = _metrics(split, nll.tolist(), count.tolist(), float(n_bytes))
    if of is not None and len(picked) < of:
        k = len(picked)  # windows of the subset, all full: the loss is the mean of their mean losses
        var = (float(window_sq) - float(window_sum) ** 2 / k) / max(1, k - 1)
        se = math.sqrt(max(0.0, var) / k * (1 - k / of))  # simple random sampling, without replacement
        metrics["subset"] = {"windows": k, "of": of, "seed": SUBSET_SEED, "loss_se": se}
    return metrics


def _summed(model, corpus, split, buckets, device, autocast, windows, check) -> torch.Tensor:
    """(2 x len(BUCKETS) + 3,) float64 sums over `windows`: NLL and targets by bucket, bytes, and the sum
    and sum of squares of the full windows' mean losses."""
    tokens, block_size = corpus.tokens[split], model.config.block_size
    batch_size = eval_batch_size(block_size)
    token_bytes = torch.from_numpy(corpus.token_bytes).to(device)
    bucket_of = torch.from_numpy(buckets.astype(np.int64)).to(device)
    nll = torch.zeros(len(BUCKETS), dtype=torch.float64, device=device)  # summed per bucket
    count = torch.zeros(len(BUCKETS), dtype=torch.float64, device=device)
    n_bytes = torch.zeros((), dtype=torch.float64, device=device)
    per_window = torch.zeros(2, dtype=torch.float64, device=device)  # full windows: sum, sum of squares
    was_training = model.training
    model.eval()
    # Full windows in batches; the one short window at the end of a split in a batch of its own.
    by_length: dict[int, list[int]] = {}
    for start, length in windows:
        by_length.setdefault(length, []).append(start)
    for length, starts in by_length.items():
        for i in range(0, len(starts), batch_size):
            if check is not None:
                check()
            ids = np.stack([tokens[s : s + length + 1].astype(np.int64) for s in starts[i : i + batch_size]])
            batch = torch.from_numpy(ids).to(device)  # (B, T+1)
            x, y = batch[:, :-1], batch[:, 1:]
            with autocast():
                loss = model(x, y, reduction="none")  # (B, T)
            b = bucket_of[y].flatten()  # index_add_, not bincount: bincount sizes its output on the host (a GPU sync)
            nll.index_add_(0, b, loss.flatten().double())
            count.index_add_(0, b, torch.ones_like(b, dtype=torch.float64))
            n_bytes += token_bytes[y].sum()
            if length == block_size:
                means = loss.double().mean(1)  # (B,)
                per_window += torch.stack([means.sum(), (means**2).sum()])
    model.train(was_training)
    return torch.cat([nll, count, n_bytes[None], per_window])


def _metrics(split: str, bucket_nll: list[float], bucket_count: list[float], n_bytes: float) -> dict:
    """Loss, perplexity and bits per byte, overall and per bucket, from summed NLLs and counts."""
    total_nll, total = sum(bucket_nll), sum(bucket_count)
    loss = total_nll / max(1.0, total)
    by_bucket = {
        name: {
            "loss": bucket_nll[i] / bucket_count[i] if bucket_count[i] else None,
            "perplexity": math.exp(bucket_nll[i] / bucket_count[i]) if bucket_count[i] else None,
            "n_tokens": int(bucket_count[i]),
        }
        for i, name in enumerate(BUCKETS)
    }
    return {
        "split": split,
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": total_nll / math.log(2) / max(1.0, n_bytes),
        "n_tokens": int(total),
        "n_bytes": int(n_bytes),
        "by_bucket": by_bucket,
    }
