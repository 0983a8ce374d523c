# python benchmarks/device/study.py --out DIR [--deadline-s 480] [--rehearse]   (called by study.sh)
"""The GPU ladder in one device call: the arms of arms.json not yet done, largest first, as many as fit.

Each arm is one `tiecli train` (model, tying, seed, the file's token budget and learning rate per
size, its common settings and data). Before each, its time is estimated from what earlier calls
measured for that size (arms.json's `done` entries), else from the check's steady tokens/s
(benchmarks/device/check.json, what check.sh returned), else from DEFAULT_TOKENS_PER_S, scaled by
FLOPs a token; an arm that does not fit in what is left of --deadline-s is left for the next call.
After each arm, DIR gets: arms.json (the list with that arm's `done` filled in: copy it over
benchmarks/device/arms.json), study.json (what ran, estimated and measured), runs.tar.xz (the new
run directories without checkpoints) and, at the end, report.md (`tiecli report` over every
finished arm, those committed in benchmarks/device/ladder/ included).

--rehearse runs the same code on the CPU: each size becomes a 2-layer model of its own width on
32-token windows of byte tokens, a few steps, at most --max-arms arms.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import figures
from kit import Deadline, pack_runs, write_json

HERE = Path(__file__).parent
LADDER = HERE / "ladder"  # the finished arms' run directories, committed from earlier calls' runs.tar.xz
SHAPES = {"small": (6, 384), "medium": (8, 512), "gpt2": (12, 768)}  # conf/model: n_layer, n_embd
VOCAB, BLOCK = 50257, 1024
DEFAULT_TOKENS_PER_S = 300_000  # GPT-2 small on one H100/H200 before any check (public figures: 350-550k)
SMALL_MODEL_EFFICIENCY = 0.5  # smaller models reach a lower MFU: their estimate assumes half GPT-2's
OVERHEAD_S = {"gpt2": 150, "medium": 100, "small": 80}  # start-up, corpus, a cold compile, evaluations, the last save
GPT2_CHECKS = ("gpt2 tied bf16 compile", "gpt2 untied bf16 compile")  # gpu_check's rows the rates come from
REHEARSAL = {"gpt2": 64, "medium": 48, "small": 32}  # the rehearsal's width for each size (2 layers, 4 heads)


def flops_per_token(model: str) -> float:
    """Training FLOPs a token at GPT-2's vocabulary and context (figures.flops_per_token, as the check counts them)."""
    L, C = SHAPES[model]
    return figures.flops_per_token(L, C, BLOCK, VOCAB, 12 * L * C * C)


def rates(doc: dict, check: dict | None) -> dict[str, float]:
    """Tokens/s expected of each size: measured by an earlier arm of that size when there is one, else
    the check's GPT-2 rate (or DEFAULT_TOKENS_PER_S) scaled by FLOPs a token and SMALL_MODEL_EFFICIENCY."""
    rows = [] if not check or check.get("rehearsal") else check.get("rows", [])
    compiled = [r["steady_tokens_per_s"] for r in rows if r["check"] in GPT2_CHECKS and r.get("ok")]
    gpt2 = min(compiled, default=DEFAULT_TOKENS_PER_S)  # the slower of tied and untied: the plan must hold for both
    out = {m: gpt2 * flops_per_token("gpt2") / flops_per_token(m) * SMALL_MODEL_EFFICIENCY for m in SHAPES}
    out["gpt2"] = gpt2
    for arm in doc["arms"]:
        done = arm.get("done") or {}
        if done.get("tokens_per_s"):
            out[arm["model"]] = min(done["tokens_per_s"], out[arm["model"]] * 2)
    return out


def estimate(arm: dict, doc: dict, rate: dict[str, float]) -> float:
    """Seconds an arm is expected to take: its tokens at its size's rate, plus start-up, compile and evaluation."""
    measured = [a["done"]["wall_s"] for a in doc["arms"] if a.get("done") and a["model"] == arm["model"]]
    return max(measured) if measured else OVERHEAD_S[arm["model"]] + doc["tokens"][arm["model"]] / rate[arm["model"]]


def arguments(arm: dict, doc: dict, rehearse: bool, data: list[str]) -> list[str]:
    """The arm's `tiecli train` overrides; the rehearsal's tiny shape and budget in place of its size's."""
    lr = doc["lr"][arm["model"]]
    own = [f"tying={arm['tying']}", f"seed={arm['seed']}", f"train.lr={lr}", f"train.min_lr={lr / 10}"]
    if not rehearse:
        return [
            *doc["common"],
            *(data or doc["data"]),
            f"model={arm['model']}",
            f"train.max_tokens={doc['tokens'][arm['model']]}",
            *own,
        ]
    shape = ["model=nano", f"model.n_embd={REHEARSAL[arm['model']]}", "model.block_size=32", "tokenizer=bytes"]
    budget = [
        "train.batch_size=4",
        "train.max_steps=6",
        "train.evals=2",
        "train.eval_batches=1",
        "train.log_interval=2",
    ]
    return [*shape, *budget, "device=cpu", "compile=false", "dtype=fp32", "diag.snapshots=false", *data, *own]


def run_arm(runs: Path, arm: dict, args: list[str], timeout: float) -> dict:
    """`tiecli train ARGS --name ID`: its wall time, tokens/s and final losses, from its log and summary.json."""
    log = runs / f"{arm['id']}.log"
    command = [sys.executable, "-m", "tiecli", "train", *args, "--runs-dir", str(runs), "--name", arm["id"]]
    start = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    wall = round(time.perf_counter() - start, 1)
    if code != 0:
        raise RuntimeError(f"{arm['id']} exited {code}: {log.read_text()[-800:]}")
    summary = json.loads((runs / arm["id"] / "summary.json").read_text())
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": wall,
        "tokens_per_s": round(summary["tokens_per_s"]),
        "final_val_loss": summary["final_val"]["loss"],
        "device": summary["device"],
    }


def study(out: Path, doc: dict, check: dict | None, deadline: Deadline, rehearse: bool, data: list[str], most: int):
    """Run the arms that fit, in the file's order, writing arms.json, study.json and runs.tar.xz after each."""
    rate, log = rates(doc, check), {"rehearsal": rehearse, "rates": {}, "arms": []}
    log["rates"] = {m: round(r) for m, r in rate.items()}
    with tempfile.TemporaryDirectory(prefix="tiecli-study-") as tmp:
        runs, new = Path(tmp) / "runs", Path(tmp) / "new"
        runs.mkdir(), new.mkdir()
        for arm in [a for a in doc["arms"] if not a.get("done")][:most]:
            need = 30 if rehearse else estimate(arm, doc, rate)
            entry = {"id": arm["id"], "estimate_s": round(need), "left_s": round(deadline.left())}
            if need > deadline.left():
                log["arms"].append(entry | {"status": "left for the next call"})
                continue
            try:
                arm["done"] = run_arm(runs, arm, arguments(arm, doc, rehearse, data), deadline.timeout(2 * need))
                entry["status"] = "done"
                shutil.copytree(runs / arm["id"], new / arm["id"], ignore=shutil.ignore_patterns("*.pt"))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                entry |= {"status": "failed", "error": " ".join(str(e).split())[-600:]}
            log["arms"].append(entry)
            write_json(out / "arms.json", doc)
            write_json(out / "study.json", log)
            pack_runs(new, out / "runs.tar.xz")
        write_json(out / "arms.json", doc)
        write_json(out / "study.json", log)
        report(out, runs, rehearse)


def report(out: Path, runs: Path, rehearse: bool) -> None:
    """`tiecli report` over the committed ladder and this call's runs; report.md into out."""
    for old in LADDER.glob("*/summary.json") if not rehearse else []:
        if not (runs / old.parent.name).exists():
            shutil.copytree(old.parent, runs / old.parent.name)
    if not any(runs.glob("*/summary.json")):
        return
    folder = runs.parent / "report"
    done = subprocess.run(
        [sys.executable, "-m", "tiecli", "report", str(runs), "--out", str(folder)], capture_output=True, text=True
    )
    if (folder / "report.md").is_file():
        shutil.copy(folder / "report.md", out / "report.md")
    else:
        (out / "report.md").write_text(f"tiecli report exited {done.returncode}:\n\n{done.stderr[-2000:]}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for arms.json, study.json, runs.tar.xz, report.md"
    )
    parser.add_argument(
        "--arms", type=Path, default=HERE / "arms.json", help="the arm list (default: beside this file)"
    )
    parser.add_argument("--check", type=Path, default=HERE / "check.json", help="check.sh's result, for the rates")
    parser.add_argument("--deadline-s", type=float, default=480, help="every arm ends within this (default 480 s)")
    parser.add_argument("--rehearse", action="store_true", help="the same code on the CPU at tiny sizes")
    parser.add_argument("--data", nargs="*", default=[], help="data overrides in place of the arm list's")
    parser.add_argument("--max-arms", type=int, default=1000, help="run at most this many arms")
    args = parser.parse_args()
    doc = json.loads(args.arms.read_text())
    check = json.loads(args.check.read_text()) if args.check.is_file() else None
    args.out.mkdir(parents=True, exist_ok=True)
    study(args.out, doc, check, Deadline(args.deadline_s), args.rehearse, args.data, args.max_arms)
    print(json.dumps(json.loads((args.out / "study.json").read_text()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
