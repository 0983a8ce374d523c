"""`tiecli train`, `eval` and `geometry` when something goes wrong around a run directory (the fault
cases of the issue "One owner for the run directory"), driven as a user drives them: Typer's runner
in-process (with monkeypatched faults: a full disk, a NaN loss, a signal at a chosen moment) and
real processes (two writers at once, resource limits, Ctrl-C twice, kill -9).

Every case ends in one line on stderr and a clear exit code, and leaves either nothing, or a run whose
summary says what happened and that `--resume` (or a plain re-run, for a run that trained no step)
takes up again.
"""

import errno
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from helpers import tiecli, trained_once

from tiecli.model import checkpoint
from tiecli.model.gpt import GPT
from tiecli.run.files import Lock, atomic_write, read_json, write_json
from tiecli.run.layout import CHECKPOINT, CONFIG, EVAL, GEOMETRY, INIT_CHECKPOINT, LOCK, METRICS, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.writer import RunWriter
from tiecli.train import loop as training

# The tiny config F (each key once: a key given twice is refused), then a short schedule.
F = [
    "model=nano",
    "tokenizer=bytes",
    "data=textfile",
    "data.path=small.txt",
    "data.split=block",
    "model.block_size=32",
    "train.batch_size=8",
]
SHORT = [
    "train.max_steps=8",
    "train.warmup_steps=2",
    "train.eval_interval=4",
    "train.eval_batches=2",
    "train.log_interval=2",
    "train.checkpoint_interval=4",
    "diag.every=0",
    "diag.geometry=false",
]
RUN = [*F, *SHORT]
EVALUATE = training.evaluate  # the original, to put back mid-test


def args(*changes: str) -> list[str]:
    """RUN with some keys given other values (or added)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [a for a in RUN if a.split("=", 1)[0] not in keys] + list(changes)


def catches_sigint(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGINT (the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


def spawn(*argv, **kw) -> subprocess.Popen:
    """A real `tiecli` process in the test's folder (the cache comes through the environment)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tiecli", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def refused(result, code: int, text: str) -> str:
    """Refused before any training: the whole output is one error line, returned."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.startswith("error:") and text in result.output, result.output
    assert result.output.strip().count("\n") == 0, result.output
    return result.output.strip()


def ends_in_error(output: str, text: str) -> str:
    """Training had started (progress lines): the output ends in its one error line, with no traceback."""
    lines = output.strip().splitlines()
    assert "Traceback" not in output and lines, output
    assert lines[-1].startswith("error:") and text in lines[-1], output
    assert sum(line.startswith("error:") for line in lines) == 1, output
    return lines[-1]


def failed(result, code: int, text: str) -> str:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return ends_in_error(result.output, text)


def stopped(result, text: str) -> str:
    """Stopped on request (exit 130): the stop's line, not labelled an error, then the command that resumes."""
    assert result.exit_code == 130, result.output
    lines = result.output.strip().splitlines()
    assert "Traceback" not in result.output and not any(line.startswith("error:") for line in lines), result.output
    assert text in lines[-2] and lines[-1].startswith("resume with: tiecli train --resume runs/X"), result.output
    return lines[-2]


def contents(folder: Path) -> dict[str, bytes]:
    """Every file of a run but its lock, to show a refusal left it untouched."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK
    }


def steps_of(run: Path) -> list[int]:
    return [r.step for r in RunReader(run).metrics()]


def stripped(run: Path) -> list[dict]:
    """metrics.jsonl without the timings, which differ between any two runs."""
    return [{k: v for k, v in r.to_dict().items() if k != "tokens_per_s"} for r in RunReader(run).metrics()]


@pytest.fixture(autouse=True)
def corpus(isolated):
    """small.txt: 60 kB of lines, the same in every test, so the token cache is shared."""
    return write_corpus(isolated)


def write_corpus(folder: Path) -> Path:
    rng = random.Random(0)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "wise",
        "owls",
        "count",
        "stars",
    ]
    (folder / "small.txt").write_text(
        "".join(" ".join(rng.choice(words) for _ in range(8)) + "\n" for _ in range(1500))
    )
    return folder


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A completed run X of RUN, trained once per session in a folder of its own (with small.txt and the
    session's cache, as `isolated` gives a test); tests get copies through `done`."""
    folder = write_corpus(tmp_path_factory.mktemp("faults-trained"))
    return trained_once(folder, tmp_path_factory.getbasetemp() / "cache", RUN, "X")


@pytest.fixture
def done(isolated, trained):
    """A completed run X of RUN (8 steps, checkpoints at 4 and 8): the test's own copy of `trained`."""
    return Path(shutil.copytree(trained, isolated / "runs" / "X"))


# --- 1. two writers on one run --------------------------------------------------------------------


IN_USE = ("run X is in use by process", "created by another process meanwhile", "already exists")


@pytest.mark.slow
def test_two_writers_at_once_one_trains_the_other_is_refused(isolated):
    common = args(
        "train.max_steps=30", "train.eval_interval=10", "train.checkpoint_interval=10", "train.log_interval=5"
    )
    procs = {seed: spawn("train", *common, f"seed={seed}", "--name", "X") for seed in (1, 2)}
    results = {seed: (p.communicate(timeout=240), p.returncode) for seed, p in procs.items()}
    codes = sorted(code for _, code in results.values())
    assert codes == [0, 1], {seed: (code, err[-2000:]) for seed, ((_, err), code) in results.items()}
    (winner,) = [seed for seed, (_, code) in results.items() if code == 0]
    (loser,) = [seed for seed, (_, code) in results.items() if code == 1]
    last = ends_in_error(results[loser][0][1], "")
    assert any(text in last for text in IN_USE), last

    run = isolated / "runs" / "X"
    reader = RunReader(run)
    assert reader.summary().seed == winner and reader.config()["seed"] == winner and reader.status() == "completed"
    text = (run / METRICS).read_text()
    assert text.count('"format"') == 1  # one header: one writer made the file
    steps = steps_of(run)
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 30  # one seed's rows, once each
    assert [p.name for p in (isolated / "runs").iterdir()] == ["X"]  # no temporary folder left


@pytest.mark.slow
def test_a_writer_that_finds_the_run_made_meanwhile_leaves_it_alone(done, monkeypatch):
    """The late side of the race, made certain: the second writer checked before the first had renamed its run into place."""
    before = contents(done)
    monkeypatch.setattr("tiecli.commands.launch.is_run_dir", lambda path: False)  # the check `tiecli train` makes first
    refused(tiecli("train", *args("seed=2"), "--name", "X"), 1, "run 'X' was created by another process meanwhile")
    assert contents(done) == before
    assert [p.name for p in done.parent.iterdir()] == ["X"]


@pytest.mark.slow
def test_geometry_write_refuses_a_run_being_trained(done):
    before = contents(done)
    with Lock(done / LOCK, "run X"):  # what the trainer holds
        refused(tiecli("geometry", done, "--write"), 1, f"run X is in use by process {os.getpid()}")
        assert tiecli("geometry", done).exit_code == 0  # reading needs no lock
    assert contents(done) == before
    assert tiecli("geometry", done, "--write").exit_code == 0
    assert [e.step for e in RunReader(done).geometry()] == [8]


# --- 2. --resume with nothing to resume -------------------------------------------------------------


def test_resume_of_a_completed_run_without_its_checkpoint_touches_nothing(done):
    (done / CHECKPOINT).unlink()
    before = contents(done)
    # Extending it would need last.pt: refused, and the recorded steps, eval.json and config stay.
    refused(
        tiecli("train", *args("train.max_steps=16"), "--name", "X", "--resume"),
        1,
        "run X has no checkpoint (checkpoints/last.pt) to resume from",
    )
    refused(tiecli("train", "--resume", done, "train.max_steps=16"), 1, "has no checkpoint")
    assert contents(done) == before
    # Not extended, it is complete already: said so, and nothing trained again.
    result = tiecli("train", *RUN, "--name", "X", "--resume")
    assert result.exit_code == 0 and "already complete (step 8)" in result.output, result.output
    assert contents(done) == before


def test_resume_of_a_run_that_does_not_exist_creates_nothing(isolated):
    refused(tiecli("train", *RUN, "--name", "nope", "--resume"), 1, "there is no run 'nope'")
    refused(tiecli("train", "--resume", "runs/nope"), 1, "there is no run 'nope'")
    assert not (isolated / "runs").exists()


# --- 3. half-made run directories --------------------------------------------------------------------


def test_block_size_beyond_the_training_split_leaves_nothing(isolated):
    (isolated / "few.txt").write_text("".join(f"line {i} of a short text\n" for i in range(100)))
    refused(
        tiecli("train", *args("data.path=few.txt", "model.block_size=4096"), "--name", "X"), 1, "the train split has"
    )
    assert not (isolated / "runs").exists()


@pytest.mark.slow
def test_a_corpus_of_only_newlines_is_one_line_and_leaves_nothing(isolated):
    (isolated / "blank.txt").write_text("\n" * 5000)
    refused(tiecli("train", *args("data.path=blank.txt"), "--name", "X"), 1, "holds only whitespace")
    (isolated / "same.txt").write_text("\n".join(["    "] * 10) + "\n")
    refused(tiecli("train", *args("data.path=same.txt"), "--name", "X"), 1, "holds only whitespace")
    (isolated / "docs").mkdir()
    for i in range(3):  # whole documents of one character: a training split with one distinct token
        (isolated / "docs" / f"{i}.txt").write_text("a" * 2000)
    refused(
        tiecli("train", *args("data.path=docs", "data.split=document"), "--name", "X"), 1, "holds 1 distinct token(s)"
    )
    assert not (isolated / "runs").exists()


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (6_000_000 * 1024, 6_000_000 * 1024))  # ulimit -v 6000000


@pytest.mark.slow
def test_out_of_memory_is_one_line_and_a_plain_rerun_replaces_the_run(isolated):
    proc = spawn("train", *args("train.batch_size=2000000"), "--name", "X", preexec_fn=limit_memory)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    ends_in_error(err, "out of memory")
    run = isolated / "runs" / "X"
    assert not run.exists() or RunReader(run).status() == "failed"
    result = tiecli("train", *RUN, "--name", "X")  # no --resume: a run that trained no step gives way
    assert result.exit_code == 0, result.output
    assert RunReader(run).summary().status == "completed" and RunReader(run).config()["train"]["batch_size"] == 8


def disk_full(*_args, **_kw):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["rename", "init checkpoint"])
def test_a_full_disk_while_the_run_is_created_leaves_nothing(isolated, monkeypatch, where):
    if where == "rename":
        rename = os.rename

        def full_at_rename(src, dst, *a, **kw):
            if Path(src).name.startswith(".X."):  # the run's temporary folder, renamed into place
                disk_full()
            return rename(src, dst, *a, **kw)

        monkeypatch.setattr(os, "rename", full_at_rename)
    else:
        write = atomic_write
        monkeypatch.setattr(
            "tiecli.run.writer.atomic_write",
            lambda path, data: disk_full() if Path(path).name == "init.pt" else write(path, data),
        )
    refused(tiecli("train", *RUN, "--name", "X"), 1, "No space left on device")
    assert list((isolated / "runs").iterdir()) == []  # neither the run nor its .X.*.tmp folder


def sigterm_at_the_step_0_evaluation(monkeypatch):
    calls = {"n": 0}

    def evaluate(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return EVALUATE(*a, **kw)

    monkeypatch.setattr(training, "evaluate", evaluate)


@pytest.mark.slow
@pytest.mark.parametrize("then", ["resume", "rerun"])
def test_sigterm_before_the_first_step_then_resume_or_rerun(isolated, monkeypatch, then):
    sigterm_at_the_step_0_evaluation(monkeypatch)
    stopped(tiecli("train", *RUN, "--name", "X"), "interrupted at step 0/8")
    run = isolated / "runs" / "X"
    assert RunReader(run).status() == "interrupted" and (run / CHECKPOINT).is_file()
    monkeypatch.setattr(training, "evaluate", EVALUATE)
    result = tiecli("train", *RUN, "--name", "X", *(["--resume"] if then == "resume" else []))
    assert result.exit_code == 0, result.output
    assert RunReader(run).summary().status == "completed" and steps_of(run) == [0, 2, 4, 6, 8]


@pytest.mark.slow
def test_an_extension_stopped_midway_resumes_to_its_new_end(done, monkeypatch):
    """--resume train.max_steps=16 records the new length in config.yaml: a plain --resume after a stop continues to 16."""
    calls = {"n": 0}

    def evaluate(*a, **kw):  # SIGTERM during the evaluation at step 12
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return EVALUATE(*a, **kw)

    monkeypatch.setattr(training, "evaluate", evaluate)
    stopped(tiecli("train", *args("train.max_steps=16"), "--name", "X", "--resume"), "interrupted at step 12/16")
    assert RunReader(done).config()["train"]["max_steps"] == 16
    monkeypatch.setattr(training, "evaluate", EVALUATE)
    result = tiecli("train", "--resume", done)  # no overrides: the run's own config.yaml
    assert result.exit_code == 0, result.output
    summary = RunReader(done).summary()
    assert (summary.status, summary.step, summary.max_steps) == ("completed", 16, 16)
    refused(
        tiecli("train", *args("train.max_steps=20", "train.max_steps=24"), "--name", "X", "--resume"), 2, "given twice"
    )


# --- 4. a NaN loss (the config values are at the end: tiecli/config/ is changing) --------------------------------


def test_a_nan_loss_fails_the_run_and_keeps_the_checkpoint_from_before(isolated, monkeypatch):
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, reduction="mean"):
        out = original(self, idx, targets, reduction)
        if self.training and targets is not None:
            calls["n"] += 1
            if calls["n"] == 5:  # step 5's loss; the log line at step 6 sees it
                out = out * float("nan")
        return out

    monkeypatch.setattr(GPT, "forward", forward)
    line = failed(tiecli("train", *RUN, "--name", "N"), 1, "the training loss became nan by step 6")
    assert "the checkpoint from step 4 is kept" in line
    run = isolated / "runs" / "N"
    summary = RunReader(run).summary()
    assert summary.status == "failed" and "step 6" in summary.error
    ckpt = checkpoint.load(run / CHECKPOINT, "N")
    assert ckpt["state"]["step"] == 4 and all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert steps_of(run) == [0, 2, 4]  # no NaN line in metrics.jsonl either


# --- 5. checkpoints of the wrong structure --------------------------------------------------------------


def empty_checkpoint(run: Path) -> str:
    torch.save({}, run / CHECKPOINT)
    return "is not a tiecli checkpoint (no 'model' entry)"


def wrong_shape(run: Path) -> str:
    ckpt = torch.load(run / CHECKPOINT, weights_only=True)
    ckpt["model"]["emb.wte"] = torch.zeros(256, 65)
    torch.save(ckpt, run / CHECKPOINT)
    return "emb.wte is (256, 65) in its checkpoint but (256, 64) by config.yaml"


def wrong_shape_inside(run: Path) -> str:
    ckpt = torch.load(run / CHECKPOINT, weights_only=True)
    ckpt["model"]["h.1.mlp.c_fc.weight"] = torch.zeros(3, 64)
    torch.save(ckpt, run / CHECKPOINT)
    return "h.1.mlp.c_fc.weight is (3, 64) in its checkpoint but (256, 64) by config.yaml"


def wrong_state(run: Path) -> str:
    ckpt = torch.load(run / CHECKPOINT, weights_only=True)
    ckpt["state"], ckpt["optimizer"] = {"steps": "many"}, {"state": {}}
    torch.save(ckpt, run / CHECKPOINT)
    return "checkpoint last.pt"


def edited_config(run: Path) -> str:
    config = run / CONFIG
    config.write_text(config.read_text().replace("n_embd: 64", "n_embd: 32"))
    return "(256, 32) by config.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("damage", [empty_checkpoint, wrong_shape, wrong_shape_inside, wrong_state, edited_config])
def test_a_checkpoint_of_the_wrong_structure_is_one_line_for_every_command(done, damage):
    text = damage(done)
    extend = ["train.max_steps=12", *(["model.n_embd=32"] if damage is edited_config else [])]
    before = contents(done)
    refused(tiecli("train", *args(*extend), "--name", "X", "--resume"), 1, text)
    refused(tiecli("eval", done), 1, text)
    refused(tiecli("geometry", done), 1, text)
    assert contents(done) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry, value", [("optimizer", {"state": {}}), ("rng", {"torch": "seed"}), ("state", {"step": 8, "steps": 1})]
)
def test_a_checkpoint_whose_training_state_is_foreign_is_one_line_on_resume(done, entry, value):
    ckpt = torch.load(done / CHECKPOINT, weights_only=True)
    ckpt[entry] = value
    torch.save(ckpt, done / CHECKPOINT)
    before = contents(done)
    refused(
        tiecli("train", *args("train.max_steps=12"), "--name", "X", "--resume"),
        1,
        "run X: checkpoint last.pt does not match this run",
    )
    assert contents(done) == before


# --- 6. errors of the operating system -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("where", ["metrics line", "checkpoint"])
def test_a_full_disk_mid_run_is_one_line_and_marks_the_run_failed(isolated, monkeypatch, where):
    if where == "metrics line":
        log, calls = RunWriter.log, {"n": 0}

        def full_log(self, row):
            calls["n"] += 1
            if calls["n"] == 3:  # step 0 and 2 logged; step 4's line finds the disk full
                disk_full()
            return log(self, row)

        monkeypatch.setattr(RunWriter, "log", full_log)
    else:
        write = atomic_write
        monkeypatch.setattr(
            "tiecli.run.writer.atomic_write",
            lambda path, data: disk_full() if Path(path).name == "last.pt" else write(path, data),
        )
    failed(tiecli("train", *RUN, "--name", "X"), 1, "No space left on device")
    run = isolated / "runs" / "X"
    summary = RunReader(run).summary()
    assert summary.status == "failed" and summary.step == 4 and "No space left on device" in summary.error
    assert not list(run.rglob("*.tmp"))


def small_files_only():
    resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))  # ulimit -f: init.pt fits, last.pt does not
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so the write fails with EFBIG instead of killing the process


@pytest.mark.slow
def test_a_file_size_limit_is_one_line_and_marks_the_run_failed(isolated):
    proc = spawn("train", *RUN, "--name", "X", preexec_fn=small_files_only)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    assert ends_in_error(err, os.strerror(errno.EFBIG)).endswith(
        str(Path("runs", "X", "checkpoints", "last.pt"))
    )  # the file named
    run = isolated / "runs" / "X"
    summary = RunReader(run).summary()
    assert summary.status == "failed" and summary.step == 4
    assert not (run / CHECKPOINT).exists() and not list(run.rglob("*.tmp"))


def test_a_read_only_runs_folder_is_one_line(isolated):
    if os.geteuid() == 0:
        pytest.skip(
            "running as root: permission bits do not stop root, so a read-only (0o555) runs folder cannot be made here"
        )
    runs = isolated / "runs"
    runs.mkdir(mode=0o555)
    try:
        refused(tiecli("train", *RUN, "--name", "X"), 1, "Permission denied")
        assert list(runs.iterdir()) == []
    finally:
        runs.chmod(0o755)


@pytest.mark.slow
@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS], ids=["EACCES", "EROFS"])
def test_a_runs_folder_that_refuses_writes_is_one_line(isolated, monkeypatch, code):
    """What a read-only runs folder (or file system) does to the writer, simulated, so it runs as root too."""
    runs = isolated / "runs"
    runs.mkdir()
    mkdtemp = tempfile.mkdtemp

    def refuse(*a, dir=None, **kw):
        if dir is not None and Path(dir) == runs.resolve():
            raise OSError(code, os.strerror(code), str(dir))
        return mkdtemp(*a, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    refused(tiecli("train", *RUN, "--name", "X"), 1, f"{os.strerror(code)}: {runs.resolve()}")
    assert list(runs.iterdir()) == []


@pytest.mark.slow
def test_runs_dir_that_is_a_file_is_one_line(isolated):
    Path("afile").write_text("not a folder\n")
    refused(tiecli("train", *RUN, "--name", "X", "--runs-dir", "afile"), 1, "the runs directory 'afile' is a file")
    refused(tiecli("train", *RUN, "--name", "X", "--runs-dir", "afile/below"), 1, "Not a directory")
    assert Path("afile").read_text() == "not a folder\n"


@pytest.mark.slow
def test_names_and_data_paths_over_255_bytes_are_one_line(isolated):
    refused(tiecli("train", *RUN, "--name", "x" * 256), 1, "longer than 255 bytes")
    refused(tiecli("train", *RUN, "--name", "é" * 128), 1, "longer than 255 bytes")  # 256 bytes in UTF-8
    refused(tiecli("train", *args("data.path=" + "d" * 300 + ".txt")), 1, "cannot be used (File name too long)")
    assert not (isolated / "runs").exists()


def test_data_path_that_cannot_be_read_is_one_line(isolated):
    refused(
        tiecli("train", *args("data.path=/proc/self/mem"), "--name", "X"),
        1,
        "file '/proc/self/mem' cannot be read",
    )
    assert not (isolated / "runs").exists()


@pytest.mark.slow
def test_report_out_that_is_a_file_is_one_line(done):
    Path("afile").write_text("not a folder\n")
    refused(tiecli("report", done.parent, "--out", "afile"), 1, "--out 'afile' is a file, not a folder")
    assert Path("afile").read_text() == "not a folder\n"


# --- 7. temporary files of a killed writer ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_temporaries_of_a_killed_writer_go_at_the_next_open(done, command):
    leftovers = [
        done / "checkpoints" / ".last.pt.abc123.tmp",
        done / ".summary.json.x1y2z3.tmp",
        done / "checkpoints" / "emb" / ".step_4.pt.q.tmp",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a file")
    result = (
        tiecli("eval", done)
        if command == "eval"
        else tiecli("train", *args("train.max_steps=10"), "--name", "X", "--resume")
    )
    assert result.exit_code == 0, result.output
    assert not any(path.exists() for path in leftovers)


# --- 8. Ctrl-C during the final evaluation, and a second Ctrl-C ---------------------------------------------


@pytest.mark.slow
def test_ctrl_c_in_the_final_evaluation_then_resume_only_evaluates(isolated, monkeypatch):
    def evaluate(*a, **kw):
        if kw.get("check") is not None:  # the whole-split evaluation at the end, not the step evaluations
            os.kill(os.getpid(), signal.SIGINT)
        return EVALUATE(*a, **kw)

    monkeypatch.setattr(training, "evaluate", evaluate)
    stopped(tiecli("train", *RUN, "--name", "X"), "interrupted during the final evaluation")
    run = isolated / "runs" / "X"
    reader = RunReader(run)
    assert reader.status() == "interrupted" and reader.summary().step == 8 and not reader.evals()
    rows, last = stripped(run), (run / CHECKPOINT).read_bytes()
    assert checkpoint.load(run / CHECKPOINT, "X")["state"]["step"] == 8

    monkeypatch.setattr(training, "evaluate", EVALUATE)
    result = tiecli("train", *RUN, "--name", "X", "--resume")
    assert result.exit_code == 0, result.output
    assert "resuming X from step 8" in result.output
    assert stripped(run) == rows and (run / CHECKPOINT).read_bytes() == last  # no step trained again
    assert reader.summary().status == "completed" and reader.evals()["val"].step == 8


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(isolated):
    # Long steps (a big batch), so the first Ctrl-C's orderly stop would take seconds.
    run = isolated / "runs" / "X"
    proc = spawn(
        "train",
        *args(
            "model=micro",
            "train.batch_size=1024",
            "train.max_steps=200",
            "train.log_interval=1",
            "train.checkpoint_interval=1",
            "train.eval_interval=100",
        ),
        "--name",
        "X",
    )
    try:
        deadline = time.time() + 180
        while (not (run / CHECKPOINT).exists() or not any(s >= 2 for s in steps_of(run))) and proc.poll() is None:
            assert time.time() < deadline, "timed out waiting for the first steps"
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGINT)
        # The first Ctrl-C's handler puts back the default action, but Python runs handlers only between
        # bytecodes, so a long matmul can hold it back for seconds on a loaded machine: wait until the
        # process no longer catches SIGINT (Linux: SigCgt in /proc/PID/status), then the second kills it.
        deadline = time.time() + 60
        while catches_sigint(proc.pid) and proc.poll() is None:
            assert time.time() < deadline, "the first Ctrl-C's handler never ran"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        sent = time.time()
        proc.communicate(timeout=30)
        assert time.time() - sent < 2.5
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT  # ended by the second Ctrl-C itself, not by an orderly exit (130)
    ckpt = checkpoint.load(run / CHECKPOINT, "X")
    assert ckpt["state"]["step"] >= 1
    assert RunReader(run).status() == "interrupted"
    result = tiecli("runs")
    assert result.exit_code == 0 and "interrupted" in result.output, result.output


# --- 9. kill -9, then --resume: the losses of an uninterrupted run ----------------------------------------------


def _kill_when(proc: subprocess.Popen, condition, seconds: float = 120) -> bool:
    """SIGKILL proc as soon as condition() holds; False if it ended first."""
    deadline = time.time() + seconds
    while proc.poll() is None:
        if condition():
            proc.kill()
            proc.communicate(timeout=30)
            return True
        assert time.time() < deadline, "timed out waiting to kill"
        time.sleep(0.002)
    return False


@pytest.mark.slow
def test_kill_9_at_several_points_then_resume_matches_an_uninterrupted_run(isolated):
    # model=tiny: last.pt is ~33 MB, so it takes a while to write (and fsync), and a kill can land inside it.
    common = args(
        "model=tiny",
        "train.max_steps=24",
        "train.checkpoint_interval=3",
        "train.eval_interval=6",
        "train.log_interval=3",
        "train.warmup_steps=4",
    )
    run = isolated / "runs" / "X"
    ckpts = run / "checkpoints"

    def writing() -> bool:  # last.pt's temporary file exists: a write is under way (or was cut short)
        return ckpts.is_dir() and any(p.name.startswith(".last.pt.") for p in ckpts.iterdir())

    # One thread each: the reference runs alongside, so each process would otherwise pick its count from the load the
    # other makes (runtime.device.pick_threads), and two counts sum in two orders
    one = {"env": {**os.environ, **THREAD}}
    procs = [spawn("train", *common, "--name", "whole", **one)]  # the uninterrupted reference, alongside
    try:
        # After a few steps, between checkpoints (the first at step 3; killed once step 6 is logged).
        procs.append(spawn("train", *common, "--name", "X", **one))
        assert _kill_when(procs[-1], lambda: (run / SUMMARY).exists() and any(s >= 4 for s in steps_of(run)))
        # Then while last.pt is being written, a few times.
        torn = 0
        for _ in range(3):
            procs.append(spawn("train", *common, "--name", "X", "--resume", **one))
            if not _kill_when(procs[-1], writing):
                assert procs[-1].returncode == 0, procs[-1].communicate()[1][-3000:]
                break
            torn += writing()  # the temporary file a killed writer leaves
        assert torn >= 1, "no kill landed while last.pt was being written"
        procs.append(spawn("train", *common, "--name", "X", "--resume", **one))
        for proc in (procs[-1], procs[0]):
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            proc.kill()

    whole = isolated / "runs" / "whole"
    assert stripped(run) == stripped(whole) and steps_of(run) == [0, 3, 6, 9, 12, 15, 18, 21, 24]
    a, b = RunReader(run), RunReader(whole)
    assert a.evals()["val"].loss == b.evals()["val"].loss and a.summary().status == "completed"
    wa = torch.load(run / CHECKPOINT, weights_only=True)["model"]
    wb = torch.load(whole / CHECKPOINT, weights_only=True)["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not list(run.rglob("*.tmp"))


# --- 10. smaller refusals ----------------------------------------------------------------------------------------


def test_an_empty_name_is_refused(isolated):
    refused(tiecli("train", *RUN, "--name", ""), 1, "--name is empty")
    refused(tiecli("train", *RUN, "--name", "  "), 1, "--name is empty")
    assert not (isolated / "runs").exists()


def test_a_fifo_as_data_path_is_not_a_regular_file_and_does_not_hang(isolated):
    os.mkfifo("pipe")

    def hung(*_):
        raise TimeoutError("tiecli hung on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        refused(tiecli("train", *args("data.path=pipe"), "--name", "X"), 1, "data.path 'pipe' is not a regular file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not (isolated / "runs").exists()


def test_a_group_given_twice_is_refused(isolated):
    refused(tiecli("train", *RUN, "model=micro"), 2, "'model' is given twice")
    assert not (isolated / "runs").exists()


# --- 4. config values through the CLI (tiecli/config/checks.py) ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, text",
    [
        ("train.lr=inf", "train.lr"),
        ("train.weight_decay=inf", "train.weight_decay"),
        ("train.beta1=2", "train.beta1"),
        ("train.beta2=-1", "train.beta2"),
        ("seed=99999999999999999999999", "seed"),
        ("train.lr=${oops}", "oops"),
    ],
)
def test_bad_config_values_exit_2_in_one_line_and_leave_nothing(isolated, override, text):
    refused(tiecli("train", *args(override), "--name", "X"), 2, text)
    assert not (isolated / "runs").exists()


# --- 9. the fault round of "The first hour": resumes that must not start, and a rank signalled while starting ---


def cut_eval_json(run: Path) -> str:
    (run / EVAL).write_text("{")
    return "run X: eval.json is unreadable"


def no_init_checkpoint(run: Path) -> str:
    (run / INIT_CHECKPOINT).unlink()
    return "run X: no checkpoint at"


def cut_geometry_json(run: Path) -> str:
    (run / GEOMETRY).write_text('{"format": 1, "entries": [')
    return "run X: geometry.json is unreadable"


@pytest.mark.slow
@pytest.mark.parametrize("damage", [cut_eval_json, no_init_checkpoint, cut_geometry_json])
def test_a_resume_that_could_not_finish_is_refused_before_it_trains_and_the_run_stays_completed(done, damage):
    """Before: the extension trained to step 12, then failed on the file, and the completed run read `failed`."""
    text = damage(done)
    before = contents(done)
    refused(tiecli("train", "--resume", done, "train.max_steps=12"), 1, text)
    refused(tiecli("train", *args("train.max_steps=12"), "--name", "X", "--resume"), 1, text)
    assert contents(done) == before  # every byte, summary.json's `completed` included
    assert RunReader(done).status() == "completed"


def train_other(name: str, steps: int) -> Path:
    """Another run of the same shapes, trained further than X."""
    result = tiecli("train", *args(f"train.max_steps={steps}", "seed=1"), "--name", name)
    assert result.exit_code == 0, result.output
    return Path("runs") / name


def without_run_ids(run: Path) -> None:
    """The run as a tiecli from before run ids wrote it: none in summary.json, none (nor logged_step) in last.pt."""
    summary = read_json(run / SUMMARY)
    del summary["run_id"]
    write_json(run / SUMMARY, summary)
    ckpt = torch.load(run / CHECKPOINT, weights_only=True)
    del ckpt["state"]["run_id"], ckpt["state"]["logged_step"]
    torch.save(ckpt, run / CHECKPOINT)


@pytest.mark.slow
def test_another_runs_checkpoint_is_refused_naming_both_sides(done):
    other = train_other("Y", 12)
    (done / CHECKPOINT).write_bytes((other / CHECKPOINT).read_bytes())
    before = contents(done)
    ours, theirs = RunReader(done).summary().run_id, RunReader(other).summary().run_id
    assert ours and theirs and ours != theirs
    line = refused(tiecli("train", "--resume", done, "train.max_steps=16"), 1, f"belongs to run id {theirs}")
    assert f"this run is {ours}" in line
    assert contents(done) == before

    # Without ids (runs from before them), the steps tell: summary.json says 8, the checkpoint 12 ...
    without_run_ids(done)
    refused(
        tiecli("train", "--resume", done, "train.max_steps=16"),
        1,
        "last.pt is at step 12, but summary.json says the run was completed at step 8",
    )
    # ... and for a run killed mid-way (summary.json still `running` at step 0), metrics.jsonl does.
    summary = read_json(done / SUMMARY)
    write_json(done / SUMMARY, {**summary, "status": "running", "step": 0})
    before = contents(done)
    line = refused(tiecli("train", "--resume", done, "train.max_steps=16"), 1, "metrics.jsonl ends at step 8")
    assert "last.pt is at step 12, with a row every 2 steps" in line
    assert contents(done) == before


@pytest.mark.slow
def test_a_run_from_before_run_ids_still_resumes_and_gets_one(done):
    without_run_ids(done)
    result = tiecli("train", "--resume", done, "train.max_steps=12")
    assert result.exit_code == 0, result.output
    run_id = RunReader(done).summary().run_id
    assert run_id and checkpoint.load(done / CHECKPOINT, "X")["state"]["run_id"] == run_id
    assert steps_of(done) == [0, 2, 4, 6, 8, 10, 12]


def cut_mid_file(metrics: Path) -> str:
    text = metrics.read_text()
    metrics.write_text(text[: len(text) // 2])  # mid-line: the torn last line is dropped, the rows after it lost
    return "metrics.jsonl ends at step "


def emptied(metrics: Path) -> str:
    metrics.write_text("")
    return "metrics.jsonl has no rows"


@pytest.mark.slow
@pytest.mark.parametrize("damage", [cut_mid_file, emptied])
@pytest.mark.parametrize("old", [False, True], ids=["checkpoint", "old checkpoint"])
def test_a_resume_after_metrics_lost_rows_says_which_and_changes_nothing(done, damage, old):
    if old:
        without_run_ids(done)
    text = damage(done / METRICS)
    before = contents(done)
    line = refused(tiecli("train", "--resume", done, "train.max_steps=12"), 1, text)
    assert "last.pt is at step 8" in line and "rows were lost" in line
    assert ("with a row every 2 steps" if old else "written after the row of step 8") in line
    assert contents(done) == before


@pytest.mark.slow
def test_a_stop_signal_to_rank_0_while_it_starts_is_one_line(isolated):
    """SIGUSR2 (a cluster's time limit) reaching rank 0 before it can catch it ends it at once; --nproc's
    launcher says so in one line, exit 130 as for any stop. Before: exit 1 and no output at all."""
    proc = spawn("train", "--nproc", "2", *args("train.max_steps=1000"), "--name", "D", env=os.environ | THREAD)
    deadline, rank0 = time.monotonic() + 120, None
    while rank0 is None and time.monotonic() < deadline and proc.poll() is None:
        rank0 = next((pid for pid in child_pids(proc.pid) if b"RANK=0" in environ(pid)), None)
        time.sleep(0.01)
    assert rank0 is not None, proc.communicate()
    os.kill(rank0, signal.SIGUSR2)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, (out, err)
    assert err.strip() == (  # a stop, not labelled an error (as Ctrl-C)
        "rank 0 of 2 was ended by SIGUSR2 (before it could catch it); what the run had saved is kept: "
        "run the same command again, with --resume if the run exists"
    ), err
    assert out == ""


THREAD = {"OMP_NUM_THREADS": "1"}


def child_pids(pid: int) -> list[int]:
    """The processes that any thread of `pid` started (torchrun's agent starts the ranks from one of its threads)."""
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return pids


def environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []
