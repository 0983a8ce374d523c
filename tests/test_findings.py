"""The committed findings re-report from their committed runs: docs/findings/<study>/runs.tar.xz holds the run folders
its report read (checkpoints left out), and `tiecli report` on them, with the --select the report recorded, writes
the committed results.csv again, number for number."""

import json
import tarfile
from pathlib import Path

import pytest
from helpers import tiecli

FINDINGS = Path(__file__).resolve().parents[1] / "docs" / "findings"
ARCHIVES = sorted(FINDINGS.glob("*/runs.tar.xz"))


@pytest.mark.parametrize("archive", ARCHIVES, ids=[a.parent.name for a in ARCHIVES])
def test_a_committed_report_is_what_its_committed_runs_give(archive, tmp_path, monkeypatch):
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        assert not [m.name for m in members if "/checkpoints" in m.name or m.name.endswith("/.lock")]
        tar.extractall(tmp_path, filter="data")
    sweeps = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.glob("runs/sweeps/*/sweep.json"))
    assert sweeps, f"{archive}: no sweep folder (runs/sweeps/NAME/sweep.json) inside"
    committed = json.loads((archive.parent / "results.json").read_text())
    select = [arg for key in committed["select"] for arg in ("--select", key)]
    monkeypatch.chdir(tmp_path)
    result = tiecli("report", *sweeps, *select, "--out", "again")
    assert result.exit_code == 0, result.output
    again = (tmp_path / "again" / "results.csv").read_text().splitlines()
    before = (archive.parent / "results.csv").read_text().splitlines()
    assert len(again) == len(before)
    for line_again, line_before in zip(again, before, strict=True):
        assert line_again == line_before
