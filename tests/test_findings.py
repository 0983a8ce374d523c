"""The committed findings re-report from their committed runs: docs/findings/<study>/runs.tar.xz holds the run folders
its report read (checkpoints left out), less those borrowed.json takes from another study's archive, and `tiecli
report` on them, with the --select the report recorded, writes the committed results.csv again, number for number."""

import json
import tarfile
from pathlib import Path

import pytest
from helpers import script, tiecli

FINDINGS = Path(__file__).resolve().parents[1] / "docs" / "findings"
STUDIES = sorted({p.parent for pattern in ("*/runs.tar.xz", "*/borrowed.json") for p in FINDINGS.glob(pattern)})


@pytest.mark.parametrize("study", STUDIES, ids=[s.name for s in STUDIES])
def test_a_committed_report_is_what_its_committed_runs_give(study, tmp_path, monkeypatch):
    if (study / "runs.tar.xz").is_file():
        with tarfile.open(study / "runs.tar.xz") as tar:
            names = tar.getnames()
        assert not [n for n in names if "/checkpoints" in n or n.endswith("/.lock")]
    script("pack_findings").unpack(study, tmp_path)
    sweeps = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.glob("runs/sweeps/*/sweep.json"))
    assert sweeps, f"{study}: no sweep folder (runs/sweeps/NAME/sweep.json) in its runs"
    committed = json.loads((study / "results.json").read_text())
    select = [arg for key in committed["select"] for arg in ("--select", key)]
    monkeypatch.chdir(tmp_path)
    result = tiecli("report", *sweeps, *select, "--out", "again")
    assert result.exit_code == 0, result.output
    again = (tmp_path / "again" / "results.csv").read_text().splitlines()
    before = (study / "results.csv").read_text().splitlines()
    assert len(again) == len(before)
    for line_again, line_before in zip(again, before, strict=True):
        assert line_again == line_before
