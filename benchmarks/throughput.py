# python benchmarks/throughput.py [--models nano,micro,tiny] [--steps 200] [--rounds 3] [OVERRIDES...]
"""Training throughput of tiecli's loop against a bare reference loop, model-FLOPs utilisation,
and the cost of the diagnostics.

For each model size, on this machine, in one process:
  reference  the same GPT, batches already in memory, forward/backward/clip/AdamW and nothing else;
  tiecli     tiecli.train.train() as `tiecli train` runs it (data sampling, logging, progress bar,
             checkpoints), diagnostics off, its tokens/s read from metrics.jsonl over the intervals
             after warm-up; then again with the default gradient statistics (diag.every).
Each is run --rounds times, interleaved, and the best tokens/s of each is kept. The runner's
overhead is 1 - tiecli / reference (target: under 5%); the diagnostics' overhead is
1 - with / without (target: under 5%). MFU divides the model's training FLOPs per second
(6 x matmul parameters + attention, per token) by the fp32 matmul throughput measured here, so it
needs no vendor peak figure. Last, one full geometry pass at GPT-2's vocabulary and width
(50257 x 768), tied and untied (target: a few seconds).
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tiecli import config, diagnostics, rundir, tokenizer
from tiecli.data import load_corpus
from tiecli.model import GPT, Embeddings, GPTConfig
from tiecli.train import make_optimizer, train


def matmul_flops(n: int = 1024, repeats: int = 20) -> float:
    """Best fp32 matmul FLOP/s of a few square sizes: the machine's practical peak."""
    best = 0.0
    for size in (n // 2, n, 2 * n):
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * size**3 * repeats / (time.perf_counter() - start))
    return best


def flops_per_token(cfg: config.Config, counts: dict) -> float:
    """6N for the matmul parameters (non-embedding + output matrix) plus attention's 12 L T C (PaLM appendix B)."""
    m = cfg.model
    matmul_params = counts["non_embedding"] + m.vocab_size * m.n_embd
    return 6 * matmul_params + 12 * m.n_layer * m.block_size * m.n_embd


def reference_tokens_per_s(cfg: config.Config, tokens: torch.Tensor, steps: int, warmup: int = 5) -> float:
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    opt = make_optimizer(model, cfg.train, torch.device("cpu"))
    B, T = cfg.train.batch_size, cfg.model.block_size
    starts = torch.randint(len(tokens) - T - 1, (steps + warmup, B))
    batches = [torch.stack([tokens[s : s + T + 1] for s in row]) for row in starts]
    for i, batch in enumerate(batches):
        if i == warmup:
            start = time.perf_counter()
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * B * T / (time.perf_counter() - start)


def tiecli_tokens_per_s(overrides: list[str]) -> float:
    cfg_node, _ = config.compose(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        train(config.to_config(cfg_node), Path(tmp) / "run", False, {rundir.CONFIG: config.to_yaml(cfg_node)})
        rows = rundir.read_jsonl(Path(tmp) / "run" / rundir.METRICS)
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return statistics.mean(rates[1:])  # the first interval holds the warm-up


def diag_seconds(cfg: config.Config, tokens: torch.Tensor, repeats: int = 20) -> float:
    """One gradient-statistics call, timed on its own: marking the present tokens and interference()."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    model.emb.record_grads = True
    batch = tokens[: cfg.train.batch_size * (cfg.model.block_size + 1)].view(cfg.train.batch_size, -1)
    model(batch[:, :-1], batch[:, 1:]).backward()
    buckets = torch.randint(0, 3, (cfg.model.vocab_size,))
    start = time.perf_counter()
    for _ in range(repeats):
        present = torch.zeros(cfg.model.vocab_size, dtype=torch.bool)
        present[batch[:, :-1].flatten()] = True
        diagnostics.interference(*diagnostics.gradient_paths(model.emb), present, buckets)
    return (time.perf_counter() - start) / repeats


def geometry_seconds(mode: str) -> float:
    """One geometry pass over GPT-2-sized token matrices, every token occurring, English form pairs."""
    cfg = GPTConfig(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, block_size=1024, tying=mode)
    torch.manual_seed(0)
    emb, emb0 = Embeddings(cfg), Embeddings(cfg)
    counts = np.random.default_rng(0).zipf(1.3, cfg.vocab_size).clip(1, 10**9)
    buckets = np.random.default_rng(1).integers(0, 3, cfg.vocab_size).astype(np.int8)
    pairs, info = diagnostics.form_pairs(tokenizer.gpt2(), None)
    start = time.perf_counter()
    diagnostics.embedding_geometry(emb, emb0, counts, buckets, pairs, info, seed=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="nano,micro,tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; the best of each is kept")
    parser.add_argument("overrides", nargs="*", help="extra tiecli overrides, e.g. tokenizer=gpt2")
    args = parser.parse_args()

    peak = matmul_flops()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 matmul peak measured: {peak / 1e9:.0f} GFLOP/s"
    )
    print(
        f"{'model':<8}{'params':>12}{'reference tok/s':>17}{'tiecli tok/s':>14}{'overhead':>10}{'MFU':>7}"
        f"{'with diag tok/s':>17}{'diag overhead':>15}{'diag call':>11}{'diag cost':>11}"
    )
    for name in args.models.split(","):
        overrides = [
            f"model={name}",
            f"train.max_steps={args.steps}",
            f"train.eval_interval={args.steps}",
            *args.overrides,
        ]
        cfg = config.to_config(config.compose(overrides)[0])
        tokens = torch.from_numpy(load_corpus(cfg.data, cfg.tokenizer).tokens["train"].astype("int64"))
        # A 2-core machine's speed drifts by several percent over minutes, more than the overheads
        # measured here: interleave the three loops for a few rounds and keep each one's best.
        rounds = [
            (
                reference_tokens_per_s(cfg, tokens, args.steps),
                tiecli_tokens_per_s([*overrides, "diag.every=0", "diag.geometry=false"]),
                tiecli_tokens_per_s(overrides),
            )
            for _ in range(args.rounds)
        ]
        ref, ours, with_diag = (max(column) for column in zip(*rounds))
        counts = GPT(cfg.model).param_counts()
        mfu = flops_per_token(cfg, counts) * ours / peak
        # The direct figure: one call's time over the training time of the diag.every steps it covers.
        call = diag_seconds(cfg, tokens)
        cost = call / (cfg.diag.every * cfg.tokens_per_step / ours)
        print(
            f"{name:<8}{counts['total']:>12,}{ref:>17,.0f}{ours:>14,.0f}{1 - ours / ref:>10.1%}{mfu:>7.1%}"
            f"{with_diag:>17,.0f}{1 - with_diag / ours:>15.1%}{call * 1e3:>9.2f}ms{cost:>11.2%}"
        )
    print(
        "diag overhead: end to end (noisy: the machine drifts); diag cost: one call / (diag.every steps), "
        f"diag.every={cfg.diag.every}"
    )
    for mode in ("untied", "tied"):
        print(f"geometry pass at 50257 x 768, {mode}: {geometry_seconds(mode):.2f} s")


if __name__ == "__main__":
    main()
