# python benchmarks/gpu_check.py [--out gpu_check.json] [--runs-dir DIR]   (one CUDA GPU, under 8 minutes; skips elsewhere)
"""A device check in one command: the CUDA paths of tiecli that CPU tests cannot reach, with throughput and MFU.

1. the fused head (head.linear_cross_entropy) against F.cross_entropy on GPT-2's shape (50,257 x 768)
   under bf16 autocast, loss and gradients; and compiled against eager, at 8 chunks (traced into the
   graph) and at 16 (the tiecli::fused_head operator);
2. GPT-2 small (`tiecli train model=gpt2 tokenizer=gpt2`, compile, bf16) at a GPU batch of 16 x 1024
   tokens: steady tokens/s (the median of metrics.jsonl's intervals after WARM_STEPS, so the cold
   compile is left out), MFU against the device's dense bf16 peak, the compile time (the step time
   beyond the steady rate), peak memory and dynamo's recompiles; then the same with diagnostics off,
   for their cost;
3. `tiecli train --nproc 1` (torchrun, NCCL, DDP, compiled): 40 steps straight against 20 steps and a
   resume to 40, at a constant learning rate. Embedding backward uses atomic adds on the GPU, so the
   check asks for the final weights to agree to RESUME_TOL and says whether they are bitwise equal;
4. the scaled, tied_bias and hybrid modes, one compiled training step each, against eager;
5. `device=cuda:N` past the last GPU: refused in one line.

Every figure of the train runs comes from the run directories (and their logs) it leaves in --runs-dir.
It prints one table and writes it with every figure as JSON to --out. Without CUDA it prints
"skipped, no CUDA device" and exits 0, so CPU CI can call it.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; the first name found
# in torch.cuda.get_device_name() wins, so "H100 PCIe" comes before "H100" (SXM).
PEAK_TFLOPS = {
    "B200": 2250.0,
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}
RESUME_TOL = 1e-3  # max abs difference of any weight after 40 steps, straight vs stopped and resumed
WARM_STEPS = 20  # metrics.jsonl intervals ending at or before this step hold the cold compile: not steady
HEAD_ROWS = {"traced": 4096, "operator": 8192}  # 8 and 16 chunks of 512 rows at V = 50,257 (head.py)
HEAD_LOSS_TOL, HEAD_GRAD_TOL = 2e-3, 2e-2  # relative; bf16 matmuls on both sides, in another order
MODE_LOSS_TOL = 2e-2  # compiled vs eager loss of one step, relative, under bf16
GPT2 = ["model=gpt2", "tokenizer=gpt2", "compile=true", "dtype=bf16", "train.batch_size=16", "train.max_steps=150"]
GPT2 += ["train.warmup_steps=20", "train.log_interval=10", "train.evals=1", "train.eval_batches=4"]
QUIET = ["eval.test=false", "diag.snapshots=false"]
NO_DIAG = ["diag.every=0", "diag.geometry=false"]
RESUME = ["model=small", "train.lr=1e-3", "train.min_lr=1e-3", "train.warmup_steps=5", "compile=true"]
RESUME += ["train.evals=1", "train.eval_batches=4", "train.checkpoint_interval=20", *QUIET]


# --- pure helpers (tests/test_distributed.py runs them on CPU) -------------------------------------


def run_names(checks: list[str]) -> list[str]:
    """A run name per check, unique by its position, readable from the whole check: "01-gpt2-diag-off"."""
    return [
        f"{i:02d}-" + re.sub(r"[^A-Za-z0-9]+", "-", check).strip("-").lower()[:60] for i, check in enumerate(checks)
    ]


def flops_per_token(n_layer: int, n_embd: int, block_size: int, vocab: int, non_embedding: int) -> float:
    """Training FLOPs per token (PaLM's appendix B, as nanoGPT estimates MFU): 6 x the matmul parameters
    (the blocks and the V x C output matrix) + 12 x layers x width x context for attention."""
    return 6 * (non_embedding + vocab * n_embd) + 12 * n_layer * n_embd * block_size


def mfu(flops_token: float, tokens_per_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: the FLOPs a second the model needs at this rate over the device's peak."""
    return flops_token * tokens_per_s / (peak_tflops * 1e12)


def steady_tokens_per_s(metrics: Path, warm_steps: int = WARM_STEPS) -> float:
    """The median tokens/s of metrics.jsonl's intervals that end after warm_steps (compile and warm-up left out)."""
    rates = [
        row["tokens_per_s"]
        for row in map(json.loads, metrics.read_text().splitlines())
        if row.get("step", 0) > warm_steps and row.get("tokens_per_s")
    ]
    if not rates:
        raise ValueError(f"{metrics} has no tokens/s after step {warm_steps}: run more steps")
    return statistics.median(rates)


def compile_seconds(train_time: float, steps: int, tokens_per_step: int, steady: float) -> float:
    """The training time beyond what the steps take at the steady rate: the cold compile, mostly."""
    return max(0.0, train_time - steps * tokens_per_step / steady)


def recompiles(log: str) -> int:
    """Dynamo's recompilations in a run's log (TORCH_LOGS=recompiles prints one line for each)."""
    return len(re.findall(r"Recompiling function", log))


def peak_memory_gib(summary: dict) -> float | None:
    """The run's peak device memory from summary.json, in GiB, when it records one (in bytes or GiB)."""
    key = next((k for k in summary if "peak" in k and "mem" in k), None)
    value = summary.get(key) if key else None
    if isinstance(value, dict):  # tiecli's own: {"bytes": N, "of": "cuda max_memory_allocated"}
        value = value.get("bytes")
    if not isinstance(value, (int, float)):
        return None
    return value / 2**30 if value > 2**20 else float(value)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| in fp32 (norms over every element)."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# --- running tiecli ---------------------------------------------------------------------------------


def tiecli(runs: Path, name: str, *args: str, timeout: float = 300) -> float:
    """`tiecli ARGS --name NAME --runs-dir RUNS`, its output kept in RUNS/NAME.log; its wall time.
    RuntimeError with the log's tail when it fails."""
    log = runs / f"{name}.log"
    env = {**os.environ, "TORCH_LOGS": "recompiles", "COLUMNS": "200"}
    command = [sys.executable, "-m", "tiecli", *args, "--runs-dir", str(runs), "--name", name]
    start = time.perf_counter()
    with open(log, "a") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"tiecli {' '.join(args)} exited {done.returncode}: {log.read_text()[-1500:]}")
    return time.perf_counter() - start


def throughput_row(check: str, runs: Path, name: str, peak_tflops: float) -> dict:
    run = runs / name
    summary = json.loads((run / "summary.json").read_text())
    m = _yaml(run / "config.yaml")["model"]
    fpt = flops_per_token(
        m["n_layer"], m["n_embd"], m["block_size"], summary["corpus"]["vocab_size"], summary["params"]["non_embedding"]
    )
    steady = steady_tokens_per_s(run / "metrics.jsonl")
    return {
        "check": check,
        "ok": summary["status"] == "completed" and summary["dtype"] == "bf16" and summary["compile"] is True,
        "steps": summary["step"],
        "tokens_per_step": summary["tokens_per_step"],
        "steady_tokens_per_s": round(steady),
        "mfu_pct": round(100 * mfu(fpt, steady, peak_tflops), 1),
        "compile_s": round(
            compile_seconds(summary["train_time"], summary["step"], summary["tokens_per_step"], steady), 1
        ),
        "summary_tokens_per_s": round(summary["tokens_per_s"]),  # with the compile: for comparison only
        "peak_memory_gib": peak_memory_gib(summary),
        "recompiles": recompiles((runs / f"{name}.log").read_text()),
        "final_val_loss": summary["final_val"]["loss"],
    }


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def gpt2_rows(runs: Path, names: dict[str, str], peak_tflops: float) -> list[dict]:
    """GPT-2 small compiled in bf16 with diagnostics on and off; the second row states what they cost."""
    rows = []
    for check, extra in (("gpt2 bf16 compile", []), ("gpt2 bf16 compile, diagnostics off", NO_DIAG)):
        tiecli(runs, names[check], "train", *GPT2, *QUIET, *extra, timeout=240)
        rows.append(throughput_row(check, runs, names[check], peak_tflops))
    on, off = rows[0]["steady_tokens_per_s"], rows[1]["steady_tokens_per_s"]
    rows[1]["diagnostics_cost_pct"] = round(100 * (1 - on / off), 1)
    return rows


def resume_row(runs: Path, names: dict[str, str], check: str) -> dict:
    """Under torchrun (--nproc 1: NCCL, DDP, compiled): 40 steps straight vs 20, a stop, and a resume to 40."""
    straight, resumed = names[check], names[check] + "-resumed"
    tiecli(runs, straight, "train", "--nproc", "1", *RESUME, "train.max_steps=40")
    tiecli(runs, resumed, "train", "--nproc", "1", *RESUME, "train.max_steps=20")
    tiecli(runs, resumed, "train", "--nproc", "1", "--resume", "train.max_steps=40")
    a = torch.load(runs / straight / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(runs / resumed / "checkpoints" / "last.pt", weights_only=True)["model"]
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    summary = json.loads((runs / resumed / "summary.json").read_text())
    return {
        "check": check,
        "ok": diff <= RESUME_TOL and summary["status"] == "completed" and summary["step"] == 40,
        "max_weight_diff": diff,
        "bitwise_equal": all(torch.equal(a[k], b[k]) for k in a),
        "tolerance": RESUME_TOL,
        "world_size": summary["world_size"],
    }


# --- in-process checks -------------------------------------------------------------------------------


def head_rows(device: str = "cuda", V: int = 50257, C: int = 768, sizes: dict[str, int] = HEAD_ROWS) -> list[dict]:
    """The fused head at GPT-2's shape (V, C) under bf16: against F.cross_entropy, and compiled against eager."""
    from tiecli.head import linear_cross_entropy

    g = torch.Generator(device=device).manual_seed(0)
    weight = (0.02 * torch.randn(V, C, device=device, generator=g)).requires_grad_()

    def loss_and_grads(fn: Callable, h: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        h = h.detach().requires_grad_()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = fn(h, weight, y)
        gh, gw = torch.autograd.grad(loss, (h, weight))
        return [loss.detach(), gh, gw]

    def plain(h, w, y):
        return F.cross_entropy(h @ w.t(), y)  # autocast: the matmul in bf16, the softmax in fp32

    rows = []
    for path, n in sizes.items():
        h = torch.randn(n, C, device=device, generator=g)
        y = torch.randint(0, V, (n,), device=device, generator=g)
        eager = loss_and_grads(linear_cross_entropy, h, y)
        compiled = loss_and_grads(torch.compile(linear_cross_entropy, fullgraph=True, dynamic=False), h, y)
        pairs = {"F.cross_entropy": (eager, loss_and_grads(plain, h, y)), f"eager ({path})": (compiled, eager)}
        for reference, (got, want) in pairs.items():
            errs = [rel(a, b) for a, b in zip(got, want)]
            rows.append({
                "check": f"fused head {n} rows: " + ("eager vs " if reference.startswith("F.") else "compiled vs ") + reference,
                "ok": errs[0] <= HEAD_LOSS_TOL and max(errs[1:]) <= HEAD_GRAD_TOL,
                "loss_rel_err": errs[0], "grad_h_rel_err": errs[1], "grad_w_rel_err": errs[2],
            })  # fmt: skip
    return rows


def mode_rows(
    device: str = "cuda",
    shape: tuple[str, ...] = ("model=small", "tokenizer=gpt2"),
    modes: tuple[str, ...] = ("scaled", "tied_bias", "hybrid"),
) -> list[dict]:
    """scaled, tied_bias and hybrid: one compiled training step each, its loss against eager's, finite gradients."""
    from tiecli.config.checks import to_config
    from tiecli.config.compose import compose
    from tiecli.model import GPT
    from tiecli.runtime import compile_step

    rows = []
    for mode in modes:
        cfg = to_config(compose([*shape, f"tying={mode}"])[0]).model
        model = GPT(cfg, seed=0).to(device)
        x, y = (torch.randint(0, cfg.vocab_size, (8, cfg.block_size), device=device) for _ in range(2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            with torch.no_grad():
                eager = model(x, y).item()
            loss = compile_step(model)(x, y)
        loss.backward()
        finite = all(torch.isfinite(p.grad).all().item() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        err = abs(loss.item() - eager) / abs(eager)
        rows.append(
            {"check": f"tying={mode} compiled step", "ok": finite and err <= MODE_LOSS_TOL, "loss_rel_err": err}
        )
    return rows


def refusal_row(runs: Path) -> dict:
    """device=cuda:N one past the last GPU: one line, exit 2, nothing written."""
    bad = f"cuda:{torch.cuda.device_count()}"
    done = subprocess.run(
        [sys.executable, "-m", "tiecli", "train", f"device={bad}", "model=nano", "--runs-dir", str(runs / "refused")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines() + done.stderr.strip().splitlines()
    ok = done.returncode == 2 and len(lines) == 1 and bad in lines[0] and not (runs / "refused").exists()
    return {"check": f"device={bad} refused", "ok": ok, "message": " ".join(lines)[:200]}


# --- the report ------------------------------------------------------------------------------------------


def peak() -> tuple[float, str]:
    name = torch.cuda.get_device_name()
    for key, tflops in PEAK_TFLOPS.items():
        if key in name:
            return tflops, f"datasheet ({key})"
    return matmul_tflops(), "measured bf16 matmul"


def matmul_tflops(n: int = 8192, repeats: int = 20) -> float:
    """Measured bf16 matmul throughput, TFLOP/s: the peak a GPU missing from PEAK_TFLOPS is measured against."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def figures(row: dict) -> str:
    """A row's figures in one cell: key=value, floats to 4 significant digits."""
    cells = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k not in ("check", "ok")]
    return " ".join(cells)


def print_table(rows: list[dict]) -> None:
    width = max(len(r["check"]) for r in rows)
    print(f"{'check':{width}}  {'ok':4}  figures")
    for row in rows:
        print(f"{row['check']:{width}}  {'yes' if row['ok'] else 'NO':4}  {figures(row)}")


def guarded(check: str, fn: Callable[[], list[dict]]) -> list[dict]:
    """fn's rows, or one failed row with its error: one failing check still leaves the others' figures."""
    start = time.perf_counter()
    try:
        rows = fn()
    except Exception as e:
        rows = [{"check": check, "ok": False, "error": " ".join(f"{type(e).__name__}: {e}".split())[-600:]}]
    rows[-1]["wall_s"] = round(time.perf_counter() - start, 1)
    return rows


def run_checks(runs: Path, peak_tflops: float) -> list[dict]:
    checks = ["gpt2 bf16 compile", "gpt2 bf16 compile, diagnostics off", "torchrun --nproc 1 resume 20+20 vs 40"]
    names = dict(zip(checks, run_names(checks)))
    rows = guarded("fused head", head_rows)
    rows += guarded("tying modes compiled", mode_rows)
    rows += guarded(checks[0], lambda: gpt2_rows(runs, names, peak_tflops))
    rows += guarded(checks[2], lambda: [resume_row(runs, names, checks[2])])
    rows += guarded("device refusal", lambda: [refusal_row(runs)])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="JSON file for the table")
    parser.add_argument("--runs-dir", type=Path, help="keep the run directories here (default: a temporary folder)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: skipped, no CUDA device (torch {torch.__version__}); run it on a GPU machine")
        return 0
    peak_tflops, peak_source = peak()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tiecli-gpu-check-") as tmp:
        runs = args.runs_dir or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        rows = run_checks(runs, peak_tflops)
    report = {
        "gpu": torch.cuda.get_device_name(),
        "peak_bf16_tflops": peak_tflops,
        "peak_source": peak_source,
        "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
        "torch": torch.__version__,
        "wall_s": round(time.perf_counter() - start, 1),
        "rows": rows,
    }
    print(f"{report['gpu']}: bf16 peak {peak_tflops:g} TFLOP/s ({peak_source}), torch {torch.__version__}")
    print_table(rows)
    for row in rows:
        if "compile_s" in row:
            print(f"compile time, {row['check']}: {row['compile_s']} s (the steps' time beyond the steady rate)")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out} in {report['wall_s']} s")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
