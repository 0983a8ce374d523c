# python benchmarks/sample_speed.py [--sizes micro,small,gpt2] [--device cpu]
"""What the key/value cache saves `tiecli sample`, at the shipped model sizes.

This script times one new token three ways, with the context full (the steady state once
block_size tokens exist):

  full      GPT.forward over the context, all positions' logits (tiecli sample before the cache,
            and still what it does once the context passes block_size and the window slides)
  last      the same body, the output matrix applied to the last position only
  kv-cache  one position through GPT.forward with a model.KVCache holding the rest (tiecli sample)

The cached step is checked against GPT.forward's logits. It prints milliseconds per token and the
time to generate block_size tokens from a one-token prompt (the sum over context lengths
1..block_size, from timings at a few lengths, interpolated).
"""

import argparse
import statistics
import time

import numpy as np
import torch

from tiecli.config.schema import GPTConfig
from tiecli.model.gpt import GPT, KVCache

SIZES = {  # conf/model/*.yaml with their usual vocabularies: bpe 4096 by default, gpt2 with tokenizer=gpt2
    "micro": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=4096),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=128, vocab_size=4096),
    "medium": dict(n_layer=8, n_head=8, n_embd=512, block_size=128, vocab_size=4096),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
}


def full(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    return model(idx)[:, -1]


def last(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    x = model.emb.encode(idx) + model.wpe(torch.arange(idx.size(1), device=idx.device))
    for block in model.h:
        x = block(x)
    return model.emb.decode(model.ln_f(x[:, -1:]))[:, -1]


def filled(model: GPT, idx: torch.Tensor) -> KVCache:
    """A cache holding idx's keys and values."""
    cache = KVCache(model.config)
    model(idx, cache=cache)
    return cache


def cached(model: GPT, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits of one new token (B, 1) after the cached positions; the cache is rewound so the step can repeat."""
    logits = model(token, cache=cache)[:, -1]
    cache.length -= 1
    return logits


def timed(reps: int, fn, *args) -> float:
    """Median seconds of fn(*args) over reps runs, after one warm-up."""
    fn(*args)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def measure(name: str, device: torch.device, reps: int) -> None:
    config = GPTConfig(**SIZES[name], tying="tied")
    model = GPT(config).to(device).eval()
    block = config.block_size
    lengths = sorted({2, block // 4, block // 2, 3 * block // 4, block})
    per_token = {way: [] for way in ("full", "last", "kv-cache")}
    for T in lengths:
        idx = torch.randint(config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T)).to(device)
        cache = filled(model, idx[:, :-1])
        worst = (cached(model, idx[:, -1:], cache) - full(model, idx)).abs().max().item()
        assert worst < 1e-3, f"the cached step disagrees with GPT.forward by {worst}"
        per_token["full"].append(timed(reps, full, model, idx))
        per_token["last"].append(timed(reps, last, model, idx))
        per_token["kv-cache"].append(timed(reps, cached, model, idx[:, -1:], cache))
    steps = np.arange(1, block + 1)
    print(f"{name}: {config.n_layer} x {config.n_embd}, vocab {config.vocab_size}, block {block}, on {device}")
    for way, times in per_token.items():
        total = float(np.interp(steps, lengths, times).sum())  # generating `block` tokens from one
        print(f"  {way:9s} {1e3 * times[-1]:9.2f} ms/token at a full context; {total:8.2f} s for {block} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="micro,small,gpt2", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.sizes.split(","):
        measure(name, torch.device(args.device), args.reps)


if __name__ == "__main__":
    main()
