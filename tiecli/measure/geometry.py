# Used by `tiecli train` (at every evaluation) and `tiecli geometry RUN`: the geometry of the token matrices.
"""Geometry of the input and output embedding matrices.

Pure functions over an input matrix W_in (V, C) (row i embeds token i) and an output matrix
W_out (V, C) (logits = h @ W_out.T). They answer the geometric claims: drift from init (C2, C7),
alignment of the two spaces (C7), related word forms pulled together or pushed apart (R3), and
the cone / anisotropy picture of Gao et al. 2019.

Conventions shared by every function:
- Only tokens that occur in the training split are measured: `counts` (V,) holds training-split
  token counts and rows with count > 0 are used. A never-seen row only moves by weight decay, and
  would otherwise dominate every statistic with its initialisation.
- `buckets` (V,) int8 holds 0 = frequent, 1 = mid, 2 = rare (see BUCKETS).
- Inputs are never modified; any float dtype works; maths runs in float32, with float64 where
  precision matters (Gram matrices, sums), on the device the matrices are on (a GPU's during
  training: seconds on the host at V = 50k, docs/performance.md); samples are drawn on the
  CPU, so the results do not depend on the device beyond float rounding.
- Results are dicts of plain Python floats / ints / lists / None, ready for JSON.
- Sampling uses a private torch.Generator seeded from `seed`, never the global RNG: these run in
  the middle of training and must not change it.
"""

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.stats
import torch

from tiecli.data.tokens import BUCKETS
from tiecli.measure.rows import Counts, Rows, generator, gram64, occurring, pair_cosine, random_pair_cosine

N_PAIRS = 10_000  # random pairs per mean cosine: standard error = sd / 100 (4e-4 at C = 768)
# k-NN query tokens. Each costs two (n, C) matvecs: 500 take ~0.7 s at n = 50257 on 2 cores,
# and estimate the overlap to a standard error under 0.01.
N_QUERIES = 500
KNN_K = 10
MAX_SINGULAR_VALUES = 256  # enough to plot a spectrum; the derived ranks use all of them
_QUERY_BLOCK = 256  # k-NN queries per block: a (256, n) similarity block is 50 MB at n = 50257

Metrics = dict[str, Any]  # one metric family's results: plain floats, ints, lists or None, ready for JSON
Pairs = Sequence[tuple[int, int]] | np.ndarray  # token-id pairs (P, 2)


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float | None:
    """Spearman rank correlation with average ranks for ties (scipy.stats.spearmanr): the Pearson
    correlation of the ranks. None when either side is constant (undefined)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(scipy.stats.spearmanr(x, y).statistic)


# -----------------------------------------------------------------------------
# per-matrix metrics (internal versions take Rows so measure() can share the Gram matrix)


def _row_norms(rows: Rows, counts_occ: np.ndarray) -> Metrics:
    norms = rows.x.norm(dim=1).double()  # (n,)
    return {
        "norm_mean": norms.mean().item(),
        "norm_std": norms.std(correction=0).item(),
        "norm_min": norms.min().item(),
        "norm_max": norms.max().item(),
        # ranks are unchanged by log, so ranking the counts is ranking log frequency
        "norm_freq_spearman": spearman(norms.cpu().numpy(), counts_occ),
    }


def row_norms(W: torch.Tensor, counts: Counts) -> Metrics:
    """Row L2 norms over occurring tokens: mean, population std, min, max, and the Spearman
    correlation of norm with log token frequency (None when norms or counts are all equal).
    Keys: n_tokens, norm_mean, norm_std, norm_min, norm_max, norm_freq_spearman."""
    idx = occurring(counts)
    counts_occ = np.asarray(counts)[idx]
    return {"n_tokens": len(idx), **_row_norms(Rows(W, idx), counts_occ)}


# Below this total variance of the centred unit rows (per row) the rows point one way: float32
# rounding of a perfect cone leaves ~1e-7 per row, and a share of rounding noise means nothing.
_MIN_UNIT_VARIANCE = 1e-6


def _top_pc_share(rows: Rows) -> float | None:
    centred = rows.unit_gram - rows.n * torch.outer(rows.unit_mean, rows.unit_mean)  # (C, C)
    variances = torch.linalg.eigvalsh(centred)  # (C,) ascending
    total = variances.sum().item()
    return variances[-1].item() / total if total > _MIN_UNIT_VARIANCE * rows.n else None


def _anisotropy(rows: Rows, n_pairs: int, seed: int) -> Metrics:
    mean_dir = torch.nn.functional.normalize(rows.mean.to(rows.x.dtype), dim=0)  # (C,)
    return {
        "anisotropy": random_pair_cosine(rows, n_pairs, seed),
        "cosine_to_mean": (rows.unit @ mean_dir).double().mean().item(),
        "top_pc_share": _top_pc_share(rows),
    }


def anisotropy(W: torch.Tensor, counts: Counts, n_pairs: int = N_PAIRS, seed: int = 0) -> Metrics:
    """Ethayarajh 2019: mean cosine of n_pairs random pairs of distinct occurring rows
    (~0 for an isotropic cloud, -> 1 in a narrow cone), and the mean cosine of each row to the
    mean row. Random-pair cosines miss a rank-1 cloud whose rows point both ways along one axis
    (they average to ~0), so also top_pc_share: the share of variance along the top principal
    component of the mean-centred unit rows, lambda_1 / sum_k lambda_k (1 for rows on one line
    through the mean, ~1/C for an isotropic cloud, None when the rows all point one way and
    have no variance). Keys: n_tokens, anisotropy, cosine_to_mean, top_pc_share."""
    idx = occurring(counts)
    return {"n_tokens": len(idx), **_anisotropy(Rows(W, idx), n_pairs, seed)}


def _isotropy(rows: Rows) -> Metrics:
    if not rows.x.any():  # an all-zero matrix has no directions to compare
        return {"isotropy": None}
    # Eigenvectors are defined up to sign, so both c and -c are taken: the result does not
    # depend on which sign eigh happens to return. The (C, n) layout makes logsumexp run
    # along contiguous memory, ~3x faster than down the columns of (n, C).
    vectors = torch.linalg.eigh(rows.unit_gram)[1]  # (C, C) columns: eigenvectors of u^T u
    proj = vectors.to(rows.x.dtype).T @ rows.unit.T  # (C, n): c . u_i for every eigenvector c
    log_z_plus = proj.logsumexp(1)  # (C,) log Z(c)
    log_z_minus = proj.neg_().logsumexp(1)  # (C,) log Z(-c)
    log_z = torch.cat([log_z_plus, log_z_minus])  # (2C,)
    return {"isotropy": math.exp(log_z.min().item() - log_z.max().item())}


def isotropy(W: torch.Tensor, counts: Counts) -> Metrics:
    """Mu & Viswanath 2018 on the occurring rows normalised to unit norm, u_i = w_i / |w_i|:
    I = min_c Z(c) / max_c Z(c), Z(c) = sum_i exp(c . u_i), c over the unit eigenvectors (both
    signs) of U^T U; exp(min log Z - max log Z) with logsumexp. On raw rows the measure reads the
    scale, not the shape (log Z(c) ~ log n + s^2 lambda_c / 2 for rows of scale s: one Gaussian
    cloud reads 0.998 at x0.02 and 0.0008 at x5); on unit rows it is scale-free and lies in
    [e^-2, 1]: 1 for an isotropic cloud, 1 / cosh(1) = 0.65 for rows split between +v and -v,
    e^-2 = 0.14 for rows that all point one way. None for an all-zero matrix.
    Keys: n_tokens, isotropy."""
    idx = occurring(counts)
    return {"n_tokens": len(idx), **_isotropy(Rows(W, idx))}


def _spectrum(rows: Rows, max_values: int) -> Metrics:
    # Singular values of x are the square roots of the eigenvalues of x^T x; float64 keeps the
    # small ones accurate to ~1e-8 s_1, which is what effective rank needs.
    s = rows.eigh[0].flip(0).clamp_min(0).sqrt()[: min(rows.n, rows.x.shape[1])]  # (r,) desc
    if s[0] == 0:  # an all-zero matrix (e.g. a zero-initialised output layer): no spectrum shape
        return {
            "singular_values": s[:max_values].tolist(),
            "effective_rank": None,
            "stable_rank": None,
            "top_share": None,
        }
    p = s / s.sum()
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    return {
        "singular_values": s[:max_values].tolist(),
        "effective_rank": entropy.exp().item(),
        "stable_rank": ((s**2).sum() / s[0] ** 2).item(),
        "top_share": p[0].item(),
    }


def spectrum(W: torch.Tensor, counts: Counts, max_values: int = MAX_SINGULAR_VALUES) -> Metrics:
    """Singular values s_1 >= s_2 >= ... of the occurring rows (the first max_values, for plots)
    and, from all of them: effective rank (Roy & Vetterli 2007) exp(-sum_k p_k log p_k) with
    p_k = s_k / sum s; stable rank |W|_F^2 / |W|_2^2 = sum s_k^2 / s_1^2; top share
    s_1 / sum s (the three are None for an all-zero matrix).
    Keys: n_tokens, singular_values, effective_rank, stable_rank, top_share."""
    idx = occurring(counts)
    return {"n_tokens": len(idx), **_spectrum(Rows(W, idx), max_values)}


def _drift(rows: Rows, rows0: Rows, buckets_occ: np.ndarray) -> Metrics:
    # per-row sums of C squares are exact enough in float32; the totals below are float64
    moved = (rows.x - rows0.x).pow(2).sum(1).double().cpu().numpy()  # (n,) |w - w0|^2
    size = rows0.x.pow(2).sum(1).double().cpu().numpy()  # (n,) |w0|^2

    def ratio(mask: np.ndarray) -> float | None:
        # None for an empty bucket, and for a zero init (e.g. a zero-initialised output layer)
        denom = size[mask].sum()
        return math.sqrt(moved[mask].sum() / denom) if mask.any() and denom > 0 else None

    out = {"drift": ratio(np.ones(len(moved), dtype=bool))}
    for b, name in enumerate(BUCKETS):
        out[f"drift_{name}"] = ratio(buckets_occ == b)
    # Scale-free: the same ratio between the unit rows, |U - U0|_F / |U0|_F = sqrt(mean_i |u_i - u0_i|^2) over
    # rows non-zero at init, = sqrt(mean_i 2 (1 - cos(w_i, w0_i))); norm growth alone leaves it at 0
    turned = (rows.unit - rows0.unit).pow(2).sum(1).double().cpu().numpy()  # (n,)
    nonzero = size > 0
    out["drift_unit"] = math.sqrt(turned[nonzero].mean()) if nonzero.any() else None
    return out


def drift(W: torch.Tensor, W0: torch.Tensor, counts: Counts, buckets: Counts) -> Metrics:
    """Relative distance from initialisation, |W - W0|_F / |W0|_F over the occurring rows,
    overall and per frequency bucket (None for a bucket with no occurring rows), and drift_unit, the same
    between the row-normalised matrices (each row w / |w|), which growth of the rows' norms does not move:
    in [0, 2], sqrt(2) for rows turned orthogonal to their init (None when every init row is zero).
    Keys: n_tokens, drift, drift_frequent, drift_mid, drift_rare, drift_unit."""
    idx = occurring(counts)
    buckets_occ = np.asarray(buckets)[idx]
    return {"n_tokens": len(idx), **_drift(Rows(W, idx), Rows(W0, idx), buckets_occ)}


# -----------------------------------------------------------------------------
# agreement between the input and the output space


def _knn(unit: torch.Tensor, queries: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k nearest rows (cosine) of each query row, the query itself excluded."""
    queries = queries.to(unit.device)
    sims = unit[queries] @ unit.T  # (q, n)
    sims[torch.arange(len(queries), device=unit.device), queries] = -math.inf
    return sims.topk(k, dim=1).indices  # (q, k)


def _agreement(rows_in: Rows, rows_out: Rows, k: int, n_queries: int, seed: int) -> Metrics:
    # per-row sums of C squares are exact enough in float32; the totals are float64
    apart = (rows_in.x - rows_out.x).pow(2).sum(1).sum(dtype=torch.float64).item()
    size = rows_in.x.pow(2).sum(1).sum(dtype=torch.float64).item()
    distance = math.sqrt(apart / size) if size > 0 else None
    if size == 0 or rows_out.x.pow(2).sum(dtype=torch.float64).item() == 0:
        # a zero matrix (the field's zero-initialised output matrix at step 0) has no directions: cosines,
        # neighbours and CKA (0/0) are undefined, not 0 or NaN
        return {
            "row_cosine": None,
            "distance": distance,
            "knn_overlap": None,
            "knn_k": None,
            "knn_queries": None,
            "cka": None,
        }
    row_cos = (rows_in.unit * rows_out.unit).sum(1, dtype=torch.float64).mean().item()

    k = min(k, rows_in.n - 1)
    queries = torch.randperm(rows_in.n, generator=generator(seed))[:n_queries]
    shared = 0
    for q in queries.split(_QUERY_BLOCK):
        nn_in, nn_out = _knn(rows_in.unit, q, k), _knn(rows_out.unit, q, k)  # (q, k) each
        shared += int((nn_in[:, :, None] == nn_out[:, None, :]).sum())

    # Linear CKA on column-centred X, Y: |Y^T X|_F^2 / (|X^T X|_F |Y^T Y|_F), with
    # Y_c^T X_c = Y^T X - n mean_y mean_x^T so only the cross product needs a pass over rows.
    cross = gram64(rows_out.x, rows_in.x) - rows_in.n * torch.outer(rows_out.mean, rows_in.mean)
    scale = (rows_in.centred_gram.norm() * rows_out.centred_gram.norm()).item()
    return {
        "row_cosine": row_cos,
        "distance": distance,
        "knn_overlap": shared / (len(queries) * k),
        "knn_k": k,
        "knn_queries": len(queries),
        "cka": cross.square().sum().item() / scale if scale > 0 else None,  # None: a matrix with equal rows
    }


def agreement(
    W_in: torch.Tensor,
    W_out: torch.Tensor,
    counts: Counts,
    k: int = KNN_K,
    n_queries: int = N_QUERIES,
    seed: int = 0,
) -> Metrics:
    """How alike the input and output spaces are, over occurring tokens:
    - row_cosine: mean over tokens of cos(W_in[i], W_out[i]);
    - knn_overlap: for n_queries sampled tokens, mean |N_in(i) & N_out(i)| / k where N(i) are
      the k nearest other occurring tokens by cosine in that space (compared in blocks, never
      a V x V matrix);
    - cka: linear CKA (Kornblith et al. 2019), tokens as examples, columns centred:
      |Y^T X|_F^2 / (|X^T X|_F |Y^T Y|_F); 1 for spaces equal up to rotation and scale;
    - distance: |W_in - W_out|_F / |W_in|_F over the occurring rows (0 when the matrices are
      equal, as in a tied model; None when W_in is all zero).
    With either matrix all zero over those rows (a zero-initialised output matrix at step 0) only the
    distance is defined; the rest are None.
    Keys: n_tokens, row_cosine, distance, knn_overlap, knn_k, knn_queries, cka."""
    idx = occurring(counts)
    result = _agreement(Rows(W_in, idx), Rows(W_out, idx), k, n_queries, seed)
    return {"n_tokens": len(idx), **result}


# -----------------------------------------------------------------------------
# related word forms (claim R3): pairs of token ids from tiecli/data/pairs.py

N_DECILES = 10  # frequency classes of the matched baseline


def _deciles(counts_occ: np.ndarray) -> np.ndarray:
    """(n,) decile 0..9 of each occurring token's log count. Edges at the 10%, ..., 90% quantiles,
    so equal counts share a decile (the many tokens seen once make one class, not several)."""
    log_counts = np.log(counts_occ)
    edges = np.quantile(log_counts, np.arange(1, N_DECILES) / N_DECILES)
    return np.searchsorted(edges, log_counts, side="right")


def _matched_random_cosine(
    unit: torch.Tensor, pair_rows: np.ndarray, counts_occ: np.ndarray, n_random: int, seed: int
) -> float:
    """Mean cosine of frequency-matched random pairs (matched_random_pairs). Frequency alone moves
    cosines (frequent tokens share directions), so this is the baseline a related pair must beat."""
    i, j = matched_random_pairs(pair_rows, counts_occ, n_random, seed)
    return pair_cosine(unit, torch.from_numpy(i), torch.from_numpy(j))


def matched_random_pairs(
    pair_rows: np.ndarray, counts_occ: np.ndarray, n_random: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Frequency-matched random pairs as two (P * ceil(n_random / P),) arrays of positions among the
    occurring rows: for each related pair (i, j) of pair_rows (P, 2), equally many (ceil(n_random / P))
    pairs (i', j') with i' drawn uniformly from i's decile of log count and j' from j's, i' != j'.
    From a private generator seeded with `seed` (R3's geometry and R4's pair gradients share it)."""
    decile = _deciles(counts_occ)
    order = np.argsort(decile, kind="stable")  # positions grouped by decile
    start = np.searchsorted(decile[order], np.arange(N_DECILES + 1))  # decile d: order[start[d]:start[d + 1]]
    reps = -(-n_random // len(pair_rows))
    d_i, d_j = (np.repeat(decile[pair_rows[:, k]], reps) for k in (0, 1))  # (P * reps,) each
    same = d_i == d_j  # then j' is drawn from the decile's other tokens
    size_i, size_j = start[d_i + 1] - start[d_i], start[d_j + 1] - start[d_j] - same
    u = torch.rand(2, len(d_i), generator=generator(seed), dtype=torch.float64).numpy()
    r_i = np.minimum((u[0] * size_i).astype(np.int64), size_i - 1)  # rank within the decile
    r_j = np.minimum((u[1] * size_j).astype(np.int64), size_j - 1)
    r_j += same & (r_j >= r_i)  # skip i' itself
    return order[start[d_i] + r_i], order[start[d_j] + r_j]


def _pair_contrast(rows: Rows, pair_rows: np.ndarray, counts_occ: np.ndarray, n_random: int, seed: int) -> Metrics:
    out: Metrics = {
        "forms_n_pairs": len(pair_rows),
        "forms_cosine": None,
        "forms_random_cosine": None,
        "forms_matched_cosine": None,
        "forms_contrast": None,
    }
    if len(pair_rows) == 0:
        return out
    pairs = torch.from_numpy(pair_rows)  # (P, 2) positions among the occurring rows
    cos = pair_cosine(rows.unit, pairs[:, 0], pairs[:, 1])
    matched = _matched_random_cosine(rows.unit, pair_rows, counts_occ, n_random, seed)
    out.update(
        forms_cosine=cos,
        forms_random_cosine=random_pair_cosine(rows, n_random, seed),
        forms_matched_cosine=matched,
        forms_contrast=cos - matched,
    )
    return out


def _pair_rows(pairs: Pairs, idx: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token-id pairs -> (P, 2) unique positions among the occurring rows, dropping pairs with
    a token that does not occur and pairs of a token with itself."""
    pos = np.full(vocab_size, -1)
    pos[idx] = np.arange(len(idx))
    p = pos[np.asarray(pairs, dtype=np.int64).reshape(-1, 2)]  # (P, 2)
    p = p[(p >= 0).all(1) & (p[:, 0] != p[:, 1])]
    return np.unique(p, axis=0)


def related_and_matched_pairs(
    pairs: Pairs, counts: Counts, n_random: int = N_PAIRS, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the related pairs pair_contrast uses, (P, 2), and of their frequency-matched random
    pairs (matched_random_pairs), (P * ceil(n_random / P), 2): the same pairs for the same seed."""
    idx = occurring(counts)
    pair_rows = _pair_rows(pairs, idx, len(counts))
    if len(pair_rows) == 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros((0, 2), dtype=np.int64)
    i, j = matched_random_pairs(pair_rows, np.asarray(counts)[idx], n_random, seed)
    return idx[pair_rows], np.stack([idx[i], idx[j]], axis=1)


def pair_contrast(W: torch.Tensor, pairs: Pairs, counts: Counts, n_random: int = N_PAIRS, seed: int = 0) -> Metrics:
    """Related-form contrast (R3) over the given token pairs whose two tokens occur (self-pairs
    and repeats dropped; forms_n_pairs counts the pairs used):
    - forms_cosine: mean cosine of the pairs;
    - forms_matched_cosine: mean cosine of frequency-matched random pairs (_matched_random_cosine);
    - forms_contrast = forms_cosine - forms_matched_cosine. Positive: the space pulls the forms
      together beyond what their frequencies explain; about 0 or below: it keeps them apart;
    - forms_random_cosine: mean cosine of n_random uniform random pairs, descriptive only
      (frequent-frequent pairs are rare among them, yet common among related forms).
    Keys: n_tokens, forms_n_pairs, forms_cosine, forms_matched_cosine, forms_random_cosine,
    forms_contrast (the four means are None with no usable pair)."""
    idx = occurring(counts)
    counts_occ = np.asarray(counts)[idx]
    pair_rows = _pair_rows(pairs, idx, W.shape[0])
    return {"n_tokens": len(idx), **_pair_contrast(Rows(W, idx), pair_rows, counts_occ, n_random, seed)}


# -----------------------------------------------------------------------------
# the full pass


def _matrix_metrics(rows: Rows, counts_occ: np.ndarray, pair_rows: np.ndarray, seed: int) -> Metrics:
    out = {**_row_norms(rows, counts_occ), **_anisotropy(rows, N_PAIRS, seed), **_isotropy(rows)}
    out.update(_spectrum(rows, MAX_SINGULAR_VALUES))
    # same n and seed as the anisotropy pairs, so forms_random_cosine == anisotropy
    out.update(_pair_contrast(rows, pair_rows, counts_occ, N_PAIRS, seed))
    return out


def measure(
    W_in: torch.Tensor,
    W_out: torch.Tensor,
    counts: Counts,
    buckets: Counts,
    W_in0: torch.Tensor | None = None,
    W_out0: torch.Tensor | None = None,
    pairs: Pairs = (),
    seed: int = 0,
) -> dict[str, Any]:
    """The full geometry pass, run during training and by `tiecli geometry`. Returns
    {"n_tokens", "tied", "input": {...}, "output": {...}, "agreement": {...} or None}.
    Each side holds row_norms, anisotropy, isotropy, spectrum and pair_contrast keys (forms_n_pairs
    always; the forms_* means None without usable pairs), drift keys when that side's W0 is
    given. When W_in and W_out are the same tensor ("tied"), the side metrics are computed once
    and agreement is None (row_cosine, knn_overlap and cka would be 1, distance 0)."""
    idx = occurring(counts)
    counts_occ, buckets_occ = np.asarray(counts)[idx], np.asarray(buckets)[idx]
    # Tied is structural: untied_init and hybrid start with equal matrices, yet they are two.
    tied = W_in is W_out
    pair_rows = _pair_rows(pairs, idx, W_in.shape[0])

    rows_in = Rows(W_in, idx)
    rows_out = rows_in if tied else Rows(W_out, idx)
    side_in = _matrix_metrics(rows_in, counts_occ, pair_rows, seed)
    side_out = dict(side_in) if tied else _matrix_metrics(rows_out, counts_occ, pair_rows, seed)
    if W_in0 is not None:
        side_in.update(_drift(rows_in, Rows(W_in0, idx), buckets_occ))
    if W_out0 is not None:
        side_out.update(_drift(rows_out, Rows(W_out0, idx), buckets_occ))
    return {
        "n_tokens": len(idx),
        "tied": tied,
        "input": side_in,
        "output": side_out,
        "agreement": None if tied else _agreement(rows_in, rows_out, KNN_K, N_QUERIES, seed),
    }
