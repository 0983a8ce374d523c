# Used by `tiecli train` (gradient statistics every diag.every steps, geometry at evaluations) and `tiecli geometry`.
"""Measurements taken from a model's token matrices while it trains.

Gradient interference (claim R4, "gradient cancellation"): how the input-path and output-path
gradients of the token matrices interact.

In a shared matrix W the gradient is G = G_in + G_out: G_in arrives through the embedding lookup
(non-zero only in rows of tokens present in the batch's inputs), G_out through the logits (every
row). Both come from the one backward pass that trains the model (tiecli/model.py:Embeddings
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

Geometry (claims R3, C2, C7): tiecli/geometry.py's metrics of the effective input and output
matrices (what the model actually uses, in partial and hybrid too), with drift measured against
the matrices at step 0 and related word forms from a pairs file (the shipped English conf/pairs/en.tsv
by default) or English suffix rules.
"""

from pathlib import Path

import numpy as np
import tiktoken
import torch

from tiecli import checkpoint, distributed, geometry, rundir, tokenizer
from tiecli.config import Config, default_config_dir
from tiecli.data import BUCKETS, load_corpus
from tiecli.errors import TiecliError
from tiecli.model import Embeddings
from tiecli.rundir import GeometryEntry


def gradient_paths(emb: Embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """(G_in, G_out) of the last backward pass(es), before clipping."""
    if emb.shared:
        split = emb.split_grads()
        assert split is not None  # called after a backward pass, which fills both sinks
        return split
    g_in, g_out = emb.wte.grad, emb.lm_head.grad
    assert g_in is not None and g_out is not None  # called after a backward pass, which sets both
    return g_in, g_out


def across_ranks(
    emb: Embeddings, g_in: torch.Tensor, g_out: torch.Tensor, present: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gradient_paths and the input tokens of the global batch, from each rank's own (the identity in one process).

    Under DDP a shared matrix's split holds each rank's own micro-batches' gradients: they are
    averaged over the ranks in place, as DDP averages W.grad, and present is OR-ed, so the statistics
    are those of one process on the whole batch. An untied model's wte.grad and lm_head.grad are
    W.grad itself, which DDP has already averaged.
    """
    if emb.shared:
        g_in, g_out = distributed.mean_(g_in), distributed.mean_(g_out)
    return g_in, g_out, distributed.any_(present)


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


def pairs_file(name: str) -> Path:
    """The pairs file that diag.pairs / --pairs names: a bare name (letters, digits, _ and -, as
    "en") is a file shipped in conf/pairs/<name>.tsv; anything else is a path ("./en" for a file
    called en)."""
    if not name.replace("-", "").replace("_", "").isalnum():
        return Path(name).expanduser()
    shipped = default_config_dir() / "pairs"
    path = shipped / f"{name}.tsv"
    if not path.is_file():
        choices = ", ".join(sorted(p.stem for p in shipped.glob("*.tsv")))
        raise TiecliError(
            f"no shipped pairs file {name!r} (shipped: {choices}); give a path such as ./{name} for your own file"
        )
    return path


def form_pairs(enc: tiktoken.Encoding, path: str | None) -> tuple[list[tuple[int, int]], dict]:
    """Related-form token pairs and where they came from: a shipped or user's file, else English suffix rules."""
    if path is None:
        pairs = geometry.english_form_pairs(tokenizer.token_strings(enc))
        return pairs, {"source": "english suffix rules", "found": len(pairs)}
    pairs, skipped = geometry.read_pairs_file(pairs_file(str(path)), enc.encode_ordinary)
    return pairs, {"source": str(path), "found": len(pairs), "skipped_lines": skipped}


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


def geometry_of_run(run_dir: Path, config: Config, step: str, pairs_path: str | None, write: bool) -> GeometryEntry:
    """Recompute the geometry entry of a run at `step` (latest, init or a snapshot's step number).

    With write, the entry goes into geometry.json under the run's lock, so a running trainer's entries are never lost.
    """
    reader, name = rundir.RunReader(run_dir), run_dir.name
    init = checkpoint.load_embeddings(run_dir / rundir.INIT_CHECKPOINT, config.model, name)
    if step == "latest":
        ckpt = reader.checkpoint()
        emb, number = checkpoint.embeddings_of(ckpt, config.model, name), ckpt["state"]["step"]
    elif step == "init":
        emb, number = init, 0
    else:
        saved = reader.snapshot_steps()
        if not step.isdigit() or int(step) not in saved:
            choices = ", ".join(["latest", "init", *map(str, saved)])
            raise TiecliError(
                f"--step {step!r} has no saved token matrices in {str(run_dir)!r}; choose one of {choices}"
            )
        number = int(step)
        emb = checkpoint.load_embeddings(run_dir / rundir.SNAPSHOTS / f"step_{number}.pt", config.model, name)
    corpus = load_corpus(config.data, config.tokenizer)
    reader.check_corpus(corpus.key)
    pairs, pairs_info = form_pairs(corpus.encoding, pairs_path or config.diag.pairs)
    buckets = corpus.buckets(config.eval.buckets)
    measured = embedding_geometry(emb, init, corpus.counts, buckets, pairs, pairs_info, config.diag.seed)
    entry = rundir.parse_record(GeometryEntry, {"step": number, **measured}, "a geometry entry")
    if write:
        with rundir.RunWriter.open(run_dir) as run:
            run.geometry(entry)
    return entry
