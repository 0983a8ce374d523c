"""The fault round of issue 47 (section 3): a full disk, folders that refuse writes, damaged cache entries,
an emptied metrics.jsonl, malformed study files, each driven as a user meets it. Faults are simulated by
monkeypatching the failing call (tests run as root, whom permission bits do not stop)."""

import pytest
import test_faults as faults
from helpers import tiecli
from test_faults import contents, disk_full, failed

from tiecli.run.reader import RunReader
from tiecli.run.writer import RunWriter

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
