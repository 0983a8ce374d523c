# python benchmarks/threads.py [--busy 1] [--steps 20] [--rounds 2] [--idle]
"""Torch threads on a shared CPU: a nano training step's tokens/s at torch's default threads and at 1,
while other processes keep some cores busy; what tiecli.runtime.device's choice picks under that load.

--busy N starts N processes that each spin on a core (a pure Python loop, the simplest other job that
always wants its core), waits a second for them to be scheduled, then times, interleaved over
--rounds (the best of each kept, since a shared machine drifts), --steps optimizer steps of the nano
model (2 x 64, bpe vocab 4096, block 128, batch 16; eager fp32, as a 100-step `tiecli train
model=nano` runs) at each thread count. --idle also times them without the spinning processes.
An OpenMP thread whose core another process holds stalls the others at every barrier; this measures
how much that costs, which is why tiecli counts only free cores.
"""

import argparse
import multiprocessing
import os
import time

import torch

from tiecli.config.checks import to_config
from tiecli.config.compose import compose
from tiecli.model.gpt import GPT
from tiecli.runtime import device as runtime
from tiecli.train.optim import make_optimizer


def spin() -> None:
    while True:
        pass


def tokens_per_s(threads: int, steps: int) -> float:
    """Tokens a second over `steps` optimizer steps of the nano model on `threads` torch threads."""
    torch.set_num_threads(threads)
    c = to_config(compose(["model=nano", "compile=false", "dtype=fp32"])[0])
    model = GPT(c.model, seed=0)
    optimizer = make_optimizer(model, c.train, torch.device("cpu"))
    tokens = torch.randint(c.model.vocab_size, (c.train.batch_size, c.model.block_size + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]  # (B, T) each

    def step() -> None:
        model(x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocation
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * c.tokens_per_step / (time.perf_counter() - start)


def measure(counts: list[int], steps: int, rounds: int) -> dict[int, float]:
    best: dict[int, float] = {}
    for _ in range(rounds):
        for n in counts:
            best[n] = max(best.get(n, 0.0), tokens_per_s(n, steps))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="spinning processes sharing the cores")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle", action="store_true", help="also time without the spinning processes")
    args = parser.parse_args()
    cpus = runtime.affinity()
    default = torch.get_num_threads()
    counts = sorted({default, 1}, reverse=True)
    print(f"torch {torch.__version__}, {len(cpus)} CPUs in this process's affinity, torch default {default} threads")
    if args.idle:
        print(f"no spinning process ({runtime.busy_cores(cpus) or 0:.1f} cores busy with other work before timing):")
        for n, tps in measure(counts, args.steps, args.rounds).items():
            print(f"  {n} thread(s): {tps:,.0f} tokens/s")
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        time.sleep(1.0)
        busy = runtime.busy_cores(cpus)
        picked = runtime.pick_threads(len(cpus), busy, default)
        print(f"{args.busy} spinning process(es); {busy or 0:.1f} cores busy; tiecli's choice: {picked} thread(s)")
        for n, tps in measure(counts, args.steps, args.rounds).items():
            print(f"  {n} thread(s): {tps:,.0f} tokens/s")
    finally:
        for p in spinners:
            p.kill()


if __name__ == "__main__":
    if os.environ.get("OMP_NUM_THREADS"):
        print("note: OMP_NUM_THREADS is set, so torch's default count below is that, not the cores'")
    main()
