# Used by benchmarks/gpu_check.py and benchmarks/device/study.py: the figures of a device check, from run files.
"""Pure helpers (tests/test_distributed.py runs them on CPU): run names, FLOPs a token and MFU, the steady
rate of a run's metrics.jsonl, the compile time, recompiles, peak memory, the datasheet peaks, the table."""

import json
import re
import statistics
from pathlib import Path

import torch

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
WARM_STEPS = 20  # metrics.jsonl intervals ending at or before this step hold the cold compile: not steady


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


def datasheet_peak() -> tuple[float | None, str]:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    for key, tflops in PEAK_TFLOPS.items():
        if key in name:
            return tflops, key
    return None, ""


def figures(row: dict) -> str:
    """A row's figures in one cell: key=value, floats to 4 significant digits."""
    cells = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k not in ("check", "ok")]
    return " ".join(cells)


def print_table(rows: list[dict]) -> None:
    width = max(len(r["check"]) for r in rows)
    print(f"{'check':{width}}  {'ok':4}  figures")
    for row in rows:
        mark = {True: "yes", False: "NO", None: "skip"}[row["ok"]]
        print(f"{row['check']:{width}}  {mark:4}  {figures(row)}")
