"""nano train -> sweep -> report, as a user runs them: the report reads exactly what training wrote."""

import json

import pytest
from conftest import TINY
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.run.reader import RunReader
from tiecli.run.records import read_manifest


@pytest.mark.slow
def test_sweep_then_report_reads_what_train_wrote(isolated):
    runner = CliRunner()
    grid = [o for o in TINY if not o.startswith("train.max_steps=")] + [
        "train.max_steps=6",
        "tying=tied,untied",
        "seed=0,1",
    ]
    result = runner.invoke(app, ["sweep", *grid, "--name", "e2e"])
    assert result.exit_code == 0, result.output
    sweep = isolated / "runs" / "sweeps" / "e2e"
    manifest = read_manifest(sweep / "sweep.json")
    assert [job.state for job in manifest.jobs] == ["completed"] * 4

    result = runner.invoke(app, ["report", str(sweep)])
    assert result.exit_code == 0, result.output
    written = json.loads((sweep / "report" / "results.json").read_text())
    assert len(written["runs"]) == 4 and not written["skipped"]
    for row in written["runs"]:
        reader = RunReader(sweep / next(job.run_dir for job in manifest.jobs if job.name == row["name"]))
        assert row["loss"] == reader.evals()["val"].loss  # the very number eval.json holds
        assert row["perplexity"] == reader.evals()["val"].perplexity
    groups = {g["group"] for g in written["groups"]}
    assert any("tied" in g and "untied" not in g for g in groups) and any("untied" in g for g in groups)
