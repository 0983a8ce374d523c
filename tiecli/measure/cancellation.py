# Used by `tiecli train` (every diag.every steps, beside tiecli/measure/diagnostics.py's pair statistics).
"""How much of the two paths' updates cancels along related-form pairs (claim R4, "R4 (cancellation)").

tiecli/measure/diagnostics.py's pair statistics count signs: whether, along a related pair's difference, the
input path pulls and the output path pushes. The article's claim is about magnitudes: on a shared
matrix the two paths' updates along that direction cancel. For each pair (a, b) and each path,
with s the path's component along the pair's difference (diagnostics.projections),

  cancelled fraction = 1 - |s_in + s_out| / (|s_in| + |s_out|)

0 when the paths agree in sign (or one is zero), 1 when they are equal and opposite. Summed over the
pairs and then over training (the report accumulates the per-step means: a ratio of sums, so a step
counts by how much the paths move the pair, not once each), it is the share of the two paths'
movement along the pairs that cancels. Two readings of s:

  grad  the raw gradients G_in, G_out, as diagnostics.pair_gradients reads them;
  adam  each path's gradient through the step size AdamW gives its matrix at this step,
        lr / (sqrt(v_hat) + eps), v_hat = the bias-corrected second moment the coming step uses
        (beta2 v + (1 - beta2) g^2 with g the matrix's whole gradient, before clipping). Tied: both
        paths through the one matrix's v, so s_in + s_out is exactly the (momentum-free) step the
        shared matrix takes along the pair; untied: each path through its own matrix's v and lr.
        What it cannot say: Adam's momentum spreads each step's gradient over later steps, and the
        second moment itself mixes both paths, so this is the split of one step's preconditioned
        gradient, not of the weights' actual movement. In untied modes the two updates land on two
        matrices and nothing cancels in fact: there the figure is the control, what summing would
        have cancelled.

The null: diagnostics.PairIndex's frequency-matched random pairs, matched at each step also on the
pair's cosine (cos(w[a], w[b]) on the input path's matrix: the shared one when tied), since how two
paths move a pair can depend on how close its rows already are. Matching is by reweighting: the
related pairs' cosines cut into N_COS_BINS quantile bins, each null pair weighted so the null's
weight per bin equals the related pairs' count there; a bin holding fewer than MIN_NULL_PER_BIN
null pairs is left out, its related pairs too (pair_cancel_cover: the share of related pairs kept).

Keys (per diag step, KIND grad or adam; _null: the matched null, weighted):
  pair_cancel_KIND_num, pair_cancel_KIND_den          mean |s_in + s_out| and mean |s_in| + |s_out| over the kept pairs
  pair_cancel_KIND_null_num, pair_cancel_KIND_null_den the same over the null, weighted
  pair_cancel_KIND, pair_cancel_KIND_null             1 - num / den at this step
  pair_cancel_cover, pair_row_cos, pair_row_cos_null  kept share; mean pair cosine, related and (unweighted) null
"""

import torch

from tiecli.measure.diagnostics import PairIndex, differences, projections

N_COS_BINS = 8  # quantile bins of the related pairs' cosine: ~75 related pairs each at the shipped pairs' P
MIN_NULL_PER_BIN = 8  # fewer null pairs than this in a bin cannot stand for its related pairs
KINDS = ("grad", "adam")
CANCEL_KEYS = tuple(
    f"pair_cancel_{kind}{null}{part}" for kind in KINDS for null in ("", "_null") for part in ("_num", "_den", "")
) + ("pair_cancel_cover", "pair_row_cos", "pair_row_cos_null")


def cosine_weights(cos_forms: torch.Tensor, cos_null: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept (P,) bool, weights (N,)): related pairs in bins the null covers, and null weights that give each
    bin the related pairs' count (0 outside the kept bins)."""
    inner = torch.linspace(0, 1, N_COS_BINS + 1, device=cos_forms.device)[1:-1]
    edges = torch.quantile(cos_forms.float(), inner)  # (B - 1,)
    bin_forms, bin_null = torch.bucketize(cos_forms, edges), torch.bucketize(cos_null, edges)
    count_forms = torch.bincount(bin_forms, minlength=N_COS_BINS).float()  # (B,)
    count_null = torch.bincount(bin_null, minlength=N_COS_BINS).float()
    covered = count_null >= MIN_NULL_PER_BIN
    weights = torch.where(covered[bin_null], count_forms[bin_null] / count_null[bin_null].clamp_min(1), 0.0)
    return covered[bin_forms], weights


def _terms(s_in: torch.Tensor, s_out: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted means of |s_in + s_out| and |s_in| + |s_out|."""
    total = weights.sum().clamp_min(1e-30)
    return ((s_in + s_out).abs() * weights).sum() / total, ((s_in.abs() + s_out.abs()) * weights).sum() / total


def adam_step_size(optimizer: torch.optim.Optimizer, p: torch.Tensor, grads: tuple, rows: torch.Tensor):
    """lr / (sqrt(v_hat) + eps) at `rows` of parameter p (R, C): v_hat the bias-corrected second moment the
    coming AdamW step will use, beta2 v + (1 - beta2) g^2, g = sum(grads) (p's whole gradient, unscaled: both
    paths' when p is shared), summed at the rows only."""
    group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
    beta2, eps, lr = group["betas"][1], group["eps"], group["lr"]
    state = optimizer.state.get(p, {})
    taken = int(state["step"]) if "step" in state else 0  # steps taken so far: the coming one is taken + 1
    g = torch.index_select(grads[0], 0, rows).float()  # (R, C)
    for grad in grads[1:]:
        g += torch.index_select(grad, 0, rows)
    v = (1 - beta2) * g.square()
    if "exp_avg_sq" in state:
        v += beta2 * torch.index_select(state["exp_avg_sq"], 0, rows).float()
    return lr / ((v / (1 - beta2 ** (taken + 1))).sqrt() + eps)


@torch.no_grad()
def pair_cancellation(
    g_in: torch.Tensor,
    g_out: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    index: PairIndex,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict:
    """The keys above; the adam ones None without an optimizer (w_in, w_out: the parameters the paths'
    gradients belong to, diagnostics.path_matrices). All None when no related pair is in the vocabulary."""
    n_forms = len(index.forms)
    if n_forms == 0:
        return dict.fromkeys(CANCEL_KEYS)
    ids = torch.cat([index.forms, index.null])  # (M, 2)
    a, b = ids[:, 0], ids[:, 1]
    wi, wo = w_in.detach().float(), w_out.detach().float()
    diff_in = differences(wi, a, b)
    diff_out = diff_in if w_out is w_in else differences(wo, a, b)
    cos = torch.nn.functional.cosine_similarity(wi[a], wi[b], dim=1)  # (M,) the pair's cosine on the input side
    kept, null_weights = cosine_weights(cos[:n_forms], cos[n_forms:])
    weights = torch.cat([kept.float(), null_weights])
    s = {"grad": [projections(g.float(), *d, a, b)[0] for g, d in ((g_in, diff_in), (g_out, diff_out))]}
    if optimizer is not None:
        # the gradient each matrix's v sees: both paths' when shared, and then one step size for both paths
        whole = {id(w_in): (g_in, g_out)} if w_in is w_out else {id(w_in): (g_in,), id(w_out): (g_out,)}
        matrices = {id(p): p for p in (w_in, w_out)}  # one when shared
        sizes = {
            key: tuple(adam_step_size(optimizer, p, whole[key], rows) for rows in (a, b)) for key, p in matrices.items()
        }
        s["adam"] = [
            projections(g.float(), *d, a, b, sizes[id(p)])[0]
            for g, d, p in ((g_in, diff_in, w_in), (g_out, diff_out, w_out))
        ]
    figures: dict[str, torch.Tensor] = {}
    for kind, (s_in, s_out) in s.items():
        for null, part in (("", slice(0, n_forms)), ("_null", slice(n_forms, None))):
            num, den = _terms(s_in[part], s_out[part], weights[part])
            figures |= {f"pair_cancel_{kind}{null}_num": num, f"pair_cancel_{kind}{null}_den": den}
    figures |= {
        "pair_cancel_cover": kept.float().mean(),
        "pair_row_cos": cos[:n_forms].mean(),
        "pair_row_cos_null": cos[n_forms:].mean(),
    }
    if not kept.any():  # no bin covered: nothing to compare
        return dict.fromkeys(CANCEL_KEYS) | {"pair_cancel_cover": 0.0}
    measured: dict[str, float] = dict(zip(figures, torch.stack(list(figures.values())).tolist()))  # one device sync
    fractions = {
        f"pair_cancel_{kind}{null}": 1 - measured[f"pair_cancel_{kind}{null}_num"] / den if den > 0 else None
        for kind in s
        for null in ("", "_null")
        for den in [measured[f"pair_cancel_{kind}{null}_den"]]
    }
    return dict.fromkeys(CANCEL_KEYS) | measured | fractions
