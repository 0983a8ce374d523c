# Used by tiecli/measure/geometry.py: what every geometry metric of a token matrix starts from.
"""A token matrix's rows, restricted to the tokens that occur in training, with the shared
precomputations (unit rows, Gram matrices in float64 blocks, means) cached once per matrix; and the
cosine of token pairs, related or random, over those unit rows.
"""

from collections.abc import Sequence
from functools import cached_property

import numpy as np
import torch

Counts = Sequence[int] | np.ndarray  # (V,) one number per token id: training-split counts, or buckets

CHUNK = 4096  # rows per float64 Gram block: 25 MB instead of a 300 MB float64 copy


def occurring(counts: Counts) -> np.ndarray:
    """Token ids with count > 0, as a (n,) int64 numpy array."""
    idx = np.flatnonzero(np.asarray(counts) > 0)
    if len(idx) < 2:
        raise ValueError(f"geometry needs at least 2 occurring tokens, got {len(idx)}")
    return idx


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gram64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b in float64, one block of rows at a time."""
    out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64, device=a.device)  # (C, C)
    for i in range(0, a.shape[0], CHUNK):
        out += a[i : i + CHUNK].double().T @ b[i : i + CHUNK].double()
    return out


class Rows:
    """The occurring rows of one matrix, plus what several metrics share (computed once)."""

    def __init__(self, W: torch.Tensor, idx: np.ndarray):
        self.x = W.detach()[torch.from_numpy(idx).to(W.device)].float()  # (n, C), a copy: W is never touched

    @property
    def n(self) -> int:
        return self.x.shape[0]

    @cached_property
    def unit(self) -> torch.Tensor:
        return torch.nn.functional.normalize(self.x, dim=1)  # (n, C)

    @cached_property
    def mean(self) -> torch.Tensor:
        # by blocks: a float64 reduction down the columns of the whole matrix is ~15x slower
        total = sum(block.sum(0, dtype=torch.float64) for block in self.x.split(CHUNK))  # (C,)
        return total / self.n

    @cached_property
    def gram(self) -> torch.Tensor:
        return gram64(self.x, self.x)  # (C, C) = x^T x

    @cached_property
    def eigh(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenvalues (ascending) and eigenvectors (columns) of x^T x, float64."""
        return torch.linalg.eigh(self.gram)  # (C,), (C, C)

    @cached_property
    def unit_gram(self) -> torch.Tensor:
        """u^T u of the unit rows, float32 blocks summed in float64: no entry of a unit row exceeds 1,
        so float32 products keep every eigenvalue ratio that isotropy and top_pc_share read (3x
        faster than gram64; the spectrum, which needs s_k down to 1e-8 s_1, uses `gram`)."""
        return sum((block.T @ block).double() for block in self.unit.split(CHUNK))  # (C, C)

    @cached_property
    def unit_mean(self) -> torch.Tensor:
        return sum(block.sum(0, dtype=torch.float64) for block in self.unit.split(CHUNK)) / self.n  # (C,)

    @cached_property
    def centred_gram(self) -> torch.Tensor:
        """(x - mean)^T (x - mean) = x^T x - n mean mean^T, float64 so the subtraction is exact
        enough even when a large common vector dominates the rows."""
        return self.gram - self.n * torch.outer(self.mean, self.mean)  # (C, C)


def pair_cosine(unit: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> float:
    """Mean cosine of rows i[k] and j[k]; `unit` has unit rows."""
    i, j = i.to(unit.device), j.to(unit.device)
    return (unit[i] * unit[j]).sum(1, dtype=torch.float64).mean().item()


def random_pair_cosine(rows: Rows, n_pairs: int, seed: int) -> float:
    """Mean cosine of n_pairs uniform random pairs of distinct rows."""
    g = generator(seed)
    i = torch.randint(rows.n, (n_pairs,), generator=g)
    j = torch.randint(rows.n - 1, (n_pairs,), generator=g)
    j += (j >= i).long()  # uniform over the other n - 1 rows, never i itself
    return pair_cosine(rows.unit, i, j)
