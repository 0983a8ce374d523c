"""The fault round of issue 47 (section 3): a full disk, folders that refuse writes, damaged cache entries,
an emptied metrics.jsonl, malformed study files, each driven as a user meets it. Faults are simulated by
monkeypatching the failing call (tests run as root, whom permission bits do not stop)."""

import errno
import os
import random
import re
import resource
import signal
import time
from pathlib import Path

import pytest
import test_faults as faults
from conftest import TINY
from helpers import one_line_error, results, tiecli
from test_faults import RUN, args, contents, disk_full, failed, refused

from tiecli.errors import TiecliError
from tiecli.run.layout import CHECKPOINT
from tiecli.run.reader import RunReader
from tiecli.run.writer import RunWriter
from tiecli.sweep import plan

# test_faults' fixtures: small.txt in every test's folder, and a completed run X of its RUN (8 steps)
corpus, trained, done = faults.corpus, faults.trained, faults.done

# --- 1. an extension that fails leaves the completed run completed ------------------------------------------


def full_from_step(monkeypatch, step: int, everything: bool) -> None:
    """The disk fills when metrics.jsonl's row of `step` is appended; with everything, every write after it fails too."""
    log, full = RunWriter.log, {"now": False}

    def full_log(self, row):
        if row.step >= step:
            full["now"] = True
        if full["now"]:
            disk_full()
        return log(self, row)

    monkeypatch.setattr(RunWriter, "log", full_log)
    if everything:
        from tiecli.run import writer

        write = writer.atomic_write
        monkeypatch.setattr(writer, "atomic_write", lambda *a, **kw: disk_full() if full["now"] else write(*a, **kw))


@pytest.mark.parametrize("everything", [False, True], ids=["one file", "whole disk"])
def test_a_failed_extension_leaves_the_completed_run_as_it_was(done, everything):
    """Before: summary.json read failed@10 (or, on a disk too full for it, running@8) and reports skipped the run."""
    before = contents(done)
    with pytest.MonkeyPatch.context() as mp:
        full_from_step(mp, 10, everything)
        line = failed(tiecli("train", "--resume", done, "train.max_steps=16"), 1, "No space left on device")
    assert "the extension was undone: run X is completed at step 8, as before" in line
    assert contents(done) == before  # every byte: summary.json, config.yaml (max_steps 8), metrics.jsonl, last.pt
    assert RunReader(done).status() == "completed" and not (done / ".undo").exists()
    result = tiecli("train", "--resume", done, "train.max_steps=12")  # the disk has room again: the extension works
    assert result.exit_code == 0, result.output
    summary = RunReader(done).summary()
    assert (summary.status, summary.step) == ("completed", 12) and not (done / ".undo").exists()


# --- 5. a sweep job that left no checkpoint starts again ------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_job_with_no_checkpoint_starts_again_and_its_records_are_kept(isolated):
    """Before: every rerun of the sweep failed the job with "start a new run with another --name"."""
    sweep = [*TINY, "seed=0"]
    folder, manifest, _ = plan.plan(sweep, None, Path("runs"), "nock")
    job = manifest.jobs[0]
    with pytest.MonkeyPatch.context() as mp:  # the disk fills as the first checkpoint (step 6) is written
        from tiecli.run import writer

        write = writer.atomic_write
        mp.setattr(
            writer,
            "atomic_write",
            lambda path, data: disk_full() if Path(path).name == "last.pt" else write(path, data),
        )
        failed(tiecli("train", *job.overrides, "--runs-dir", folder, "--name", job.name), 1, "No space left on device")
    run = folder / job.run_dir
    assert RunReader(run).summary().step == 6 and not (run / CHECKPOINT).exists()
    before = contents(run)

    result = tiecli("sweep", *sweep, "--name", "nock")
    assert result.exit_code == 0, result.output
    aside = folder / ".set-aside" / f"{job.run_dir}.0"
    assert f"job {job.name} trained to step 6 but left no checkpoint to resume from" in result.output, result.output
    assert contents(aside) == before  # the failed attempt's records, as they were
    summary = RunReader(run).summary()
    assert (summary.status, summary.step) == ("completed", 12) and [r.step for r in RunReader(run).metrics()][0] == 0
    assert tiecli("sweep", *sweep, "--name", "nock").exit_code == 0  # the report and reruns see the one run


# --- 3. damaged cache entries are rebuilt ---------------------------------------------------------------------


def cut_at_a_line(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[: len(lines) // 2]))  # whole lines: tiktoken's assertion on the vocabulary size


def cut_mid_line(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def broken_json(path: Path) -> None:
    path.write_text("{")


DAMAGES = [
    ("bpe", "*.tiktoken", cut_at_a_line, "tokenizer cache entry"),
    ("bpe", "*.tiktoken", cut_mid_line, "tokenizer cache entry"),
    ("bpe", "*.json", broken_json, "tokenizer cache entry"),
    ("tokens", "*/train.bin", cut_in_half, "token cache entry"),
    ("tokens", "*/meta.json", broken_json, "token cache entry"),
    ("tokens", "*/counts.npy", cut_in_half, "token cache entry"),
]


@pytest.mark.slow
def test_a_damaged_cache_entry_is_rebuilt_with_a_note(isolated, monkeypatch):
    """Before: tracebacks (AssertionError in tiktoken, ValueError, mmap length, JSONDecodeError)."""
    cache = isolated / "cache"
    monkeypatch.setenv("TIECLI_CACHE_DIR", str(cache))
    run = args("tokenizer=bpe", "tokenizer.vocab_size=300", "train.max_steps=2", "train.eval_interval=2")
    assert tiecli("train", *run, "--name", "first").exit_code == 0
    whole = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    for i, (folder, pattern, damage, what) in enumerate(DAMAGES):
        (path,) = (cache / folder).glob(pattern)
        damage(path)
        result = tiecli("train", *run, "--name", f"again{i}")
        assert result.exit_code == 0 and "Traceback" not in result.output, (damage.__name__, path, result.output)
        entry = path.with_suffix(".tiktoken") if folder == "bpe" else path.parent  # a tokenizer's, or a token split's
        assert f"note: the {what} {entry} is damaged" in result.output
        assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == whole  # rebuilt, byte for byte


# --- 6. a report that cannot be written leaves the earlier one whole ------------------------------------------


def test_a_report_that_fills_the_disk_leaves_the_earlier_report_whole(sweep, monkeypatch):
    """Before: the new report.md and figures lay beside the old results.csv/json/html, nothing marking it."""
    out = sweep / "out"
    assert tiecli("report", sweep, "--out", out).exit_code == 0
    for path in out.iterdir():  # mark the earlier report's files, to tell them from the new ones
        path.write_bytes(b"earlier " + path.name.encode())
    (out / "mine.txt").write_text("a file of the user's")
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    fsync, calls = os.fsync, {"n": 0}

    def full_at_the_third(fd):
        calls["n"] += 1
        if calls["n"] == 3:
            disk_full()
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_the_third)
    line = failed(tiecli("report", sweep, "--out", out), 1, "No space left on device")
    assert "cannot write the report to" in line and "any report there is left as it was" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier  # no temporary file either

    monkeypatch.setattr(os, "fsync", fsync)
    (out / "grad_cos.png").write_bytes(b"a figure the new report does not draw")
    (out / "spectra.png").unlink()
    assert tiecli("report", sweep, "--out", out).exit_code == 0
    names = {p.name for p in out.iterdir()}
    assert "report.md" in names and "mine.txt" in names and not any(n.startswith(".") for n in names)
    assert all(b"earlier" not in (out / n).read_bytes() for n in names - {"mine.txt"})


# --- 11. a report skips a run whose metrics.jsonl is empty ---------------------------------------------------


@pytest.mark.parametrize("left", ["", '{"format": 1}\n'], ids=["empty", "header only"])
def test_a_run_with_an_empty_metrics_log_is_skipped_with_its_reason(sweep, left):
    """Before: it was kept: its group dropped to the seeds with curves and the convergence table said it
    "never reaches the target"."""
    run = sweep / "nano-tied-s1"
    (run / "metrics.jsonl").write_text(left)
    result = tiecli("report", sweep, "--out", sweep / "out")
    assert result.exit_code == 0, result.output
    data, groups, _ = results(sweep / "out")
    assert {s["path"]: s["reason"] for s in data["skipped"]} == {str(run): "metrics.jsonl has no rows"}
    assert groups["nano tied"]["n_seeds"] == 2 and "nano-tied-s1" not in {r["name"] for r in data["runs"]}
    assert f"skipped {run}: metrics.jsonl has no rows" in result.output.replace("\n", "")


# --- 2. a full disk while the token cache is written names its error and the entry ---------------------------


def cache_files_only_small():
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # ulimit -f: train.bin (60 kB of byte tokens) fails
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so the write fails with EFBIG instead of killing the process


@pytest.mark.slow
def test_a_full_disk_while_the_token_cache_is_written_is_named(isolated):
    """Before: `error: OSError` (numpy's tofile gives no strerror)."""
    cache = isolated / "cache"
    proc = faults.spawn(
        "train",
        *RUN,
        "--name",
        "X",
        env=os.environ | {"TIECLI_CACHE_DIR": str(cache)},
        preexec_fn=cache_files_only_small,
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    line = faults.ends_in_error(err, os.strerror(errno.EFBIG))
    assert f"{cache / 'tokens'}{os.sep}" in line, line  # the entry it was writing
    assert not (isolated / "runs").exists() and [p.name for p in (cache / "tokens").iterdir()] == []


# --- 4. export on a full disk ----------------------------------------------------------------------------------


def files_under_100_kb():
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))  # model.safetensors (nano: ~1 MB) does not fit
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.slow
def test_an_export_that_cannot_be_written_is_one_line(done, isolated):
    """Before: a SafetensorError traceback."""
    proc = faults.spawn("export", done, "--to", "safetensors", "out", preexec_fn=files_under_100_kb)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    line = faults.ends_in_error(err, f"cannot write out: {os.strerror(errno.EFBIG)}; nothing was written")
    assert err.strip() == line and not [p for p in isolated.iterdir() if "out" in p.name]


# --- 9, 10 and the questionable: study files -------------------------------------------------------------------


def study(text: str | bytes) -> None:
    Path("mine/study").mkdir(parents=True, exist_ok=True)
    path = Path("mine/study/s.yaml")
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def jobs_of_study(*args) -> list[list[str]]:
    result = tiecli("sweep", "study=s", *args, "--config-dir", "mine", "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    return [line.split("]: ", 1)[1].split() for line in result.output.splitlines() if "]: " in line]


def test_a_when_rule_matches_axis_values_as_numbers(isolated):
    """Before: 0.001 was refused as "not one of the axis's values" 1e-3, 2e-3 (YAML keeps 1e-3 as text)."""
    study("axes:\n  train.lr: [1e-3, 2e-3]\nwhen:\n  - {match: {train.lr: 0.001}, set: {train.min_lr: 0.0001}}\n")
    assert jobs_of_study() == [["train.lr=0.001", "train.min_lr=0.0001"], ["train.lr=0.002"]]
    study("axes:\n  train.lr: [1e-3, 2e-3]\nwhen:\n  - {match: {train.lr: 0.004}, set: {train.min_lr: 0.0001}}\n")
    one_line_error(
        tiecli("sweep", "study=s", "--config-dir", "mine", "--dry-run"),
        2,
        "when rule 1: train.lr=0.004 is not one of the axis's values: 1e-3, 2e-3",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (b"axes:\n  seed: [0, 1]\n# caf\xe9\n", "is not UTF-8 text (byte 26 is 0xe9)"),  # before: UnicodeDecodeError
        ("axes:\n  seed: [0, 1]\naxes:\n  seed: [2]\n", "key 'axes' is given twice"),  # before: the last one, silently
        ("axes:\n  seed: [0, 1]\n  seed: [2]\n", "key 'seed' is given twice"),
        ("", "is empty; a study gives at least its axes"),  # before: one job of the defaults
        ("# only a comment\n", "is empty; a study gives at least its axes"),
    ],
    ids=["latin-1", "duplicate section", "duplicate axis", "empty", "comment only"],
)
def test_a_malformed_study_file_is_one_line(isolated, text, message):
    study(text)
    one_line_error(tiecli("sweep", "study=s", "--config-dir", "mine", "--dry-run"), 2, message)
    assert not Path("runs").exists()


# --- 7, 8. --nproc's launcher: which rank died, and a stop while the ranks start -----------------------------


def launcher_with(monkeypatch, outcome):
    """launcher.torchrun with torch's elastic_launch replaced: `outcome(environ)` raises what the agent would."""
    import torch.distributed.launcher.api as api

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(api, "elastic_launch", lambda config, entrypoint: lambda *args: outcome(dict(os.environ)))


def ranks_failed(**codes):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {int(r[1:]): ProcessFailure(int(r[1:]), 100 + int(r[1:]), c, "<N/A>") for r, c in codes.items()}
    raise ChildFailedError("tiecli", failures)


@pytest.mark.parametrize(
    "codes, code, text",
    [
        (
            {"r0": -signal.SIGTERM, "r1": -signal.SIGKILL},
            137,
            "rank 1 of 2 was ended by SIGKILL",
        ),  # before: rank 0, SIGTERM, 130
        ({"r0": 1, "r1": -signal.SIGKILL}, 137, "rank 1 of 2 was ended by SIGKILL"),
        ({"r0": -signal.SIGSEGV, "r1": -signal.SIGTERM}, 128 + signal.SIGSEGV, "rank 0 of 2 was ended by SIGSEGV"),
        ({"r1": -signal.SIGUSR2}, 130, "rank 1 of 2 was ended by SIGUSR2 (before it could catch it)"),
    ],
)
def test_the_launcher_names_the_rank_that_died(monkeypatch, codes, code, text):
    from tiecli.runtime import launcher

    launcher_with(monkeypatch, lambda env: ranks_failed(**codes))
    with pytest.raises(TiecliError, match=re.escape(text)) as e:
        launcher.torchrun(2, ["train"])
    assert e.value.exit_code == code
    launcher_with(monkeypatch, lambda env: ranks_failed(r0=1, r1=-signal.SIGTERM))
    assert launcher.torchrun(2, ["train"]) == 1  # rank 0 said why (its own error line)


def test_a_stop_while_the_ranks_start_says_nothing_was_written(monkeypatch):
    """Before: exit 130 and no output at all when the ranks had not yet caught the signal."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from tiecli.runtime import launcher

    def stopped(env, said: bool):
        if said:  # a rank that caught the stop printed its line and said so
            Path(env[launcher.STOP_SAID]).touch()
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    launcher_with(monkeypatch, lambda env: stopped(env, said=False))
    with pytest.raises(TiecliError, match="^interrupted before the run started; nothing was written$") as e:
        launcher.torchrun(2, ["train"])
    assert e.value.exit_code == 130
    launcher_with(monkeypatch, lambda env: stopped(env, said=True))
    assert launcher.torchrun(2, ["train"]) == 130  # and the launcher adds no line to the rank's
    assert launcher.STOP_SAID not in os.environ


def ranks_of(pid: int) -> dict[int, int]:
    """{rank: pid} of the ranks torchrun's agent in process `pid` has started so far."""
    return {
        int(v.split(b"=")[1]): child
        for child in faults.child_pids(pid)
        for v in faults.environ(child)
        if v.startswith(b"RANK=")
    }


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR2])
def test_a_stop_to_the_launcher_while_the_ranks_start_is_one_line(isolated, sig):
    proc = faults.spawn(
        "train", "--nproc", "2", *args("train.max_steps=1000"), "--name", "D", env=os.environ | faults.THREAD
    )
    deadline, ranks = time.monotonic() + 120, {}
    try:
        while len(ranks) < 2 and time.monotonic() < deadline and proc.poll() is None:
            ranks = ranks_of(proc.pid)
            time.sleep(0.01)
        assert len(ranks) == 2, proc.communicate()
        proc.send_signal(sig)  # the ranks are importing torch: they cannot catch it yet
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
        for pid in ranks.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert err.strip() == "interrupted before the run started; nothing was written", err
    assert not (isolated / "runs" / "D").exists()


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_named_and_the_exit_is_a_failure(isolated):
    proc = faults.spawn(
        "train", "--nproc", "2", *args("train.max_steps=1000"), "--name", "D", env=os.environ | faults.THREAD
    )
    run = isolated / "runs" / "D"
    try:
        deadline = time.monotonic() + 240
        while not (run / "metrics.jsonl").is_file() or not faults.steps_of(run)[1:]:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        os.kill(ranks_of(proc.pid)[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, (out, err)
    assert err.strip().splitlines()[-1].startswith("error: rank 1 of 2 was ended by SIGKILL"), err
    assert "Traceback" not in err


# --- the questionable: what a user would expect -----------------------------------------------------------------


def test_a_checkpoint_of_random_bytes_is_one_line_without_torchs_advice(done):
    """Before: the line quoted torch's advice to load with weights_only=False (which would run the file's code)."""
    (done / CHECKPOINT).write_bytes(random.Random(0).randbytes(3000))
    line = refused(
        tiecli("eval", done), 1, "run X: checkpoint last.pt is corrupt or unreadable (not a file of tensors: "
    )
    assert "weights_only" not in line and "issue" not in line


def test_a_name_too_long_for_the_temporary_folder_is_refused_before_anything(isolated):
    """Before: 250 bytes passed the name check, then failed on runs/.NAME.x1y2z3w4.tmp (over 255 bytes)."""
    line = refused(tiecli("train", *RUN, "--name", "x" * 250), 1, "is longer than 241 bytes")
    assert "temporary name" in line and not (isolated / "runs").exists()
    result = tiecli("train", *args("train.max_steps=2"), "--name", "x" * 241)
    assert result.exit_code == 0, result.output
    assert RunReader(isolated / "runs" / ("x" * 241)).status() == "completed"


def test_a_byte_order_mark_does_not_cost_a_pairs_files_first_pair(isolated):
    """Before: the BOM stuck to the first word, which then encoded to more than one token: the pair was lost."""
    from tiecli.data.pairs import form_pairs
    from tiecli.data.tokenizer import gpt2

    Path("pairs.tsv").write_bytes("\ufeffwalk\twalks\nmake\tmaking\n".encode())
    pairs, info = form_pairs(gpt2(), "./pairs.tsv")
    enc = gpt2()
    walk = (enc.encode_ordinary(" walk")[0], enc.encode_ordinary(" walks")[0])  # bare "walks" is two tokens
    assert pairs[0] == walk and info["skipped_lines"] == 0 and info["found"] == len(pairs) == 3


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_lists_the_step_it_resumes_from(isolated):
    """Before: `tiecli runs` showed `interrupted 0/1,000`: summary.json kept the step it started at."""
    from tiecli.model import checkpoint

    proc = faults.spawn("train", *args("train.max_steps=1000", "train.checkpoint_interval=4"), "--name", "X")
    run = isolated / "runs" / "X"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
            if not (run / CHECKPOINT).is_file():
                continue
            # frozen, so not killed in the moment between writing last.pt and summary.json's step
            proc.send_signal(signal.SIGSTOP)
            step = checkpoint.load(run / CHECKPOINT, "X")["state"]["step"]
            if RunReader(run).summary().step == step:
                break
            proc.send_signal(signal.SIGCONT)
        proc.kill()  # kill -9: no handler runs, summary.json stays `running`
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert step >= 4 and RunReader(run).status() == "interrupted"
    result = tiecli("runs")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "│ X " in line)
    assert "interrupted" in row and f"{step:,}/1,000" in row, result.output


@pytest.mark.slow
def test_ranks_whose_launcher_is_killed_checkpoint_and_stop(isolated):
    """Before: kill -9 of the --nproc launcher left both ranks training, holding the run's lock."""
    proc = faults.spawn(
        "train", "--nproc", "2", *args("train.max_steps=1000"), "--name", "D", env=os.environ | faults.THREAD
    )
    run = isolated / "runs" / "D"
    ranks = {}
    try:
        deadline = time.monotonic() + 240
        while not (run / "metrics.jsonl").is_file() or not faults.steps_of(run)[1:]:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        ranks = ranks_of(proc.pid)
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 120
        while any(not _gone(pid) for pid in ranks.values()):
            assert time.monotonic() < deadline, "the ranks outlived their launcher"
            time.sleep(0.1)
    finally:
        for pid in ranks.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    reader = RunReader(run)
    assert reader.summary().status == "interrupted" and not reader.in_use()  # SIGTERM: a clean stop, a checkpoint
    assert (run / CHECKPOINT).is_file() and reader.summary().step > 0


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_full_disk_while_a_metrics_row_is_appended_names_the_file(isolated, monkeypatch):
    """Before: `error: No space left on device`, naming no file."""
    from tiecli.run import writer

    class Full:  # a file whose writes find the disk full, as Python's own raise it: no file name
        def __init__(self, *a, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "open", Full, raising=False)
    line = failed(tiecli("train", *RUN, "--name", "X"), 1, "No space left on device")
    assert line.endswith(str(Path("runs", "X", "metrics.jsonl"))), line


def test_a_when_rule_that_matches_no_job_is_noted(isolated):
    """Before: accepted silently; here the command line's tying=untied leaves the tied rule nothing to set."""
    study("axes:\n  tying: [untied, tied]\nwhen:\n  - {match: {tying: tied}, set: {train.lr: 0.006}}\n")
    result = tiecli("sweep", "study=s", "tying=untied", "--config-dir", "mine", "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    assert "note: study 's', when rule 1 (tying=tied) matches no job of this sweep" in result.output
    assert "note:" not in tiecli("sweep", "study=s", "--config-dir", "mine", "--dry-run", "--no-estimate").output


def test_a_full_disk_at_the_new_runs_lock_leaves_no_temporary_folder(isolated, monkeypatch):
    """Before: the lock was taken outside the clean-up, so runs/.X.*.tmp/ stayed behind."""
    write = os.write

    def full_at_a_lock(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(os.sep + ".lock"):
            disk_full()
        return write(fd, data)

    monkeypatch.setattr(os, "write", full_at_a_lock)
    refused(tiecli("train", *RUN, "--name", "X"), 1, "No space left on device")
    assert list((isolated / "runs").iterdir()) == []


def test_a_config_edited_by_hand_is_refused_on_resume(done):
    """Before: a hand-edited train.lr in config.yaml resumed silently, with the new rate."""
    config = done / "config.yaml"
    trained = config.read_text()
    assert "\n  lr: 0.003\n" in trained
    config.write_text(trained.replace("\n  lr: 0.003\n", "\n  lr: 0.01\n"))
    before = contents(done)
    line = refused(tiecli("train", "--resume", done, "train.max_steps=12"), 1, "config.yaml says train.lr=0.01")
    assert "but the run trained with 0.003 (last.pt says so)" in line
    assert contents(done) == before
    config.write_text(trained)  # put back: it resumes
    assert tiecli("train", "--resume", done, "train.max_steps=12").exit_code == 0
