# Used by `tiecli train` (gradient statistics every diag.every steps, geometry at evaluations) and `tiecli geometry`.
"""Measurements taken from a model's token matrices while it trains.

Gradient interference (claim R4, "gradient cancellation"): how the input-path and output-path
gradients of the token matrices interact, over the whole matrix and at related-form pairs.

In a shared matrix W the gradient is G = G_in + G_out: G_in arrives through the embedding lookup
(non-zero only in rows of tokens present in the batch's inputs), G_out through the logits (every
row). Both come from the one backward pass that trains the model (tiecli/model/gpt.py:Embeddings
hands them to two sinks from its fork). In untied modes G_in is the input embedding's gradient and
G_out the output matrix's: what tying would have summed.

  grad_cos            cos(G_in, G_out) over all rows
  grad_cos_present    the same over the rows of tokens present in the inputs (G_in is zero elsewhere)
  grad_cos_<bucket>   the same over present rows in each frequency bucket (frequent / mid / rare)
  grad_norm_in/out    |G_in|_F, |G_out|_F, and grad_norm_ratio = |G_in| / |G_out|
  grad_cancel         -2<G_in, G_out> / (|G_in|^2 + |G_out|^2): 0 for orthogonal paths, > 0 when they
                      cancel, < 0 when they reinforce (how much summing shrinks the squared norm)
  grad_norm_lost_pct  100 (1 - |G_in + G_out| / sqrt(|G_in|^2 + |G_out|^2)): % of the norm lost to cancellation
  grad_cos_null_*     mean and sd of grad_cos_present with the present rows of G_out permuted (a null of
                      no row-wise relation), and grad_cos_z = (grad_cos_present - null mean) / null sd
  grad_neg_rows       share of present rows whose own cos(g_in, g_out) is negative

These are global: one cosine over all V x C entries, dominated by frequent rows. The article's
mechanism lives elsewhere: the output path pushes related forms (walk/walked) apart, the input path
pulls them together, and on a shared matrix the two cancel along those pairs' directions. So, at
the pairs (pair_gradients), for each related pair (a, b) of diag.pairs whose tokens occur in the
training split, and each path:

  s = <g[a] - g[b], w[a] - w[b]> / |w[a] - w[b]|

with w the matrix the path's gradient belongs to (tied: the shared matrix for both paths, its
shared columns in partial mode; untied: wte for the input path, lm_head for the output path). Under
SGD the update is -lr g, so s > 0 pulls the pair together and s < 0 pushes it apart (AdamW rescales
each coordinate, so this reads the gradient's direction, not the exact step). Recorded, for the
related pairs and, as KEY_null, for frequency-matched random pairs (geometry.matched_random_pairs,
N_NULL_PAIRS of them, drawn once per run from diag.seed, never from training's RNG):

  pair_s_in/out       mean s: scales with the gradient norm, so it shrinks as training proceeds
  pair_cos_in/out     mean cos(g[a] - g[b], w[a] - w[b]): the scale-free variant, comparable across steps
  pair_pull_in/out    share of pairs with s > 0; pair_push_in/out: with s < 0 (a pair neither of whose
                      tokens is in the step's inputs has no input-path gradient: s = 0, neither)
  pair_opposed        share with the two paths of opposite signs
  pair_claimed        share in the article's direction: input pulls (s_in > 0) and output pushes (s_out < 0)
  pair_n, pair_null_n related and null pairs measured; pair_claimed_null_sd = sqrt(q (1 - q) (1/P + 1/N)),
                      q = pair_claimed_null: the sd of pair_claimed - pair_claimed_null if the related
                      pairs behaved like random ones (the report's SESOI is stated against it)
Every pair_* figure is None when no related pair is in the vocabulary (byte tokens and an English
pairs file, for one). The report judges the signs' shares, which need no scale; the means are kept
to show magnitudes.

Geometry (claims R3, C2, C7): tiecli/measure/geometry.py's metrics of the effective input and output
matrices (what the model actually uses, in partial and hybrid too), with drift measured against
the matrices at step 0 and related word forms from a pairs file (the shipped English conf/pairs/en.tsv
by default) or English suffix rules.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from tiecli.data.tokens import BUCKETS
from tiecli.measure import geometry
from tiecli.model.gpt import Embeddings


def gradient_paths(emb: Embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """(G_in, G_out) of the last backward pass(es), before clipping."""
    if emb.shared:
        split = emb.split_grads()
        assert split is not None  # called after a backward pass, which fills both sinks
        return split
    g_in, g_out = emb.wte.grad, emb.lm_head.grad
    assert g_in is not None and g_out is not None  # called after a backward pass, which sets both
    return g_in, g_out


def _cos(a: torch.Tensor, b: torch.Tensor) -> float | None:
    denom = a.norm() * b.norm()
    return (torch.sum(a * b) / denom).item() if denom > 0 else None


# Permutations per diag step: enough to place a cosine against the null (the null's sd is then
# known to about +-18%), at the cost of N_NULL gathers and dots of the present rows.
N_NULL = 16


def _cancellation(dot: float, n_in: float, n_out: float) -> dict:
    """How much summing the two paths shrinks the gradient, against orthogonal paths of the same
    norms (for which |G_in + G_out|^2 = |G_in|^2 + |G_out|^2), from <G_in, G_out> and the norms."""
    squares = n_in**2 + n_out**2
    if squares == 0:
        return {"grad_cancel": None, "grad_norm_lost_pct": None}
    cancel = -2 * dot / squares
    # |G_in + G_out|^2 / (|G_in|^2 + |G_out|^2) = 1 - grad_cancel; clamped against rounding at -1
    return {"grad_cancel": cancel, "grad_norm_lost_pct": 100 * (1 - max(1 - cancel, 0.0) ** 0.5)}


def _permutation_null(
    rows_in: torch.Tensor, rows_out: torch.Tensor, observed: float | None, generator: torch.Generator
) -> dict:
    """cos(G_in, G_out) over the present rows with the rows of G_out shuffled against those of
    G_in, N_NULL times: the cosine of gradients of unrelated tokens. Directions that every row
    shares survive the shuffle; agreement token by token does not, and grad_cos_z measures it."""
    none = {"grad_cos_null_mean": None, "grad_cos_null_sd": None, "grad_cos_z": None}
    if observed is None or len(rows_in) < 2:
        return none
    denom = rows_in.norm() * rows_out.norm()  # a permutation of rows keeps both norms
    perms = torch.stack([torch.randperm(len(rows_in), generator=generator) for _ in range(N_NULL)]).to(rows_out.device)
    # One (P, C) buffer for the gather and the product: a fresh allocation per permutation costs
    # more than the arithmetic. torch.sum, not a BLAS dot: its float32 sum stays accurate at P * C ~ 1e7.
    buffer = torch.empty_like(rows_out)
    null = (
        torch.stack([torch.index_select(rows_out, 0, perm, out=buffer).mul_(rows_in).sum() for perm in perms]) / denom
    )
    mean, sd = null.mean().item(), null.std().item()
    return {
        "grad_cos_null_mean": mean,
        "grad_cos_null_sd": sd,
        "grad_cos_z": (observed - mean) / sd if sd > 0 else None,
    }


@torch.no_grad()
def interference(
    g_in: torch.Tensor,
    g_out: torch.Tensor,
    present: torch.Tensor,
    buckets: torch.Tensor,
    *,
    seed: int = 0,
    step: int = 0,
) -> dict:
    """The statistics above. present: (V,) bool, tokens in this step's inputs; buckets: (V,) bucket ids.
    grad_cancel = -2<G_in, G_out> / (|G_in|^2 + |G_out|^2): 0 for orthogonal paths, > 0 when they
    cancel (1: G_out = -G_in), < 0 when they reinforce; grad_norm_lost_pct =
    100 (1 - |G_in + G_out| / sqrt(|G_in|^2 + |G_out|^2)). grad_cos_null_mean / _sd: mean and sd
    of the present-row cosine under N_NULL row permutations; grad_cos_z = (grad_cos_present -
    null mean) / null sd. The permutations come from a generator seeded with (seed, step), never
    the global RNG: training runs the same with diagnostics on or off."""
    g_in, g_out = g_in.float(), g_out.float()  # (V, C) or (V, k): the shared columns in partial mode
    n_in, n_out = g_in.norm().item(), g_out.norm().item()
    rows_in, rows_out = g_in[present], g_out[present]  # (P, C)
    row_cos = torch.nn.functional.cosine_similarity(rows_in, rows_out, dim=1)  # (P,)
    cos_present = _cos(rows_in, rows_out)
    dot = torch.sum(g_in * g_out).item()  # shared by grad_cos and grad_cancel: one pass over (V, C)
    # torch's CPU generator keeps 32 bits of a seed: SeedSequence mixes both numbers into them
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, step]).generate_state(1)[0]))
    stats = {
        "grad_cos": dot / (n_in * n_out) if n_in * n_out > 0 else None,
        "grad_cos_present": cos_present,
        **_permutation_null(rows_in, rows_out, cos_present, generator),
        "grad_norm_in": n_in,
        "grad_norm_out": n_out,
        "grad_norm_ratio": n_in / n_out if n_out > 0 else None,
        **_cancellation(dot, n_in, n_out),
        "grad_neg_rows": (row_cos < 0).float().mean().item() if len(row_cos) else None,
        "grad_present_rows": int(present.sum()),
    }
    present_buckets = buckets[present]
    for i, name in enumerate(BUCKETS):
        mask = present_buckets == i
        stats[f"grad_cos_{name}"] = _cos(rows_in[mask], rows_out[mask]) if mask.any() else None
    return stats


# Matched random pairs of the R4 pair null, spread evenly over the related pairs (ceil(N / P) each):
# with P ~ 600 related pairs the null then adds ~15% to the variance of a share difference.
N_NULL_PAIRS = 4096


@dataclass
class PairIndex:
    """Token ids of the R4 pairs, drawn once per run: related forms and their frequency-matched null."""

    forms: torch.Tensor  # (P, 2)
    null: torch.Tensor  # (N, 2)


def pair_index(pairs: list, counts: np.ndarray, seed: int, device: torch.device | str = "cpu") -> PairIndex:
    """The related pairs whose tokens occur in the training split, and N_NULL_PAIRS frequency-matched
    random pairs (geometry.related_and_matched_pairs), from a generator seeded with diag.seed."""
    forms, null = geometry.related_and_matched_pairs(pairs, counts, N_NULL_PAIRS, seed)
    return PairIndex(*(torch.from_numpy(p).to(device) for p in (forms, null)))


def path_matrices(emb: Embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """The matrices gradient_paths' G_in and G_out belong to: the shared wte twice (its shared columns
    in partial mode), or wte and lm_head."""
    return (emb.wte, emb.wte) if emb.shared else (emb.wte, emb.lm_head)


def differences(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w[a] - w[b] (M, C) and its norms (M,)."""
    w_diff = torch.index_select(w, 0, a) - torch.index_select(w, 0, b)
    return w_diff, w_diff.norm(dim=1)


def projections(g: torch.Tensor, w_diff: torch.Tensor, w_norm: torch.Tensor, a, b, scales=None) -> tuple:
    """s = <g[a] - g[b], w[a] - w[b]> / |w[a] - w[b]| and its cosine, per pair; 0 where either difference is 0.
    scales: (M, C) factors on g[a] and on g[b] first (an optimizer's step size: tiecli/measure/cancellation.py)."""
    g_a, g_b = torch.index_select(g, 0, a), torch.index_select(g, 0, b)  # (M, C) each
    if scales is not None:
        g_a, g_b = g_a * scales[0], g_b * scales[1]
    g_diff = g_a - g_b  # (M, C)
    s = torch.where(w_norm > 0, (g_diff * w_diff).sum(1) / w_norm.clamp_min(1e-30), 0.0)  # (M,)
    g_norm = g_diff.norm(dim=1)
    return s, torch.where(g_norm > 0, s / g_norm.clamp_min(1e-30), 0.0)


def _pair_figures(s_in: torch.Tensor, s_out: torch.Tensor, c_in: torch.Tensor, c_out: torch.Tensor, suffix: str):
    figures: dict[str, torch.Tensor] = {}
    for path, s, c in (("in", s_in, c_in), ("out", s_out, c_out)):
        figures |= {
            f"pair_s_{path}{suffix}": s.mean(),
            f"pair_cos_{path}{suffix}": c.mean(),
            f"pair_pull_{path}{suffix}": (s > 0).float().mean(),
            f"pair_push_{path}{suffix}": (s < 0).float().mean(),
        }
    figures[f"pair_opposed{suffix}"] = (s_in * s_out < 0).float().mean()
    figures[f"pair_claimed{suffix}"] = ((s_in > 0) & (s_out < 0)).float().mean()
    return figures


PAIR_KEYS = tuple(
    [f"pair_{k}_{p}" for p in ("in", "out") for k in ("s", "cos", "pull", "push")] + ["pair_opposed", "pair_claimed"]
)


@torch.no_grad()
def pair_gradients(
    g_in: torch.Tensor, g_out: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor, index: PairIndex
) -> dict:
    """R4 at the pairs: each path's gradient difference projected on the pair's difference, for the
    related pairs and (KEY_null) their matched random pairs; see the module docstring. Nulls when the
    run has no related pair in its vocabulary."""
    n_forms, n_null = len(index.forms), len(index.null)
    none = {key + suffix: None for key in PAIR_KEYS for suffix in ("", "_null")}
    if n_forms == 0:
        return {"pair_n": 0, "pair_null_n": 0, **none, "pair_claimed_null_sd": None}
    ids = torch.cat([index.forms, index.null])  # (M, 2): one gather per matrix for both sets
    a, b = ids[:, 0], ids[:, 1]
    diff_in = differences(w_in.detach().float(), a, b)
    diff_out = diff_in if w_out is w_in else differences(w_out.detach().float(), a, b)  # tied: one matrix
    s_in, c_in = projections(g_in.float(), *diff_in, a, b)
    s_out, c_out = projections(g_out.float(), *diff_out, a, b)
    figures = _pair_figures(s_in[:n_forms], s_out[:n_forms], c_in[:n_forms], c_out[:n_forms], "")
    figures |= _pair_figures(s_in[n_forms:], s_out[n_forms:], c_in[n_forms:], c_out[n_forms:], "_null")
    stats = dict(zip(figures, torch.stack(list(figures.values())).tolist()))  # one device sync
    q = stats["pair_claimed_null"]
    # the sd of pair_claimed - pair_claimed_null if the related pairs were matched random pairs
    sd = math.sqrt(q * (1 - q) * (1 / n_forms + 1 / n_null))
    return {"pair_n": n_forms, "pair_null_n": n_null, **stats, "pair_claimed_null_sd": sd}


@torch.no_grad()
def embedding_geometry(
    emb: Embeddings, emb0: Embeddings, counts: np.ndarray, buckets: np.ndarray, pairs: list, pairs_info: dict, seed: int
) -> dict:
    """One geometry.json entry: geometry.measure() of the effective matrices, drift against emb0,
    on the device `emb` is on (emb0, read from init.pt, comes to it)."""
    device = emb.wte.device
    w_in, w_in0 = emb.input_matrix().detach(), emb0.input_matrix().detach().to(device)  # (V, C) each
    # One object when the mode has one matrix: measure() then knows it is tied and measures it once.
    w_out = w_in if emb.one_matrix else emb.output_matrix().detach()
    w_out0 = w_in0 if emb.one_matrix else emb0.output_matrix().detach().to(device)
    return {**geometry.measure(w_in, w_out, counts, buckets, w_in0, w_out0, pairs, seed=seed), "pairs": pairs_info}


# rows.npz: the rows of the most frequent tokens, at most N_SAMPLE_ROWS and SAMPLE_BYTES of float16 per matrix
# (512 rows up to C = 128, 170 at C = 384): enough for a mean row cosine and a CKA between two runs, small
# enough to commit with a run (docs/studies.md packs runs without their checkpoints).
N_SAMPLE_ROWS = 512
SAMPLE_BYTES = 128 * 1024


@torch.no_grad()
def row_sample(emb: Embeddings, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ids (n,), input rows (n, C), output rows (n, C) or None when the mode has one matrix): the effective
    matrices at the rows of the n most frequent tokens of the training split, ids ascending. The rows depend
    only on the corpus, so two runs on one corpus sample the same tokens and their matrices compare row by row."""
    width = emb.input_matrix().shape[1]
    n = min(N_SAMPLE_ROWS, SAMPLE_BYTES // (2 * width))
    ids = np.sort(np.argsort(-np.asarray(counts), kind="stable")[:n])
    ids = ids[np.asarray(counts)[ids] > 0]
    rows = torch.from_numpy(ids).to(emb.wte.device)

    def sample(w: torch.Tensor) -> np.ndarray:  # (V, C) -> (n, C), on the host
        return w.detach()[rows].float().cpu().numpy()

    return ids, sample(emb.input_matrix()), None if emb.one_matrix else sample(emb.output_matrix())
