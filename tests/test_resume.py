"""Resume as nanoGPT and litgpt users expect: the run's own config, no retyping, extension allowed."""

from conftest import TINY
from typer.testing import CliRunner

from tiecli import rundir
from tiecli.cli import app

runner = CliRunner()
SHORT = [o for o in TINY if not o.startswith("train.max_steps=")]


def tiecli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_resume_a_run_dir_without_retyping_the_overrides_and_extend_it(isolated):
    assert tiecli("train", *SHORT, "train.max_steps=6", "--name", "r").exit_code == 0
    run = isolated / "runs" / "r"

    result = tiecli("train", "--resume", run)  # complete, nothing to extend
    assert result.exit_code == 0 and "already complete (step 6)" in result.output and "nan" not in result.output

    result = tiecli("train", "--resume", run, "train.max_steps=12", "train.eval_interval=3")
    assert result.exit_code == 0, result.output
    reader = rundir.RunReader(run)
    assert reader.summary().status == "completed" and reader.summary().step == 12
    assert "max_steps: 12" in (run / rundir.CONFIG).read_text()  # the extension is part of the run now
    assert [r.step for r in reader.metrics() if r.val_loss is not None] == [0, 6, 9, 12]
    assert reader.evals()["val"].step == 12

    result = tiecli("train", "--name", "r", "--resume")  # by name, from the default runs folder
    assert result.exit_code == 0 and "already complete (step 12)" in result.output


def test_resume_refuses_a_change_to_what_was_trained_naming_the_key(isolated):
    assert tiecli("train", *TINY, "--name", "r").exit_code == 0
    for override, key in (("train.lr=0.1", "train.lr"), ("model.n_embd=32", "model.n_embd"), ("tying=untied", "tying")):
        result = tiecli("train", "--resume", "runs/r", override, "train.max_steps=20")
        assert result.exit_code == 2 and key in result.output and "--resume" in result.output, result.output
        assert result.output.strip().count("\n") == 0
    assert rundir.RunReader(isolated / "runs" / "r").summary().step == 12  # untouched


def test_resume_with_overrides_equal_to_the_run_is_accepted(isolated):
    """A sweep re-run passes every job's overrides again: equal values are no change."""
    assert tiecli("train", *TINY, "tying=untied", "--name", "r").exit_code == 0
    result = tiecli("train", *TINY, "tying=untied", "--name", "r", "--resume")
    assert result.exit_code == 0 and "already complete" in result.output
