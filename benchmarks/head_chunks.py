# python benchmarks/head_chunks.py [--grid b:83:graph,b:512:op,...]
"""How the fused head's chunk size and its place in the compiled graph set a step's time and memory.

Each setting is config:rows:where (configs as in throughput.py; rows of the (B*T, V) logits per
chunk; where = graph, the chunk loop traced into the compiled step, or op, the tiecli::fused_head
operator with each chunk compiled on its own). Each runs in a fresh process: tiecli's tied step
as `tiecli train` sets it up (compiled, bf16 where auto picks it), the first step (compile
included), a step's memory (peak RSS during 3 steps above the RSS after the first, sampled every
millisecond, glibc returning large blocks at once) and the best time a step over 2 rounds of 4.
These figures chose head.py's HEAD_CHUNK_MIN_ROWS and HEAD_GRAPH_MAX_CHUNKS (docs/performance.md).
On a CUDA machine it measures the GPU (HEAD_CHUNK_ELEMENTS_CUDA, docs/performance.md), e.g.
--grid b:512:graph,b:2048:graph; its memory column is then the device's peak allocation a step.
"""

import argparse
import os
import subprocess
import sys
import time

GRID = "b:83:graph,b:83:op,b:128:graph,b:128:op,b:333:graph,b:512:graph,b:512:op,b:667:graph,b:1334:graph,a:512:graph,a:2048:graph"


def one(setting: str) -> None:
    """The child: measure one setting and print its line."""
    sys.path.insert(0, os.path.dirname(__file__))
    import throughput as tp
    import torch

    from tiecli.model import head

    cfg, rows, where = setting.split(":")
    head.HEAD_CHUNK_ELEMENTS, head.HEAD_CHUNK_MIN_ROWS = 0, int(rows)  # exactly `rows` rows a chunk
    head.HEAD_CHUNK_ELEMENTS_CUDA = 0
    head.HEAD_GRAPH_MAX_CHUNKS = 10**6 if where == "graph" else 0
    v = tp.tiecli_variant(cfg, tying="tied")
    start = time.perf_counter()
    v.step()
    first = time.perf_counter() - start
    if tp.DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        v.step()
        torch.cuda.synchronize()
        memory = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        memory = tp.rss_during_steps(v)
    step = min(tp.timed(v, 4) for _ in range(2))
    n = tp.CONFIGS[cfg][2] * tp.CONFIGS[cfg][4]  # rows of the logits: block x batch
    chunks = -(-n // int(rows))
    print(f"  {cfg:<7} {rows:>5} {chunks:>6}  {where:<5} {first:>10.1f} {step * 1000:>9,.0f} {memory:>9,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default=GRID, help=f"comma-separated config:rows:graph|op (default {GRID})")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one)
    print(f"  {'config':<7} {'rows':>5} {'chunks':>6}  {'where':<5} {'first (s)':>10} {'ms/step':>9} {'step MiB':>9}")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    for setting in args.grid.split(","):
        cmd = [sys.executable, "-P", __file__, "--one", setting]
        print(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout, end="", flush=True)


if __name__ == "__main__":
    main()
