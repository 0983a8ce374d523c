# python benchmarks/sample_speed.py [--sizes micro,small,gpt2] [--device cpu]
"""What a key/value cache would save `tiecli sample`, at the shipped model sizes.

`tiecli sample` runs the model over the whole context (up to block_size tokens) for every new
token, through GPT.forward, and keeps the last position's logits. This script times one new token
three ways, with the context full (the steady state once block_size tokens exist):

  full      GPT.forward over the context, all positions' logits (what tiecli sample does)
  last      the same body, the output matrix applied to the last position only
  kv-cache  one position through each block, attending to cached keys and values

The cached step is written here from the model's own modules, only to measure it, and checked
against GPT.forward's logits. It prints milliseconds per token and the time to generate
block_size tokens from a one-token prompt (the sum over context lengths 1..block_size, from
timings at a few lengths, interpolated).
"""

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from tiecli.model import GPT, GPTConfig

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


def prefill(model: GPT, idx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each block's keys and values (B, nh, T, hs) for the context."""
    cache = []
    x = model.emb.encode(idx) + model.wpe(torch.arange(idx.size(1), device=idx.device))
    for block in model.h:
        B, T, C = x.shape
        _, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
        cache.append(tuple(t.view(B, T, block.attn.n_head, -1).transpose(1, 2) for t in (k, v)))
        x = block(x)
    return cache


def cached(model: GPT, token: torch.Tensor, position: int, cache: list) -> torch.Tensor:
    """Logits of one new token (B, 1) at `position`, attending to the cached positions before it and itself.

    A generator would keep the extended keys and values for the next token; timing needs only one step.
    """
    x = model.emb.encode(token) + model.wpe(torch.tensor([position], device=token.device))  # (B, 1, C)
    for i, block in enumerate(model.h):
        B, _, C = x.shape
        nh = block.attn.n_head
        q, k, v = (t.view(B, 1, nh, C // nh).transpose(1, 2) for t in block.attn.c_attn(block.ln_1(x)).split(C, dim=2))
        keys, values = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)  # (B, nh, T+1, hs)
        y = F.scaled_dot_product_attention(q, keys, values)  # the new position sees every cached one
        x = x + block.attn.c_proj(y.transpose(1, 2).reshape(B, 1, C))
        x = x + block.mlp(block.ln_2(x))
    return model.emb.decode(model.ln_f(x))[:, -1]


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
        cache = prefill(model, idx[:, :-1])
        worst = (cached(model, idx[:, -1:], T - 1, cache) - full(model, idx)).abs().max().item()
        assert worst < 1e-3, f"the cached step disagrees with GPT.forward by {worst}"
        per_token["full"].append(timed(reps, full, model, idx))
        per_token["last"].append(timed(reps, last, model, idx))
        per_token["kv-cache"].append(timed(reps, cached, model, idx[:, -1:], T - 1, cache))
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
