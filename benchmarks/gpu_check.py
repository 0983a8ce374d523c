# python benchmarks/gpu_check.py [--out gpu_check.json] [--runs-dir DIR]   (a CUDA machine; skips elsewhere)
"""A GPU check that runs in a few minutes: the training paths a GPU uses, with throughput and MFU.

1. `tiecli train model=small` and `model=gpt2 tokenizer=gpt2`, bf16 autocast, torch.compile and
   fused AdamW (what device=auto, dtype=auto and compile=auto pick on CUDA), a few hundred steps;
2. a 1-GPU torchrun run (`tiecli train --nproc 1`): the process group, DDP and NCCL path;
3. resume exactness: 40 steps straight against 20 steps, a stop, and a resume to 40, at a constant
   learning rate (min_lr = lr), so the schedule does not depend on the planned steps. On the GPU,
   embedding backward uses atomic adds, so bitwise equality is not promised: the check passes when the
   final weights agree to RESUME_TOL (max abs difference) and says whether they are bitwise equal;
4. tokens/s of each run (summary.json) and MFU: model FLOPs per token x tokens/s over the GPU's dense
   bf16 peak, from PEAK_TFLOPS when the GPU is listed, else from a measured bf16 matmul.

Every figure comes from the run directories it leaves in --runs-dir. It prints one table and writes
it as JSON to --out. Without CUDA it prints that it skipped and exits 0, so CPU CI can call it.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; the first name in
# torch.cuda.get_device_name() that matches wins, so H100 PCIe comes before H100.
PEAK_TFLOPS = {
    "B200": 2250.0,
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}
RESUME_TOL = 1e-3  # max abs difference of any weight after 40 steps, straight vs stopped and resumed
FAST = ["train.eval_interval=100", "train.eval_batches=4", "eval.test=false", "diag.snapshots=false"]


def tiecli(runs_dir: Path, *args: str) -> float:
    """Run `tiecli ARGS --runs-dir runs_dir`; its wall time. Raises with its stderr's tail if it fails."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tiecli", *args, "--runs-dir", str(runs_dir)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"tiecli {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def matmul_tflops(n: int = 8192, repeats: int = 20) -> float:
    """Measured bf16 matmul throughput, TFLOP/s: the peak a GPU missing from PEAK_TFLOPS is measured against."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def peak() -> tuple[float, str]:
    name = torch.cuda.get_device_name()
    for key, tflops in PEAK_TFLOPS.items():
        if key in name:
            return tflops, f"datasheet ({key})"
    return matmul_tflops(), "measured bf16 matmul"


def flops_per_token(run: Path) -> float:
    """Training FLOPs per token (PaLM's appendix B, as nanoGPT estimates MFU): 6 x the matmul parameters
    (blocks and the V x C output matrix) + 12 x layers x width x context for attention."""
    cfg = OmegaConf.load(run / "config.yaml")
    summary = json.loads((run / "summary.json").read_text())
    vocab = summary["corpus"]["vocab_size"]
    m = cfg.model
    matmul_params = summary["params"]["non_embedding"] + vocab * m.n_embd
    return 6 * matmul_params + 12 * m.n_layer * m.n_embd * m.block_size


def throughput_row(check: str, run: Path, wall: float, peak_tflops: float) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    tps = summary["tokens_per_s"]
    mfu = flops_per_token(run) * tps / (peak_tflops * 1e12)
    return {
        "check": check,
        "ok": summary["status"] == "completed",
        "steps": summary["step"],
        "params": summary["params"]["total"],
        "dtype": summary["dtype"],
        "compile": summary["compile"],
        "world_size": summary.get("world_size", 1),
        "tokens_per_s": round(tps),
        "mfu_pct": round(100 * mfu, 1),
        "final_val_loss": summary["final_val"]["loss"],
        "wall_s": round(wall, 1),
    }


def resume_row(runs: Path) -> dict:
    """40 steps straight vs 20, stop, resume to 40, at a constant learning rate."""
    const = ["model=small", "train.lr=1e-3", "train.min_lr=1e-3", "train.warmup_steps=5", "compile=false", *FAST]
    start = time.perf_counter()
    tiecli(runs, "train", *const, "train.max_steps=40", "train.checkpoint_interval=20", "--name", "straight")
    tiecli(runs, "train", *const, "train.max_steps=20", "train.checkpoint_interval=20", "--name", "resumed")
    tiecli(runs, "train", "--resume", str(runs / "resumed"), "train.max_steps=40")
    a = torch.load(runs / "straight" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(runs / "resumed" / "checkpoints" / "last.pt", weights_only=True)["model"]
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    return {
        "check": "resume 20+20 vs 40 steps",
        "ok": diff <= RESUME_TOL,
        "max_weight_diff": diff,
        "bitwise_equal": all(torch.equal(a[k], b[k]) for k in a),
        "tolerance": RESUME_TOL,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def print_table(rows: list[dict]) -> None:
    keys = [k for k in rows[0] if k != "check"] + sorted({k for r in rows for k in r} - set(rows[0]))
    print(f"{'check':34} " + " ".join(f"{k:>15}" for k in keys))
    for row in rows:
        cells = [row.get(k, "") for k in keys]
        print(f"{row['check']:34} " + " ".join(f"{c:>15.4g}" if isinstance(c, float) else f"{c!s:>15}" for c in cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="JSON file for the table")
    parser.add_argument("--runs-dir", type=Path, help="keep the run directories here (default: a temporary folder)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: skipped, no CUDA device (torch {torch.__version__}); run it on a GPU machine")
        return 0
    peak_tflops, peak_source = peak()
    with tempfile.TemporaryDirectory(prefix="tiecli-gpu-check-") as tmp:
        runs = args.runs_dir or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        rows = []
        for check, run_args in (
            ("train model=small", ["model=small", "train.max_steps=300"]),
            ("train model=gpt2 tokenizer=gpt2", ["model=gpt2", "tokenizer=gpt2", "train.max_steps=200"]),
            ("torchrun --nproc 1, model=small", ["--nproc", "1", "model=small", "train.max_steps=100"]),
        ):
            name = check.split()[-1].replace("=", "-")
            wall = tiecli(runs, "train", *run_args, *FAST, "--name", name)
            rows.append(throughput_row(check, runs / name, wall, peak_tflops))
        rows.append(resume_row(runs))
    report = {
        "gpu": torch.cuda.get_device_name(),
        "peak_bf16_tflops": peak_tflops,
        "peak_source": peak_source,
        "torch": torch.__version__,
        "rows": rows,
    }
    print(f"{report['gpu']}: bf16 peak {peak_tflops:g} TFLOP/s ({peak_source}), torch {torch.__version__}")
    print_table(rows)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
