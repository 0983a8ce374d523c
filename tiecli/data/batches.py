# Used by `tiecli train` and `tiecli eval`: the windows a step trains on and an evaluation reads.
"""Training batches (random windows of the training split, each rank its own share of one process's
draws) and evaluation windows (fixed, non-overlapping, covering a split or a fixed subset of it).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tiecli.errors import TiecliError


def get_batch(
    tokens: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator, keep: slice = slice(None)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the training split: inputs (B, T) and next-token targets (B, T).

    keep: the rows to read of the batch_size drawn (a rank's share): every start is drawn, so the
    generator advances as for the whole batch, but only the kept windows are read from the memmap."""
    if len(tokens) <= block_size:
        raise TiecliError(f"the training split has {len(tokens)} tokens, fewer than block_size+1={block_size + 1}")
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=generator).numpy()[keep]
    window = torch.from_numpy(tokens[starts[:, None] + np.arange(block_size + 1)].astype(np.int64))  # (B, T+1)
    return window[:, :-1], window[:, 1:]


def rank_rows(draw: int, batch_size: int, rank: int, per_rank: int) -> slice:
    """The rows of draw `draw` (global rows draw*B .. (draw+1)*B of a step) that rank `rank` trains on
    (global rows rank*P .. (rank+1)*P, P = per_rank), as a slice of the draw; empty when none are."""
    lo = max(rank * per_rank, draw * batch_size)
    hi = max(lo, min((rank + 1) * per_rank, (draw + 1) * batch_size))
    return slice(lo - draw * batch_size, hi - draw * batch_size)


@dataclass
class StepBatches:
    """This rank's micro-batches (x, y), each (micro, T) on the device, one step after another.

    The step's grad_accum draws of batch_size windows come from the generator every rank holds in the
    same state, in one process's order; this rank reads only its rows of them (rank_rows), a
    contiguous 1/world of the step's, so N processes train on exactly one process's batches. On CUDA
    the windows go through pinned host memory, so the non_blocking copies really are asynchronous;
    prefetch() reads the next step's while the device still runs the current one. state() is the
    generator state a checkpoint keeps: from before any prefetched draw, so a resume reads them again.
    """

    tokens: np.ndarray
    batch_size: int
    grad_accum: int
    block_size: int
    micro: int  # sequences per micro-batch of this rank (distributed.rank_shape)
    rank: int
    world: int
    generator: torch.Generator
    device: torch.device
    draw: Callable = get_batch  # tiecli.train.loop passes its own name for it
    pending: tuple[torch.Tensor, list] | None = None  # (generator state before the draws, their batches)

    def _read(self) -> tuple[torch.Tensor, list]:
        state = self.generator.get_state()
        per_rank = self.batch_size * self.grad_accum // self.world
        draws = [
            self.draw(
                self.tokens,
                self.batch_size,
                self.block_size,
                self.generator,
                rank_rows(j, self.batch_size, self.rank, per_rank),
            )
            for j in range(self.grad_accum)
        ]
        x, y = (torch.cat(parts) for parts in zip(*draws))  # (per_rank, T) each
        if self.device.type == "cuda":  # from pageable memory a non_blocking copy is synchronous
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return state, list(zip(x.split(self.micro), y.split(self.micro)))

    def next(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's micro-batches: the prefetched ones, else read now."""
        _, batches = self.pending or self._read()
        self.pending = None
        return batches

    def prefetch(self) -> None:
        if self.pending is None:
            self.pending = self._read()

    def state(self) -> torch.Tensor:
        return self.generator.get_state() if self.pending is None else self.pending[0]


def eval_windows(n_tokens: int, block_size: int, limit: int | None = None) -> list[tuple[int, int]]:
    """(start, length) of windows whose targets cover every token of a split once (its first excepted).

    With a limit, that many full windows spread evenly over the split: the same ones at every evaluation.
    """
    windows = [(s, min(block_size, n_tokens - 1 - s)) for s in range(0, n_tokens - 1, block_size)]
    if limit is not None and limit < len(windows):
        full = [w for w in windows if w[1] == block_size]
        windows = [full[i] for i in np.linspace(0, len(full) - 1, limit).round().astype(int)]
    return windows
