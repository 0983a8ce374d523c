# python benchmarks/head_pad.py [--device cuda] [--rows 2048]
"""The fused head eager, forward and backward, at GPT-2's vocabulary: unpadded, padded to 50,304, one chunk.

Times head.linear_cross_entropy on random (rows, 768) inputs and a (50,257, 768) matrix in fp32,
best of 3 after a warm-up; the lines say the padding and the rows a chunk of each setting.
docs/performance.md has the figures.
"""

import argparse
import time

import torch

from tiecli.model import head


def bench(device: torch.device, rows: int, pad: int, elements: int, label: str) -> None:
    head.HEAD_PAD = {device.type: pad} if pad > 1 else {}
    head.HEAD_CHUNK_ELEMENTS = head.HEAD_CHUNK_ELEMENTS_CUDA = elements
    V, C = 50257, 768
    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, C, generator=g).to(device).requires_grad_()
    w = (0.02 * torch.randn(V, C, generator=g)).to(device).requires_grad_()
    y = torch.randint(0, V, (rows,), generator=g).to(device)

    def step() -> float:
        start = time.perf_counter()
        head.linear_cross_entropy(h, w, y).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        h.grad = w.grad = None
        return time.perf_counter() - start

    step()
    best = min(step() for _ in range(3))
    chunk = head._chunk_rows(rows, -(-V // pad) * pad, device.type)
    print(
        f"head fwd+bwd {rows} x {V:,} x {C} on {device}, pad {pad}, {chunk} rows a chunk ({label}): {best * 1000:,.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=2048)
    args = parser.parse_args()
    device, cpu_elements = torch.device(args.device), head.HEAD_CHUNK_ELEMENTS
    bench(device, args.rows, 1, cpu_elements, "CPU sizing, unpadded")
    bench(device, args.rows, 64, cpu_elements, "CPU sizing, padded to 50,304")
    bench(device, args.rows, 1, 2**27, "GPU sizing")


if __name__ == "__main__":
    main()
