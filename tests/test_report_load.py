"""report/load.py: a malformed run file is skipped with its reason; a coding error is not mistaken for one; an
older run reads a key added since at the value it ran with."""

import json

import pytest
import yaml
from helpers import tiecli, write_run

from tiecli.report import load
from tiecli.report.groups import group_runs


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


def test_a_run_written_before_a_key_existed_groups_with_one_that_states_its_old_value(tmp_path):
    """eval.max_seconds is absent from an older run's config and null (no time bound, as before) in a newer one:
    one group; a run with a time bound is another."""
    old = write_run(tmp_path / "old", "nano", "tied", 0)
    new = write_run(tmp_path / "new", "nano", "tied", 1)
    bounded = write_run(tmp_path / "bounded", "nano", "tied", 2)
    for run, value in ((new, None), (bounded, 60.0)):
        path = run / "config.yaml"
        config = yaml.safe_load(path.read_text())
        config["eval"]["max_seconds"] = value
        path.write_text(yaml.safe_dump(config))
    assert "max_seconds" not in yaml.safe_load((old / "config.yaml").read_text())["eval"]
    runs, skipped = load.load_runs([tmp_path])
    assert skipped == []
    groups, _ = group_runs(runs)
    assert sorted(sorted(r.seed for r in g.runs) for g in groups) == [[0, 1], [2]]


def test_a_nan_the_geometry_wrote_for_an_undefined_value_reads_as_not_measured(tmp_path):
    """Runs with a zero-initialised output matrix wrote the step-0 CKA of the zero matrix as NaN (before the
    geometry wrote None): the report reads it as not measured, so the group's mean is over the other seeds."""
    runs = [write_run(tmp_path / f"r{seed}", "nano", "untied", seed) for seed in (0, 1, 2)]
    path = runs[0] / "geometry.json"
    geometry = json.loads(path.read_text())
    geometry["entries"][0]["agreement"]["cka"] = float("nan")
    path.write_text(json.dumps(geometry))
    loaded, skipped = load.load_runs([tmp_path])
    assert skipped == []
    by_seed = {r.seed: r for r in loaded}
    assert by_seed[0].diag["cka_init"] is None
    assert all(isinstance(by_seed[s].diag["cka_init"], float) for s in (1, 2))
    for seed in (0, 1, 2):
        write_run(tmp_path / f"t{seed}", "nano", "tied", seed)
    result = tiecli("report", str(tmp_path), "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output  # a NaN here once ended the report in a traceback
