# python benchmarks/gpu_check.py --out DIR [--deadline-s 480] [--rehearse]   (one CUDA GPU; skips elsewhere unless --rehearse)
"""A device check in one command: the CUDA paths of tiecli that CPU tests cannot reach, with throughput and MFU.

Phases, most wanted first, each written to DIR/check.json as soon as it ends (and the run directories,
without checkpoints, to DIR/runs.tar.xz), all under one deadline (--deadline-s): a phase that would
start past it is recorded as skipped, an in-process one that runs past it is stopped, so a call that
the device tool would kill at its limit still returns every figure measured so far.

1. env: GPU, torch, the measured bf16 matmul peak (MFU is given against it and against the datasheet);
2. the fused head (head.linear_cross_entropy) against F.cross_entropy on GPT-2's shape (50,257 x 768)
   under bf16 autocast, loss and gradients; and compiled against eager, at 4 chunks of this device's
   size (traced into the graph) and at HEAD_GRAPH_MAX_CHUNKS + 4 (the tiecli::fused_head operator);
3. GPT-2 small (`tiecli train model=gpt2 tokenizer=gpt2`, compile, bf16, lr 6e-4) at 16 x 1024 tokens a
   step: steady tokens/s (the median of metrics.jsonl's intervals after WARM_STEPS: the compile, the
   evaluations and the checkpoint saves are outside train/loop.py's clock), MFU, compile time (the steps'
   time beyond the steady rate), peak memory and dynamo's recompiles;
4. a nanoGPT-style reference step (benchmarks/throughput.py's, compiled, bf16, fused AdamW) at the same shape;
5. the same GPT-2 untied;
6. `tiecli train --nproc 1` (torchrun, NCCL, DDP, compiled): two straight runs of 40 steps (their
   difference is the noise floor: flash attention's and the embedding's backward are not deterministic
   on CUDA) and 20 steps + a resume to 40, which must stay within RESUME_FACTOR x that floor;
7. GPT-2 tied with diagnostics off (their cost), and 8. eager (compile's gain);
9. the scaled, tied_bias and hybrid modes, one compiled training step each, against eager;
10. `device=cuda:N` past the last GPU: refused in one line.

--rehearse runs every phase on the CPU at tiny sizes and a few steps (tests/test_device_kit.py), so
the first device call is not the first run of this code. Without CUDA and without --rehearse it prints
"skipped, no CUDA device" and exits 0, so CPU CI can call it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "device"))
from figures import (  # noqa: E402  (benchmarks/ is not a package)
    PEAK_TFLOPS,  # noqa: F401  (the tests read the figures through this module)
    WARM_STEPS,
    compile_seconds,
    datasheet_peak,
    flops_per_token,
    mfu,
    peak_memory_gib,
    print_table,
    recompiles,
    rel,
    run_names,
    steady_tokens_per_s,
)
from kit import Deadline, guarded, pack_runs, write_json  # noqa: E402

RESUME_FACTOR = 3.0  # stopped-and-resumed may differ from straight by this many times two straight runs' spread
RESUME_ABS = 1e-6  # plus this, so a deterministic device (floor 0) still allows nothing beyond rounding
HEAD_LOSS_TOL, HEAD_GRAD_TOL = 2e-3, 2e-2  # relative; bf16 matmuls on both sides, in another order
MODE_LOSS_TOL = 2e-2  # compiled vs eager loss of one step, relative, under bf16
QUIET = ["eval.test=false", "diag.snapshots=false", "train.checkpoints=1"]
GPT2 = ["model=gpt2", "tokenizer=gpt2", "compile=true", "dtype=bf16", "train.batch_size=16", "train.max_steps=150"]
GPT2 += ["train.warmup_steps=20", "train.log_interval=10", "train.evals=1", "train.eval_batches=4"]
GPT2 += ["train.lr=6e-4", "train.min_lr=6e-5"]  # GPT-2 small's rate; the CPU default 3e-3 is for tiny models
NO_DIAG = ["diag.every=0", "diag.geometry=false"]
RESUME = ["model=small", "train.lr=1e-3", "train.min_lr=1e-3", "train.warmup_steps=5", "compile=true"]
RESUME += ["train.evals=1", "train.eval_batches=4", "train.checkpoint_interval=20", "eval.test=false"]
RESUME += ["diag.snapshots=false"]


@dataclass
class Plan:
    """What each phase runs: the GPU's sizes, or the rehearsal's tiny ones on the CPU."""

    device: str = "cuda"
    gpt2: list[str] = field(default_factory=lambda: list(GPT2))
    resume: list[str] | None = None  # None: RESUME
    warm_steps: int = WARM_STEPS
    dtype: str = "bf16"
    head_shape: tuple[int, int] = (50257, 768)
    modes_shape: tuple[str, ...] = ("model=small", "tokenizer=gpt2")
    modes: tuple[str, ...] = ("scaled", "tied_bias", "hybrid")
    reference: tuple[int, ...] = (12, 768, 1024, 50304, 16)  # n_layer, n_embd, block, vocab, batch: GPT-2 small
    reference_steps: int = 30


def rehearsal(data: list[str]) -> Plan:
    """Every phase on the CPU in seconds: a nano model on 32-token windows of byte tokens, a few steps."""
    tiny = ["model=nano", "model.block_size=32", "tokenizer=bytes", "train.batch_size=4", "device=cpu", *data]
    gpt2 = [*tiny, "compile=false", "dtype=fp32", "train.max_steps=12", "train.warmup_steps=2"]
    gpt2 += ["train.log_interval=2", "train.evals=1", "train.eval_batches=1"]
    resume = [*tiny, "compile=false", "dtype=fp32", "train.lr=1e-3", "train.min_lr=1e-3", "train.warmup_steps=2"]
    resume += ["train.evals=1", "train.eval_batches=1", "train.checkpoint_interval=20", "eval.test=false"]
    resume += ["diag.snapshots=false"]
    shape = ("model=nano", "tokenizer=bytes", "model.block_size=32", "device=cpu")
    return Plan("cpu", gpt2, resume, 4, "fp32", (97, 32), shape, ("hybrid",), (2, 64, 32, 256, 4), 4)


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


def throughput_row(
    check: str, runs: Path, name: str, peak_tflops: float, plan: Plan | None = None, compiled: bool = True
) -> dict:
    plan = plan or Plan()
    run = runs / name
    summary = json.loads((run / "summary.json").read_text())
    m = _yaml(run / "config.yaml")["model"]
    fpt = flops_per_token(
        m["n_layer"], m["n_embd"], m["block_size"], summary["corpus"]["vocab_size"], summary["params"]["non_embedding"]
    )
    steady = steady_tokens_per_s(run / "metrics.jsonl", plan.warm_steps)
    return {
        "check": check,
        "ok": summary["status"] == "completed" and summary["dtype"] == plan.dtype and summary["compile"] is compiled,
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


def gpt2_row(runs: Path, name: str, check: str, extra: list[str], plan: Plan, peak: float, deadline: Deadline) -> dict:
    """One GPT-2 run (tied, untied, diagnostics off or eager) and its throughput figures."""
    given = {o.split("=")[0] for o in extra}
    args = [o for o in [*plan.gpt2, *QUIET] if o.split("=")[0] not in given] + extra
    tiecli(runs, name, "train", *args, timeout=deadline.timeout(240))
    return throughput_row(check, runs, name, peak, plan, compiled="compile=false" not in args)


def max_weight_diff(a: Path, b: Path) -> tuple[float, bool]:
    """The largest absolute difference of any weight in two runs' last.pt, and whether all are bitwise equal."""
    wa = torch.load(a / "checkpoints" / "last.pt", weights_only=True)["model"]
    wb = torch.load(b / "checkpoints" / "last.pt", weights_only=True)["model"]
    diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    return diff, all(torch.equal(wa[k], wb[k]) for k in wa)


def resume_row(
    runs: Path, names: dict[str, str], check: str, deadline: Deadline | None = None, resume: list[str] | None = None
) -> dict:
    """Under torchrun (--nproc 1: NCCL, DDP, compiled): two straight runs of 40 steps, whose spread is the
    noise floor, and 20 steps, a stop and a resume to 40, which must stay within RESUME_FACTOR x it."""
    deadline, resume = deadline or Deadline(3600), resume or RESUME
    straight, again, resumed = names[check], names[check] + "-again", names[check] + "-resumed"
    for name, steps in ((straight, 40), (again, 40), (resumed, 20)):
        tiecli(runs, name, "train", "--nproc", "1", *resume, f"train.max_steps={steps}", timeout=deadline.timeout(300))
    tiecli(runs, resumed, "train", "--nproc", "1", "--resume", "train.max_steps=40", timeout=deadline.timeout(300))
    floor, _ = max_weight_diff(runs / straight, runs / again)
    diff, bitwise = max_weight_diff(runs / straight, runs / resumed)
    summary = json.loads((runs / resumed / "summary.json").read_text())
    tolerance = RESUME_FACTOR * floor + RESUME_ABS
    return {
        "check": check,
        "ok": diff <= tolerance and summary["status"] == "completed" and summary["step"] == 40,
        "max_weight_diff": diff,
        "noise_floor": floor,
        "bitwise_equal": bitwise,
        "tolerance": tolerance,
        "world_size": summary["world_size"],
    }


# --- in-process checks -------------------------------------------------------------------------------


def head_sizes(device: str, V: int) -> dict[str, int]:
    """Rows for the two head paths on this device: 4 chunks (traced into the graph) and
    HEAD_GRAPH_MAX_CHUNKS + 4 (the tiecli::fused_head operator), at the chunk size head.py uses here."""
    from tiecli.model import head

    pad = head.HEAD_PAD.get(torch.device(device).type, 1)
    rows = head._chunk_rows(2**40, -(-V // pad) * pad, torch.device(device).type)
    return {"traced": 4 * rows, "operator": (head.HEAD_GRAPH_MAX_CHUNKS + 4) * rows}


def head_rows(device: str = "cuda", V: int = 50257, C: int = 768, sizes: dict[str, int] | None = None) -> list[dict]:
    """The fused head at GPT-2's shape (V, C) under bf16: against F.cross_entropy, and compiled against eager."""
    from tiecli.model import head
    from tiecli.model.head import linear_cross_entropy

    sizes = sizes or head_sizes(device, V)
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
    pad = head.HEAD_PAD.get(torch.device(device).type, 1)
    for path, n in sizes.items():
        chunks = -(-n // head._chunk_rows(n, -(-V // pad) * pad, torch.device(device).type))
        on_path = (chunks > head.HEAD_GRAPH_MAX_CHUNKS) == (path == "operator")
        h = torch.randn(n, C, device=device, generator=g)
        y = torch.randint(0, V, (n,), device=device, generator=g)
        eager = loss_and_grads(linear_cross_entropy, h, y)
        compiled = loss_and_grads(torch.compile(linear_cross_entropy, fullgraph=True, dynamic=False), h, y)
        pairs = {"F.cross_entropy": (eager, loss_and_grads(plain, h, y)), f"eager ({path})": (compiled, eager)}
        for reference, (got, want) in pairs.items():
            errs = [rel(a, b) for a, b in zip(got, want)]
            rows.append({
                "check": f"fused head {n} rows: " + ("eager vs " if reference.startswith("F.") else "compiled vs ") + reference,
                "ok": on_path and errs[0] <= HEAD_LOSS_TOL and max(errs[1:]) <= HEAD_GRAD_TOL,
                "chunks": chunks, "loss_rel_err": errs[0], "grad_h_rel_err": errs[1], "grad_w_rel_err": errs[2],
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
    from tiecli.model.gpt import GPT
    from tiecli.runtime.device import compile_step

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


def reference_row(plan: Plan, peak_tflops: float) -> dict:
    """benchmarks/throughput.py's nanoGPT-style step (full logits, F.cross_entropy, AdamW fused on CUDA),
    compiled under bf16 autocast, at GPT-2 small's shape: the bar tiecli's own step is held to."""
    sys.path.insert(0, str(Path(__file__).parent))
    import throughput

    throughput.DEVICE = torch.device(plan.device)
    throughput.CONFIGS["gpu_check"] = plan.reference
    L, C, T, V, B = plan.reference
    seconds = throughput.timed(throughput.reference("gpu_check", compiled=True), plan.reference_steps)
    fpt = flops_per_token(L, C, T, V, 12 * L * C * C + T * C)  # 12 L C^2 in the blocks' matmuls; positions
    tokens_per_s = B * T / seconds
    return {
        "check": "nanoGPT-style reference, compile + bf16, fused AdamW",
        "ok": True,
        "steady_tokens_per_s": round(tokens_per_s),
        "mfu_pct": round(100 * mfu(fpt, tokens_per_s, peak_tflops), 1),
        "ms_per_step": round(1000 * seconds, 1),
    }


def refusal_row(runs: Path, device: str = "cuda") -> dict:
    """device=cuda:N one past the last GPU: one line, a non-zero exit (2 on CUDA), nothing written."""
    bad = f"cuda:{torch.cuda.device_count()}"
    done = subprocess.run(
        [sys.executable, "-m", "tiecli", "train", f"device={bad}", "model=nano", "--runs-dir", str(runs / "refused")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines() + done.stderr.strip().splitlines()
    code = done.returncode == 2 if device == "cuda" else done.returncode != 0
    ok = code and len(lines) == 1 and bad in lines[0] and not (runs / "refused").exists()
    return {"check": f"device={bad} refused", "ok": ok, "message": " ".join(lines)[:200]}


# --- the report ------------------------------------------------------------------------------------------


def matmul_tflops(device: str = "cuda", n: int = 8192, repeats: int = 20) -> float:
    """Measured bf16 matmul throughput, TFLOP/s: the mean of `repeats` products after three warm-ups."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def env_row(plan: Plan) -> dict:
    measured = matmul_tflops(plan.device, *((8192, 20) if plan.device == "cuda" else (512, 3)))
    sheet, key = datasheet_peak()
    row = {"check": "environment", "ok": True, "device": plan.device, "torch": torch.__version__}
    row |= {"python": sys.version.split()[0], "matmul_bf16_tflops": round(measured, 3)}
    if plan.device == "cuda":
        row |= {
            "gpu": torch.cuda.get_device_name(),
            "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
        }
        row |= {"datasheet_bf16_tflops": sheet, "datasheet": key}
    return row


def phases(runs: Path, plan: Plan, deadline: Deadline, peak: list[float]) -> list[tuple[str, Callable, float]]:
    """(check, rows, least seconds) in the order they run: the figures most wanted first."""
    names = dict(zip(CHECKS, run_names(CHECKS)))

    def gpt2(check: str, extra: list[str]) -> Callable[[], list[dict]]:
        return lambda: [gpt2_row(runs, names[check], check, extra, plan, peak[0], deadline)]

    def resume() -> list[dict]:
        return [resume_row(runs, names, CHECKS[4], deadline, plan.resume)]

    if plan.device == "cpu":  # the rehearsal's tiny head in chunks of 6 rows, so both paths run in seconds
        from tiecli.model import head

        head.HEAD_CHUNK_ELEMENTS, head.HEAD_CHUNK_MIN_ROWS = 6 * plan.head_shape[0], 1
    return [
        ("fused head", lambda: head_rows(plan.device, *plan.head_shape), 60),
        (CHECKS[0], gpt2(CHECKS[0], []), 90),
        ("reference", lambda: [reference_row(plan, peak[0])], 60),
        (CHECKS[1], gpt2(CHECKS[1], ["tying=untied"]), 90),
        (CHECKS[4], resume, 90),
        (CHECKS[2], gpt2(CHECKS[2], NO_DIAG), 45),
        (CHECKS[3], gpt2(CHECKS[3], ["compile=false"]), 45),
        ("tying modes compiled", lambda: mode_rows(plan.device, plan.modes_shape, plan.modes), 60),
        ("device refusal", lambda: [refusal_row(runs, plan.device)], 10),
    ]


CHECKS = [
    "gpt2 tied bf16 compile",
    "gpt2 untied bf16 compile",
    "gpt2 tied bf16 compile, diagnostics off",
    "gpt2 tied bf16 eager",
    "torchrun --nproc 1 resume 20+20 vs 40",
]


def run_checks(out: Path, runs: Path, plan: Plan, deadline: Deadline) -> dict:
    """Every phase in order, check.json and runs.tar.xz rewritten after each."""
    report: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rehearsal": plan.device != "cuda"}
    env = guarded("environment", lambda: [env_row(plan)], deadline, least=5)[0]
    peak = [env.get("datasheet_bf16_tflops") or env.get("matmul_bf16_tflops") or 1.0]
    report["rows"] = [env]
    write_json(out / "check.json", report)
    for check, fn, least in phases(runs, plan, deadline, peak):
        report["rows"] += guarded(check, fn, deadline, least)
        if any(row.get("diagnostics_cost_pct") is None and row["check"] == CHECKS[2] for row in report["rows"]):
            add_costs(report["rows"])
        write_json(out / "check.json", report)
        pack_runs(runs, out / "runs.tar.xz")
        print_table(report["rows"][-1:])
        sys.stdout.flush()
    return report


def add_costs(rows: list[dict]) -> None:
    """diagnostics' cost (tied on against off) and compile's gain (compiled against eager), once both are in."""
    by = {r["check"]: r for r in rows if "steady_tokens_per_s" in r}
    on, off, eager = by.get(CHECKS[0]), by.get(CHECKS[2]), by.get(CHECKS[3])
    if on and off:
        off["diagnostics_cost_pct"] = round(100 * (1 - on["steady_tokens_per_s"] / off["steady_tokens_per_s"]), 1)
    if on and eager:
        eager["compile_speedup"] = round(on["steady_tokens_per_s"] / eager["steady_tokens_per_s"], 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for check.json and runs.tar.xz")
    parser.add_argument("--runs-dir", type=Path, help="keep the run directories here (default: a temporary folder)")
    parser.add_argument("--deadline-s", type=float, default=480, help="every phase ends within this (default 480 s)")
    parser.add_argument("--rehearse", action="store_true", help="every phase on the CPU at tiny sizes")
    parser.add_argument("--data", nargs="*", default=[], help="data overrides for the rehearsal's runs")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.rehearse:
        print(f"gpu_check: skipped, no CUDA device (torch {torch.__version__}); run it on a GPU machine")
        return 0
    plan = rehearsal(args.data) if args.rehearse else Plan()
    deadline = Deadline(args.deadline_s)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiecli-gpu-check-") as tmp:
        runs = args.runs_dir or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        report = run_checks(args.out, runs, plan, deadline)
    print(f"written to {args.out / 'check.json'}")
    return 0 if all(row["ok"] is not False for row in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
