"""Training progress as a user sees it: a bar that fits 80 columns on a terminal, plain lines in a log."""

import io
import re

import pytest
import shellingham
from conftest import TINY
from rich.console import Console
from typer.testing import CliRunner

from tiecli import formats
from tiecli.cli import app
from tiecli.run.records import MetricsRow


def row(step, loss=None, val=None):
    return MetricsRow(
        step=step,
        tokens=step * 100,
        lr=1e-3,
        loss=loss,
        tokens_per_s=None if loss is None else 12345.0,
        val_loss=val,
        val_ppl=None if val is None else 2.718**val,
    )


@pytest.mark.slow
def test_the_bar_fits_80_columns_with_step_total_and_eta_first():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    name = "micro-untied-bpe4096-shakespeare-s0-" + "x" * 90  # a name longer than the line
    with formats.TrainProgress(console, name, total=500, start=0, log_interval=10) as progress:
        console.print(progress.bar.get_renderable())
        progress.advance(10)
        progress.log(row(10, loss=4.123))
        console.print(progress.bar.get_renderable())
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in out.getvalue().splitlines()]
    assert lines[0].startswith("training micro-untied")  # the name on its own line
    before = next(line for line in lines if "step 0/500" in line)
    assert "loss —" in before and "— tok/s" in before and "nan" not in before  # no fake numbers yet
    after = next(line for line in lines if "step 10/500" in line)
    assert "loss 4.123" in after and "12,345 tok/s" in after and "ETA" in after
    assert all(len(line) <= 80 for line in lines if "step" in line)


def rendered(progress) -> str:
    """The bar as it reads now, drawn on a console of its own at 80 columns."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=80).print(progress.bar.get_renderable())
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).strip()


def test_the_bar_says_compiling_shows_the_val_loss_and_its_eta_leaves_out_the_compile(monkeypatch):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    now = {"t": 0.0}
    monkeypatch.setattr(formats.time, "perf_counter", lambda: now["t"])
    with formats.TrainProgress(console, "r", total=500, start=0, log_interval=10, compiling=True) as progress:
        progress.log(row(0, val=8.3408))  # step 0's evaluation comes before the first step
        line = rendered(progress)
        assert "compiling" in line and "val 8.341" in line and "ETA" not in line
        now["t"] = 20.0  # the first step ends after a 20 s compile
        progress.advance(1)
        now["t"] = 21.0  # then 10 steps a second
        progress.advance(11)
        progress.log(row(11, loss=6.5, val=6.4459))
        line = rendered(progress)
    assert "compiling" not in line and "val 6.446" in line and "loss 6.500" in line
    assert progress.eta(11, 21.0) == pytest.approx(48.9)  # 489 steps left at 0.1 s, not at 21 s / 11 steps
    assert "ETA 0m48s" in line and len(line) <= 80


def test_without_a_terminal_a_log_gets_plain_progress_and_evaluation_lines(isolated):
    result = CliRunner().invoke(app, ["train", *TINY, "--name", "plain"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "training plain" in lines
    progress = [
        line for line in lines if re.match(r"step \d+/12 loss \d+\.\d{4} [\d,]+ tok/s elapsed \d+m\d\ds ETA", line)
    ]
    assert progress and progress[-1].startswith("step 12/12")
    evals = [line for line in lines if line.startswith("eval step")]
    assert [e.split(":")[0] for e in evals] == ["eval step 0/12", "eval step 6/12", "eval step 12/12"]


def test_plain_lines_come_at_most_every_30_seconds_except_the_last(monkeypatch):
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    clock = iter([0.0, 1.0, 2.0, 40.0, 41.0])
    monkeypatch.setattr(formats.time, "perf_counter", lambda: next(clock))
    with formats.TrainProgress(console, "r", total=40, start=0, log_interval=10) as progress:
        for step in (10, 20, 30, 40):
            progress.log(row(step, loss=1.0))
    steps = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("step ")]
    assert steps == ["10/40", "30/40", "40/40"]  # 20 came 1 s after 10; the last step always shows


def test_version_and_completion(monkeypatch):
    runner = CliRunner()
    from tiecli import __version__

    assert runner.invoke(app, ["--version"]).output.strip() == f"tiecli {__version__}"
    # --show-completion is a flag: Typer asks shellingham which shell runs it, and a pytest started with no
    # shell among its ancestors (nohup, a service) has none, so the test names the user's shell itself
    monkeypatch.setattr(shellingham, "detect_shell", lambda: ("bash", "/bin/bash"))
    result = runner.invoke(app, ["--show-completion"], prog_name="tiecli")
    assert result.exit_code == 0 and "_TIECLI_COMPLETE=complete_bash" in result.output


def test_a_log_says_when_the_first_step_waits_for_the_compile():
    out = io.StringIO()
    with formats.TrainProgress(Console(file=out, width=200), "r", 500, 0, 10, compiling=True):
        pass
    assert "compiling the training step (torch.compile); the first step waits for it" in out.getvalue()


def test_the_summary_says_which_precision_the_run_trained_in(tiny_trained):
    """`dtype: auto` is bf16 autocast on a CPU with bf16 instructions and fp32 on one without: the table
    `tiecli train` ends with says which, so an output quoted from one machine is read right on another."""
    from rich.console import Console

    from tiecli.display import summary_table
    from tiecli.run.reader import RunReader

    summary = RunReader(tiny_trained).summary()
    out = Console(record=True, width=120)
    out.print(summary_table(summary))
    (row,) = [line for line in out.export_text().splitlines() if "precision" in line]
    expected = "fp32 on cpu" if summary.dtype == "fp32" else f"{summary.dtype} autocast on cpu"
    assert summary.device == "cpu" and summary.dtype in ("fp32", "bf16") and expected in row
