"""report/load.py: a malformed run file is skipped with its reason; a coding error is not mistaken for one."""

import json

import pytest
from helpers import write_run

from tiecli.report import load


def edit_summary(run, change):
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    change(summary)
    path.write_text(json.dumps(summary))


def test_a_summary_lacking_a_parameter_count_is_skipped_with_the_field(tmp_path):
    run = write_run(tmp_path, "nano", "tied", 0)
    edit_summary(run, lambda s: s["params"].pop("total"))
    runs, skipped = load.load_runs([tmp_path])
    assert runs == []
    assert [s.reason for s in skipped] == ["a file lacks an expected field (KeyError: 'total')"]


def test_a_parameter_count_that_is_not_a_number_is_skipped_naming_it(tmp_path):
    run = write_run(tmp_path, "nano", "tied", 0)
    edit_summary(run, lambda s: s["params"].update(non_embedding="many"))
    runs, skipped = load.load_runs([tmp_path])
    assert runs == []
    assert [s.reason for s in skipped] == ["summary.json params 'non_embedding' is 'many', not a count"]


@pytest.mark.parametrize("error", [AttributeError, TypeError])
def test_a_coding_error_while_reading_a_run_propagates(tmp_path, monkeypatch, error):
    write_run(tmp_path, "nano", "tied", 0)
    assert len(load.load_runs([tmp_path])[0]) == 1  # the run itself is sound

    def broken(metrics, entries):
        raise error("a bug in the report, not in the run's files")

    monkeypatch.setattr(load, "diagnostics", broken)
    with pytest.raises(error, match="a bug in the report"):
        load.load_runs([tmp_path])
