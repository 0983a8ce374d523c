# python benchmarks/geometry_pass.py [--device cuda] [--vocab 50257] [--width 768]
"""Seconds of one geometry pass (geometry.measure, as every evaluation runs it) at GPT-2's shape.

Untied matrices (both sides, drift and agreement: the most work a pass does) of random rows with a
common direction, every token occurring, on the device named; the best of 2 after one warm-up.
The pass runs on the device the model is on (docs/performance.md has the figures).
"""

import argparse
import time

import numpy as np
import torch

from tiecli.measure import geometry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--width", type=int, default=768)
    args = parser.parse_args()
    device, V, C = torch.device(args.device), args.vocab, args.width
    g = torch.Generator().manual_seed(0)
    W_in = (0.02 * torch.randn(V, C, generator=g) + 0.01 * torch.randn(C, generator=g)).to(device)
    W_out = W_in + 0.01 * torch.randn(V, C, generator=g).to(device)
    counts = np.random.default_rng(0).zipf(1.3, V).astype(np.int64)
    buckets = np.random.default_rng(1).integers(0, 3, V).astype(np.int8)
    pairs = [(i, i + 1) for i in range(0, V - 1, 80)]

    def one() -> float:
        start = time.perf_counter()
        geometry.measure(W_in, W_out, counts, buckets, 0.9 * W_in, 0.9 * W_out, pairs, seed=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    one()
    print(
        f"geometry pass, untied, V={V:,} C={C} on {device} ({torch.get_num_threads()} threads): {min(one(), one()):.2f} s"
    )


if __name__ == "__main__":
    main()
