# python benchmarks/diag_cost.py [--configs default,a,b] [--steps 10] [--rounds 2] [--pairs 600]
"""What the gradient statistics cost a training run: R4's pair projection (diagnostics.pair_gradients),
its cancelled fractions on raw gradients and through AdamW's step size (cancellation.pair_cancellation)
and the global interference figures (diagnostics.interference), each as a share of the diag.every=10
training steps it is paid once in; and the row sample (diagnostics.row_sample, L1) each geometry step
writes, as a share of one step.

For each config of benchmarks/throughput.py and each of tied and untied: tiecli's training step
(throughput.tiecli_variant: compile and dtype as `auto` resolves them, the fused head, fused AdamW),
best seconds per step over --rounds; then, after one backward pass as fit makes on a diag step, the
best of 5 calls of each statistic on those gradients. Related pairs: at GPT-2's vocabulary (config
b) the shipped English pairs file's; otherwise --pairs random token pairs (about what the ~600-line
English file yields). The null: diagnostics.N_NULL_PAIRS frequency-matched pairs, drawn once, as
train.fit draws them; AdamW (conf/'s defaults, make_optimizer) has taken one step, so its second
moments exist. Target: < 2% for the pair statistics together.
"""

import argparse
import time

import numpy as np
import torch
from throughput import CONFIGS, DEVICE, sync, tiecli_variant, timed

from tiecli.config.checks import to_config
from tiecli.config.compose import compose
from tiecli.config.schema import GPTConfig
from tiecli.data import tokenizer
from tiecli.data.pairs import form_pairs
from tiecli.measure import cancellation, diagnostics
from tiecli.model.gpt import GPT
from tiecli.train.optim import make_optimizer

REPEATS = 5
EVERY = 10  # diag.every's default: one statistics call per 10 training steps


def related_pairs(V: int, n: int) -> list[tuple[int, int]]:
    if V >= 50257:  # GPT-2's vocabulary: the shipped pairs, as a default run uses them
        return form_pairs(tokenizer.gpt2(), "en")[0]
    g = np.random.default_rng(0)
    a, b = g.integers(V, size=n), g.integers(V, size=n)
    return [(int(x), int(y)) for x, y in zip(a, b) if x != y]


def best_call(model, data, call) -> float:
    """Seconds of call() after one backward, as fit calls the statistics on a diag step; best of REPEATS."""
    best = float("inf")
    for _ in range(REPEATS):
        x, y = data
        model(x, y).backward()
        sync()
        start = time.perf_counter()
        call(x)
        sync()
        best = min(best, time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        model.emb.clear_split_grads()
    return best


def measure(cfg: str, tying: str, steps: int, rounds: int, n_pairs: int) -> dict:
    L, C, T, V, B = CONFIGS[cfg]
    step = min(timed(tiecli_variant(cfg, tying), steps) for _ in range(rounds))
    # the statistics read only the gradients: an eager model of the same shape gives them
    gpt = GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=max(1, C // 64), n_embd=C, tying=tying)
    model = GPT(gpt, seed=0).to(DEVICE)
    counts = np.random.default_rng(1).zipf(1.3, size=V).astype(np.int64)  # Zipf-like training counts, all > 0
    index = diagnostics.pair_index(related_pairs(V, n_pairs), counts, seed=0, device=DEVICE)
    buckets = torch.randint(0, 3, (V,), device=DEVICE)
    x = torch.randint(V, (B, T + 1), generator=torch.Generator().manual_seed(0))
    data = (x[:, :-1].to(DEVICE), x[:, 1:].to(DEVICE))
    optimizer = make_optimizer(model, to_config(compose([])[0]).train, DEVICE)
    model(*data).backward()
    optimizer.step()  # the second moments the adam reading uses
    optimizer.zero_grad(set_to_none=True)
    model.emb.clear_split_grads()

    def cancel(_x):
        g_in, g_out = diagnostics.gradient_paths(model.emb)
        cancellation.pair_cancellation(g_in, g_out, *diagnostics.path_matrices(model.emb), index, optimizer)

    def pairs(_x):
        g_in, g_out = diagnostics.gradient_paths(model.emb)
        diagnostics.pair_gradients(g_in, g_out, *diagnostics.path_matrices(model.emb), index)

    def interference(x):
        present = torch.zeros(V, dtype=torch.bool, device=DEVICE)
        present[x.flatten()] = True
        diagnostics.interference(*diagnostics.gradient_paths(model.emb), present, buckets)

    return {
        "step": step,
        "pairs": best_call(model, data, pairs),
        "cancel": best_call(model, data, cancel),
        "rows": best_call(model, data, lambda _x: diagnostics.row_sample(model.emb, counts)),
        "interference": best_call(model, data, interference),
        "n_pairs": len(index.forms),
        "n_null": len(index.null),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="default,a,b")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=600)
    args = parser.parse_args()
    print(f"device {DEVICE}, torch {torch.__version__}, threads {torch.get_num_threads()}; diag.every={EVERY}")
    for cfg in args.configs.split(","):
        L, C, T, V, B = CONFIGS[cfg]
        for tying in ("tied", "untied"):
            m = measure(cfg, tying, args.steps, args.rounds, args.pairs)
            budget = EVERY * m["step"]
            print(
                f"{cfg} ({L}x{C}, block {T}, vocab {V}, batch {B}) {tying}: step {m['step'] * 1e3:.1f} ms; "
                f"pairs ({m['n_pairs']} + {m['n_null']} null) {m['pairs'] * 1e3:.2f} ms = {m['pairs'] / budget:.2%} "
                f"of {EVERY} steps, cancellation {m['cancel'] * 1e3:.2f} ms = {m['cancel'] / budget:.2%} (together "
                f"{(m['pairs'] + m['cancel']) / budget:.2%}, target < 2%); interference {m['interference'] * 1e3:.2f} "
                f"ms = {m['interference'] / budget:.2%}; row sample {m['rows'] * 1e3:.2f} ms = "
                f"{m['rows'] / m['step']:.1%} of one step, per geometry step"
            )


if __name__ == "__main__":
    main()
