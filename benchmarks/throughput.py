# python benchmarks/throughput.py [--configs a,b,default] [--steps 10] [--rounds 2] [--defaults] [--startup] [--geometry]
"""The speed report: tiecli's training step against a plain nanoGPT-style step, on this machine.

For each config, in one process, interleaved over --rounds (the best tokens/s of each is kept,
since a shared machine's speed drifts by more than the differences measured):
  ref fp32     a plain nanoGPT step written here: eager fp32, nn.Linear head tied to the embedding,
               F.cross_entropy on the full (B*T, V) logits, AdamW (fused on CUDA, as nanoGPT), clipping;
  ref c+bf16   the same step under torch.compile and bf16 autocast;
  tiecli       the step tiecli.train.loop.fit runs, as `tiecli train` sets it up for a long run:
               compile and dtype resolved by tiecli.runtime.device's `auto` rules, the fused head,
               fused AdamW, the gradient split; tied and untied.
Configs: a = 4x128, block 128, vocab 8192, batch 16; b = 6x384, block 256, vocab 50304, batch 8;
default = tiecli's default model (micro: 4x128, block 128, bpe vocab 4096, batch 16).

Reported: tokens/s, MFU (model FLOPs per token, 6N + attention, times tokens/s, over the measured
matmul peak of the dtype the variant computes in), a step's memory (its peak above the level between
steps; CUDA: max_memory_allocated, CPU: the RSS of a fresh process), and each target as a ratio.
--defaults times tiecli's step at the default model in fp32/bf16, eager/compiled, with the compile
time, which is what compile: auto and dtype: auto follow. --startup times `tiecli train`'s first step
in a fresh process with warm caches, uncompiled and compiled. --geometry times one geometry pass
at GPT-2's vocabulary and width.
Runs unchanged on CUDA (device: cuda when available).
"""

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tiecli.config.checks import to_config
from tiecli.config.compose import compose
from tiecli.config.schema import GPTConfig
from tiecli.data import tokenizer
from tiecli.data.pairs import form_pairs
from tiecli.measure import diagnostics
from tiecli.model.gpt import GPT, Embeddings
from tiecli.runtime import device as runtime
from tiecli.train.optim import make_optimizer

CONFIGS = {  # n_layer, n_embd, block, vocab, batch
    "a": (4, 128, 128, 8192, 16),
    "b": (6, 384, 256, 50304, 8),
    "default": (4, 128, 128, 4096, 16),
}
DEVICE = runtime.pick_device("auto")


# ---- the plain nanoGPT-style reference -------------------------------------------------------
class RefBlock(nn.Module):
    def __init__(self, C: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class RefGPT(nn.Module):
    def __init__(self, L: int, C: int, T: int, V: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(RefBlock(C, max(1, C // 64)) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V): the whole thing
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# ---- the variants -----------------------------------------------------------------------------
@dataclass
class Variant:
    name: str
    dtype: str  # what its matmuls compute in: fp32 or bf16
    step: Callable[[], None]  # one optimizer step on the next batch
    diag_call: Callable[[], float] | None = None  # seconds of one gradient-statistics call (tiecli only)


def batches(V: int, T: int, B: int, n: int):
    g = torch.Generator().manual_seed(0)
    data = torch.randint(V, (n, B, T + 1), generator=g)
    return [(d[:, :-1].to(DEVICE), d[:, 1:].to(DEVICE)) for d in data]


def reference(cfg: str, compiled: bool) -> Variant:
    L, C, T, V, B = CONFIGS[cfg]
    torch.manual_seed(0)
    model = RefGPT(L, C, T, V).to(DEVICE)
    # nanoGPT's own choice: fused AdamW where CUDA has it; unfused on the CPU, as the CPU figures were measured
    fused = DEVICE.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=fused, foreach=False)
    forward = torch.compile(model) if compiled else model
    autocast = runtime.autocast_for(DEVICE, "bf16" if compiled else "fp32")
    step = train_step(model, forward, opt, autocast, batches(V, T, B, 8))
    return Variant("ref c+bf16" if compiled else "ref fp32", "bf16" if compiled else "fp32", step)


def train_step(model, forward, opt, autocast, data, after=lambda: None):
    """One optimizer step on the next batch of data: forward, backward, clip, step, zero grads, then after()."""
    i = [0]

    def step():
        x, y = data[i[0] % len(data)]
        i[0] += 1
        with autocast():
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        after()

    return step


def tiecli_variant(cfg: str, tying: str = "tied", dtype: str = "auto", compile: str = "auto") -> Variant:
    """tiecli.train.loop.fit's step: forward (compiled per compile: auto for a long run), backward,
    clip, fused AdamW, zero grads and the gradient split's sinks."""
    L, C, T, V, B = CONFIGS[cfg]
    gpt = GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=max(1, C // 64), n_embd=C, tying=tying)
    model = GPT(gpt, seed=0).to(DEVICE)
    opt = make_optimizer(model, to_config(compose([])[0]).train, DEVICE)  # conf/'s defaults
    resolved = runtime.pick_dtype(dtype, DEVICE)
    compiled = runtime.pick_compile(compile, DEVICE, max_steps=100_000)
    forward = runtime.compile_step(model) if compiled else model
    autocast = runtime.autocast_for(DEVICE, resolved)
    data = batches(V, T, B, 8)
    buckets = torch.randint(0, 3, (V,), device=DEVICE)
    step = train_step(model, forward, opt, autocast, data, after=model.emb.clear_split_grads)

    def diag_call():  # after a backward, as fit calls it on a diag step
        x, y = data[0]
        with autocast():
            forward(x, y).backward()
        present = torch.zeros(V, dtype=torch.bool, device=DEVICE)
        present[x.flatten()] = True
        start = time.perf_counter()
        diagnostics.interference(*diagnostics.gradient_paths(model.emb), present, buckets)
        seconds = time.perf_counter() - start
        opt.zero_grad(set_to_none=True)
        model.emb.clear_split_grads()
        return seconds

    name = (
        f"tiecli {tying}"
        if (dtype, compile) == ("auto", "auto")
        else f"tiecli {dtype} {'compiled' if compiled else 'eager'}"
    )
    return Variant(name, resolved, step, diag_call)


# ---- measuring ----------------------------------------------------------------------------------
def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed(v: Variant, steps: int) -> float:
    """Seconds per step over `steps` steps, after one warm-up step."""
    v.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        v.step()
    sync()
    return (time.perf_counter() - start) / steps


def matmul_peak(dtype: torch.dtype, repeats: int = 10) -> float:
    """Best FLOP/s of a few square matmuls in `dtype`: the practical peak, measured rather than quoted."""
    best = 0.0
    for n in (1024, 2048, 4096) if DEVICE.type == "cuda" else (512, 1024, 2048):
        a, b = torch.randn(n, n, device=DEVICE, dtype=dtype), torch.randn(n, n, device=DEVICE, dtype=dtype)
        a @ b
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start))
    return best


def flops_per_token(cfg: str) -> float:
    """6N over the matmul parameters (blocks and the V x C head) plus attention's 12 L T C (PaLM, appendix B)."""
    L, C, T, V, _ = CONFIGS[cfg]
    return 6 * (12 * L * C * C + V * C) + 12 * L * T * C


def peak_memory(cfg: str, variant: str) -> float:
    """A step's memory in MiB: the peak during 3 steps above the level between steps (weights,
    optimizer state and compiled code excluded; activations, logits and gradients counted).
    CUDA: max_memory_allocated here; CPU: the RSS of a fresh process, sampled every millisecond,
    with glibc returning large blocks at once (MALLOC_MMAP_THRESHOLD_) so RSS follows what is live."""
    if DEVICE.type == "cuda":
        v = make(cfg, variant)
        v.step()  # warm-up: compiles, allocates the optimizer state
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for _ in range(3):
            v.step()
        sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, "-P", __file__, "--probe", f"{cfg}:{variant}"]
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.split()[-1])


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_during_steps(v: Variant, steps: int = 3) -> float:
    """Peak RSS in MiB during `steps` steps above the RSS before them, sampled every millisecond."""
    import threading

    base, peak, done = rss_mib(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for _ in range(steps):
        v.step()
    done.set()
    sampler.join()
    return peak[0] - base


def probe(spec: str) -> None:
    """The --probe child: peak RSS during 3 steps above the RSS after a warm-up step, in MiB."""
    cfg, variant = spec.split(":")
    v = make(cfg, variant)
    v.step()
    print(rss_during_steps(v))


def make(cfg: str, variant: str) -> Variant:
    if variant.startswith("ref"):
        return reference(cfg, compiled=variant == "ref_compiled")
    return tiecli_variant(cfg, tying=variant.split("_")[1])


def report(cfg: str, steps: int, rounds: int, peaks: dict) -> None:
    L, C, T, V, B = CONFIGS[cfg]
    keys = ["ref_fp32", "ref_compiled", "tiecli_tied", "tiecli_untied"]
    variants = {k: make(cfg, k) for k in keys}
    best = {k: math.inf for k in keys}
    for _ in range(rounds):  # interleaved: each round runs every variant once
        for k, v in variants.items():
            best[k] = min(best[k], timed(v, steps))
    tps = {k: B * T / s for k, s in best.items()}
    mem = {k: peak_memory(cfg, k) for k in keys}
    diag_call = variants["tiecli_tied"].diag_call
    assert diag_call is not None
    diag = min(diag_call() for _ in range(5))
    print(f"\nconfig {cfg}: {L}x{C}, block {T}, vocab {V}, batch {B} ({B * T} tokens/step)")
    print(f"  {'variant':<16}{'tokens/s':>10}{'ms/step':>9}{'MFU':>7}{'dtype':>7}{'step MiB':>10}")
    for k, v in variants.items():
        mfu = flops_per_token(cfg) * tps[k] / peaks[v.dtype]
        print(f"  {v.name:<16}{tps[k]:>10,.0f}{best[k] * 1e3:>9.1f}{mfu:>7.1%}{v.dtype:>7}{mem[k]:>10,.0f}")
    speedup = tps["tiecli_tied"] / tps["ref_compiled"]
    mfu_tiecli = flops_per_token(cfg) * tps["tiecli_tied"] / peaks[variants["tiecli_tied"].dtype]
    gap = abs(1 - tps["tiecli_untied"] / tps["tiecli_tied"])
    diag_cost = diag / (10 * best["tiecli_tied"])
    print(f"  tiecli / ref c+bf16: {speedup:.2f}x (target >= 1.25x)  {'met' if speedup >= 1.25 else 'MISSED'}")
    print(f"  tiecli / ref c+bf16 step memory: {mem['tiecli_tied'] / mem['ref_compiled']:.2f} (target <= 0.5 at b)")
    print(f"  tiecli MFU: {mfu_tiecli:.1%} of the {variants['tiecli_tied'].dtype} peak (target >= 70% at b)")
    print(f"  tied vs untied: {gap:.1%} apart (target <= 3%)")
    print(f"  diagnostics: {diag * 1e3:.1f} ms a call, {diag_cost:.2%} of the 10 steps of diag.every=10 (target < 2%)")


def defaults_table(steps: int, rounds: int) -> None:
    """What compile: auto and dtype: auto follow: the default model's step, eager and compiled, fp32 and bf16."""
    combos = [("fp32", "false"), ("bf16", "false"), ("fp32", "true"), ("bf16", "true")]
    variants, compile_s = {}, {}
    for dtype, comp in combos:
        variants[(dtype, comp)] = tiecli_variant("default", dtype=dtype, compile=comp)
        start = time.perf_counter()
        variants[(dtype, comp)].step()  # the first step compiles
        sync()
        compile_s[(dtype, comp)] = time.perf_counter() - start
    best = {k: math.inf for k in combos}
    for _ in range(rounds):
        for k in combos:
            best[k] = min(best[k], timed(variants[k], steps))
    _, _, T, _, B = CONFIGS["default"]
    print("\ndefaults (tiecli's step, default model): dtype, compile -> tokens/s, first step (s)")
    for k in combos:
        print(f"  dtype={k[0]:<5} compile={k[1]:<6}{B * T / best[k]:>10,.0f} tok/s  first step {compile_s[k]:6.1f} s")
    for dtype in ("fp32", "bf16"):
        saved = best[(dtype, "false")] - best[(dtype, "true")]
        cost = compile_s[(dtype, "true")] - compile_s[(dtype, "false")]
        n = f"{cost / saved:,.0f} steps" if saved > 0 else "never (compiled is not faster)"
        print(f"  {dtype}: compiling costs {cost:.1f} s, saves {saved * 1e3:.1f} ms a step: repaid after {n}")


def geometry_seconds(mode: str) -> float:
    """One geometry pass over GPT-2-sized token matrices, every token occurring, English form pairs."""
    cfg = GPTConfig(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, block_size=1024, tying=mode)
    torch.manual_seed(0)
    emb, emb0 = Embeddings(cfg), Embeddings(cfg)
    counts = np.random.default_rng(0).zipf(1.3, cfg.vocab_size).clip(1, 10**9)
    buckets = np.random.default_rng(1).integers(0, 3, cfg.vocab_size).astype(np.int8)
    pairs, info = form_pairs(tokenizer.gpt2(), None)
    start = time.perf_counter()
    diagnostics.embedding_geometry(emb, emb0, counts, buckets, pairs, info, seed=0)
    return time.perf_counter() - start


STARTUP = """
import time, sys
t0 = float(sys.argv[1])
from tiecli.train import prepare
from tiecli.config.checks import to_config
from tiecli.config.compose import compose
cfg = to_config(compose(sys.argv[2:])[0])
s = prepare.set_up(cfg)
B, T = cfg.train.batch_size, cfg.model.block_size
batch = torch.from_numpy(s.corpus.tokens['train'][: B * (T + 1)].astype('int64')).view(B, T + 1).to(s.device)
with s.autocast():
    loss = s.forward(batch[:, :-1], batch[:, 1:])
loss.backward()
s.optimizer.step()
print(time.time() - t0)
"""


def startup() -> None:
    """Seconds from `python` starting to the first optimizer step done, in a fresh process, caches warm
    (the second of two runs): imports, config, data from cache, model, compile, first step."""
    print("\nstart-up to the first step (fresh process, warm caches):")
    for comp in ("false", "true"):
        for _ in range(2):  # the first warms the tokenizer, data and inductor caches
            t0 = time.time()
            out = subprocess.run(
                [sys.executable, "-P", "-c", "import torch\n" + STARTUP, str(t0), f"compile={comp}"],
                capture_output=True,
                text=True,
                check=True,
            )
        print(f"  compile={comp}: {float(out.stdout.split()[-1]):.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="a,b,default")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; the best of each is kept")
    parser.add_argument("--defaults", action="store_true", help="also time the default model's dtype x compile grid")
    parser.add_argument("--startup", action="store_true", help="also time start-up to the first step")
    parser.add_argument("--geometry", action="store_true", help="also time one geometry pass at 50257 x 768")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    runtime.use_compile_cache()
    if args.probe:
        return probe(args.probe)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(
        f"torch {torch.__version__} on {DEVICE} ({torch.get_num_threads()} threads); matmul peak measured: "
        f"fp32 {peaks['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f} GFLOP/s; "
        f"tiecli auto: dtype={runtime.pick_dtype('auto', DEVICE)}, "
        f"compile={runtime.pick_compile('auto', DEVICE, 100_000)} for a long run"
    )
    for cfg in filter(None, args.configs.split(",")):
        report(cfg, args.steps, args.rounds, peaks)
    if args.defaults:
        defaults_table(args.steps, args.rounds)
    if args.startup:
        startup()
    if args.geometry:
        for mode in ("untied", "tied"):
            print(f"geometry pass at 50257 x 768, {mode}: {geometry_seconds(mode):.2f} s")


if __name__ == "__main__":
    main()
