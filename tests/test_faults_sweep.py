"""`tiecli sweep` when something around it goes wrong: a broken manifest, a stale pid, a second sweep,
a run another process holds, and a sweep killed outright (kill -9) while its job trains."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY
from helpers import one_line_error, tiecli

from tiecli.run.files import Lock
from tiecli.run.layout import CONFIG, LOCK, MANIFEST
from tiecli.run.reader import RunReader
from tiecli.run.records import read_manifest
from tiecli.sweep import plan

MANIFEST_FIELDS = {
    "name": "bad",
    "created": "2024-01-01T00:00:00+00:00",
    "updated": "2024-01-01T00:00:00+00:00",
    "command": "tiecli sweep seed=0",
    "config_dir": None,
    "study": None,
    "axes": {},
    "fixed": ["seed=0"],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "manifest, why",
    [
        ([], "sweep bad: sweep.json is not a sweep manifest"),
        ({}, "sweep bad: sweep.json is not a sweep manifest"),
        (
            {**MANIFEST_FIELDS, "jobs": [{"overrides": ["seed=0"], "run_dir": "x", "log": "logs/x.log"}]},
            "(no 'name' field)",
        ),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_one_line(isolated, manifest, why):
    path = isolated / "runs" / "sweeps" / "bad" / MANIFEST
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))
    one_line_error(tiecli("sweep", "seed=0", "--name", "bad"), 1, why)
    assert json.loads(path.read_text()) == manifest and sorted(p.name for p in path.parent.iterdir()) == [MANIFEST]


@pytest.mark.slow
def test_a_stale_pid_does_not_block_the_sweep_but_a_running_sweep_does(isolated):
    args = ["sweep", *TINY, "--name", "locked"]
    assert tiecli(*args).exit_code == 0
    path = isolated / "runs" / "sweeps" / "locked" / MANIFEST
    # Manifests used to carry the sweep's pid; pid 1 is alive and was taken for a running sweep.
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": 1}))
    result = tiecli(*args)
    assert result.exit_code == 0 and "1 of 1 jobs already completed" in result.output, result.output
    assert "pid" not in json.loads(path.read_text())

    with Lock(path.parent / LOCK, "another sweep"):  # what a sweep holds while it runs
        before = path.read_bytes()
        one_line_error(tiecli(*args), 1, f"sweep locked is in use by process {os.getpid()}")
        assert path.read_bytes() == before
    assert tiecli(*args).exit_code == 0  # the lock goes with its holder


def test_a_run_another_process_writes_refuses_the_sweep(isolated):
    args = [*TINY, "seed=0,1"]
    folder, manifest, _ = plan.plan(args, None, Path("runs"), "busy")
    run = folder / manifest.jobs[1].run_dir
    run.mkdir(parents=True)
    (run / CONFIG).write_text("seed: 1\n")  # enough to be a run directory; its writer holds the lock
    with Lock(run / LOCK, f"run {run.name}"):
        one_line_error(
            tiecli("sweep", *args, "--name", "busy"),
            1,
            f"sweep busy: run {run.name} is in use by process {os.getpid()}",
        )
    assert not (folder / "logs").exists() and not (folder / MANIFEST).exists()  # refused before anything started


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie (its parent, the killed sweep, is not there to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_sweep_stops_its_trainer_and_a_rerun_resumes_it(isolated):
    args = [
        "sweep",
        *[o for o in TINY if not o.startswith("train.max_steps=")],
        "train.max_steps=30",
        "--name",
        "killed",
    ]
    folder = isolated / "runs" / "sweeps" / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiecli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    trainer = None
    try:
        _wait(lambda: (folder / MANIFEST).exists(), 60, "the manifest")
        job = read_manifest(folder / MANIFEST).jobs[0]
        reader = RunReader(folder / job.run_dir)
        _wait(lambda: [r for r in reader.metrics() if r.step > 0], 120, "the job's first steps")
        trainer = int((reader.path / LOCK).read_text())
        proc.kill()
        proc.wait(10)
        _wait(lambda: _gone(trainer), 15, f"the orphaned trainer {trainer} to stop")
        summary = reader.summary()  # SIGTERM, not SIGKILL: the trainer saved a checkpoint and said so
        assert summary.status == "interrupted" and 0 < summary.step < 30 and not reader.in_use()
    finally:
        proc.kill()
        if trainer and not _gone(trainer):
            os.kill(trainer, signal.SIGKILL)

    result = tiecli(*args)
    assert result.exit_code == 0, result.output
    job = read_manifest(folder / MANIFEST).jobs[0]
    assert (job.state, job.attempts) == ("completed", 2) and reader.summary().step == 30
    log = (folder / job.log).read_text()
    assert "--resume" in log and f"from step {summary.step}" in log
