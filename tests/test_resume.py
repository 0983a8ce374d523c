"""Resume as nanoGPT and litgpt users expect: the run's own config, no retyping, extension allowed."""

import json

import pytest
from conftest import TINY
from helpers import tiecli

from tiecli.model import checkpoint
from tiecli.run.layout import CHECKPOINT, CONFIG, EVAL
from tiecli.run.reader import RunReader

SHORT = [o for o in TINY if not o.startswith("train.max_steps=")]


@pytest.mark.slow
def test_resume_a_run_dir_without_retyping_the_overrides_and_extend_it(isolated):
    assert tiecli("train", *SHORT, "train.max_steps=6", "--name", "r").exit_code == 0
    run = isolated / "runs" / "r"

    result = tiecli("train", "--resume", run)  # complete, nothing to extend
    assert result.exit_code == 0 and "already complete (step 6)" in result.output and "nan" not in result.output

    result = tiecli("train", "--resume", run, "train.max_steps=12", "train.eval_interval=3")
    assert result.exit_code == 0, result.output
    reader = RunReader(run)
    assert reader.summary().status == "completed" and reader.summary().step == 12
    assert "max_steps: 12" in (run / CONFIG).read_text()  # the extension is part of the run now
    assert [r.step for r in reader.metrics() if r.val_loss is not None] == [0, 6, 9, 12]
    assert reader.evals()["val"].step == 12

    result = tiecli("train", "--name", "r", "--resume")  # by name, from the default runs folder
    assert result.exit_code == 0 and "already complete (step 12)" in result.output


def test_resume_refuses_a_change_to_what_was_trained_naming_the_key(isolated, tiny_run):
    for override, key in (("train.lr=0.1", "train.lr"), ("model.n_embd=32", "model.n_embd"), ("tying=untied", "tying")):
        result = tiecli("train", "--resume", "runs/r", override, "train.max_steps=20")
        assert result.exit_code == 2 and key in result.output and "--resume" in result.output, result.output
        assert result.output.strip().count("\n") == 0
    assert RunReader(isolated / "runs" / "r").summary().step == 12  # untouched


def test_resume_takes_its_run_path_before_or_after_the_overrides(isolated, tiny_run):
    """`tiecli train train.max_steps=12 --resume runs/r`: options and overrides in any order, as in any Typer CLI."""
    for args in (["train.max_steps=12", "--resume", "runs/r"], ["train.max_steps=12", "runs/r", "--resume"]):
        result = tiecli("train", *args)
        assert result.exit_code == 0 and "already complete (step 12)" in result.output, result.output
    result = tiecli("train", "train.lr=0.1", "train.max_steps=20", "--resume", "runs/r")
    one_line(result, 2, "train.lr was 0.003 in this run; --resume may only change")
    one_line(tiecli("train", "train.max_steps=20", "--resume", "runs/r", "runs/r2"), 2, "are both run paths")
    assert RunReader(tiny_run).summary().step == 12  # untouched


@pytest.mark.slow
def test_resume_with_overrides_equal_to_the_run_is_accepted(isolated):
    """A sweep re-run passes every job's overrides again: equal values are no change."""
    assert tiecli("train", *TINY, "tying=untied", "--name", "r").exit_code == 0
    result = tiecli("train", *TINY, "tying=untied", "--name", "r", "--resume")
    assert result.exit_code == 0 and "already complete" in result.output


def one_line(result, code: int, text: str) -> None:
    assert result.exit_code == code and result.output.startswith("error:") and text in result.output, result.output
    assert result.output.strip().count("\n") == 0, result.output


EVERY_3 = [o for o in SHORT if not o.startswith("train.checkpoint_interval=")] + ["train.checkpoint_interval=3"]


@pytest.mark.slow
def test_keep_checkpoints_keeps_the_last_n_for_sample_and_eval_at_a_step(isolated):
    assert tiecli("train", *EVERY_3, "train.max_steps=12", "train.keep_checkpoints=2", "--name", "k").exit_code == 0
    run, reader = isolated / "runs" / "k", RunReader(isolated / "runs" / "k")
    assert reader.kept_steps() == [9, 12]  # of the checkpoints at 3, 6, 9 and 12, the last two
    assert (run / "checkpoints" / "step_12.pt").samefile(run / CHECKPOINT)  # a link: no second copy
    assert checkpoint.load(run / "checkpoints" / "step_9.pt", "k")["state"]["step"] == 9

    recorded = (run / EVAL).read_bytes()
    at_9 = tiecli("eval", run, "--step", "9")
    assert at_9.exit_code == 0 and "k: val at step 9" in at_9.output, at_9.output
    assert (run / EVAL).read_bytes() == recorded  # eval.json keeps the latest step's, which report reads
    assert reader.evals()["val"].step == 12
    sampled = json.loads(tiecli("sample", run, "--step", "9", "--max-new-tokens", "4", "--json").output)
    assert sampled["step"] == 9
    for command in ("sample", "eval"):
        one_line(tiecli(command, run, "--step", "4"), 1, "run k has full weights at steps 9, 12; choose latest or one")

    # Lowered on a resume, the kept ones beyond the new N go once the next one is written.
    result = tiecli("train", "--resume", run, "train.max_steps=15", "train.keep_checkpoints=1")
    assert result.exit_code == 0, result.output
    assert reader.kept_steps() == [15]


@pytest.mark.slow
def test_by_default_only_last_pt_is_kept_and_a_negative_count_is_refused(isolated):
    assert tiecli("train", *EVERY_3, "train.max_steps=12", "--name", "d").exit_code == 0
    assert sorted(p.name for p in (isolated / "runs" / "d" / "checkpoints").glob("*.pt")) == ["init.pt", "last.pt"]
    one_line(tiecli("train", *TINY, "train.keep_checkpoints=-1", "--name", "n"), 2, "train.keep_checkpoints=-1")
    assert not (isolated / "runs" / "n").exists()
