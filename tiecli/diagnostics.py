# Used by `tiecli train` (gradient statistics every diag.every steps, geometry at evaluations) and `tiecli geometry`.
"""Measurements taken from a model's token matrices while it trains.

Gradient interference (claim R4, "gradient cancellation"): how the input-path and output-path
gradients of the token matrices interact.

In a shared matrix W the gradient is G = G_in + G_out: G_in arrives through the embedding lookup
(non-zero only in rows of tokens present in the batch's inputs), G_out through the logits (every
row). Both come from the one backward pass that trains the model (tiecli/model.py:Embeddings
records them through hooked views). In untied modes G_in is the input embedding's gradient and
G_out the output matrix's: what tying would have summed.

  grad_cos            cos(G_in, G_out) over all rows
  grad_cos_present    the same over the rows of tokens present in the inputs (G_in is zero elsewhere)
  grad_cos_<bucket>   the same over present rows in each frequency bucket (frequent / mid / rare)
  grad_norm_in/out    |G_in|_F, |G_out|_F, and grad_norm_ratio = |G_in| / |G_out|
  grad_cancel         1 - |G_in + G_out| / (|G_in| + |G_out|): 0 when aligned, 1 when they cancel
  grad_neg_rows       share of present rows whose own cos(g_in, g_out) is negative

Geometry (claims R3, C2, C7): tiecli/geometry.py's metrics of the effective input and output
matrices (what the model actually uses, in partial and hybrid too), with drift measured against
the matrices at step 0 and related word forms from English suffix rules or a user's pairs file.
"""

from pathlib import Path

import numpy as np
import tiktoken
import torch

from tiecli import checkpoint, geometry, rundir, tokenizer
from tiecli.config import Config
from tiecli.data import BUCKETS, load_corpus
from tiecli.errors import TiecliError
from tiecli.model import Embeddings, GPTConfig


def gradient_paths(emb: Embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """(G_in, G_out) of the last backward pass(es), before clipping."""
    if emb.shared:
        return emb.grads["in"], emb.grads["out"]
    return emb.wte.grad, emb.lm_head.grad


def _cos(a: torch.Tensor, b: torch.Tensor) -> float | None:
    denom = a.norm() * b.norm()
    return (torch.sum(a * b) / denom).item() if denom > 0 else None


@torch.no_grad()
def interference(g_in: torch.Tensor, g_out: torch.Tensor, present: torch.Tensor, buckets: torch.Tensor) -> dict:
    """The statistics above. present: (V,) bool, tokens in this step's inputs; buckets: (V,) bucket ids."""
    g_in, g_out = g_in.float(), g_out.float()  # (V, C) or (V, k): the shared columns in partial mode
    n_in, n_out = g_in.norm().item(), g_out.norm().item()
    rows_in, rows_out = g_in[present], g_out[present]  # (P, C)
    row_cos = torch.nn.functional.cosine_similarity(rows_in, rows_out, dim=1)  # (P,)
    stats = {
        "grad_cos": _cos(g_in, g_out),
        "grad_cos_present": _cos(rows_in, rows_out),
        "grad_norm_in": n_in,
        "grad_norm_out": n_out,
        "grad_norm_ratio": n_in / n_out if n_out > 0 else None,
        "grad_cancel": 1 - (g_in + g_out).norm().item() / (n_in + n_out) if n_in + n_out > 0 else None,
        "grad_neg_rows": (row_cos < 0).float().mean().item() if len(row_cos) else None,
        "grad_present_rows": int(present.sum()),
    }
    present_buckets = buckets[present]
    for i, name in enumerate(BUCKETS):
        mask = present_buckets == i
        stats[f"grad_cos_{name}"] = _cos(rows_in[mask], rows_out[mask]) if mask.any() else None
    return stats


def form_pairs(enc: tiktoken.Encoding, path: str | None) -> tuple[list[tuple[int, int]], dict]:
    """Related-form token pairs and where they came from: the user's file, else English suffix rules."""
    if path is None:
        pairs = geometry.english_form_pairs(tokenizer.token_strings(enc))
        return pairs, {"source": "english suffix rules", "found": len(pairs)}
    pairs, skipped = geometry.read_pairs_file(Path(path).expanduser(), enc.encode_ordinary)
    return pairs, {"source": str(path), "found": len(pairs), "skipped_lines": skipped}


@torch.no_grad()
def embedding_geometry(emb: Embeddings, emb0: Embeddings, counts: np.ndarray, buckets: np.ndarray,
                       pairs: list, pairs_info: dict, seed: int) -> dict:
    """One geometry.json entry: geometry.measure() of the effective matrices, drift against emb0."""
    w_in, w_in0 = emb.input_matrix().cpu(), emb0.input_matrix().cpu()  # (V, C) each
    # One object when the mode has one matrix: measure() then knows it is tied and measures it once.
    w_out = w_in if emb.one_matrix else emb.output_matrix().cpu()
    w_out0 = w_in0 if emb.one_matrix else emb0.output_matrix().cpu()
    return {**geometry.measure(w_in, w_out, counts, buckets, w_in0, w_out0, pairs, seed=seed), "pairs": pairs_info}


def embeddings_from_state(state: dict, config: GPTConfig) -> Embeddings:
    """An Embeddings module holding saved token matrices. Built on the meta device, so it draws no
    random numbers: during training that would shift the dropout RNG and break exact resume."""
    with torch.device("meta"):
        emb = Embeddings(config)
    emb.load_state_dict(state, assign=True)
    return emb


def geometry_of_run(run_dir: Path, config: Config, step: str, pairs_path: str | None, write: bool) -> dict:
    """Recompute the geometry entry of a run at `step` (latest, init or a snapshot's step number)."""
    init = embeddings_from_state(checkpoint.load(run_dir / rundir.INIT_CHECKPOINT)["emb"], config.model)
    if step == "latest":
        ckpt = checkpoint.load(run_dir / rundir.CHECKPOINT)
        emb = embeddings_from_state({k.removeprefix("emb."): v for k, v in ckpt["model"].items() if k.startswith("emb.")}, config.model)
        number = ckpt["state"]["step"]
    elif step == "init":
        emb, number = init, 0
    else:
        saved = sorted(int(p.stem.removeprefix("step_")) for p in (run_dir / rundir.SNAPSHOTS).glob("step_*.pt"))
        if not step.isdigit() or int(step) not in saved:
            choices = ", ".join(["latest", "init", *map(str, saved)])
            raise TiecliError(f"--step {step!r} has no saved token matrices in {str(run_dir)!r}; choose one of {choices}")
        number = int(step)
        emb = embeddings_from_state(checkpoint.load(run_dir / rundir.SNAPSHOTS / f"step_{number}.pt")["emb"], config.model)
    corpus = load_corpus(config.data, config.tokenizer)
    rundir.check_corpus(run_dir, corpus.key)
    pairs, pairs_info = form_pairs(corpus.encoding, pairs_path or config.diag.pairs)
    buckets = corpus.buckets(config.eval.buckets)
    entry = {"step": number, **embedding_geometry(emb, init, corpus.counts, buckets, pairs, pairs_info, config.diag.seed)}
    if write:
        path = run_dir / rundir.GEOMETRY
        entries = [e for e in (rundir.read_json(path) if path.exists() else []) if e["step"] != number]
        rundir.write_json(path, sorted([*entries, entry], key=lambda e: e["step"]))
    return entry
