"""report/groups.py's Group is immutable: labelling, selecting and comparing return new groups, so the order of
the report's steps cannot leave a group half-filled."""

import dataclasses

import pytest
from helpers import write_run

from tiecli import report as tiecli_report
from tiecli.report import compare, load
from tiecli.report.groups import Baseline, group_runs, label_groups


@pytest.fixture
def groups(tmp_path):
    for size in ("nano", "micro"):
        for mode in ("tied", "untied"):
            for seed in (0, 1):
                write_run(tmp_path, size, mode, seed)
    return group_runs(load.load_runs([tmp_path])[0])[0]


def test_a_group_cannot_be_changed_in_place(groups):
    g = groups[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.target = 3.0  # type: ignore[misc]
    assert isinstance(g.runs, tuple) and g.label == "nano tied"


def test_labelling_returns_new_groups_and_leaves_the_old_ones(groups):
    nano = [g for g in groups if g.parts["model"] == "nano"]
    relabelled = label_groups(nano)  # among nano's groups alone the model still shows (it always does)
    assert [g.label for g in relabelled] == [g.label for g in nano]
    assert all(new is not old for new, old in zip(relabelled, nano))


def test_comparing_returns_groups_with_their_targets_and_statistics_and_comparisons_of_those(groups):
    axis = Baseline.parse("tying=untied")
    comparisons = compare.compare(groups, axis)
    done, paired = tiecli_report.compared(groups, comparisons, axis)
    assert all(g.target is None and g.stats == {} and g.axis is None for g in groups)  # the inputs are untouched
    by_label = {g.label: g for g in done}
    assert by_label["nano tied"].target == comparisons[0].target is not None and by_label["nano untied"].target is None
    assert by_label["nano tied"].stats["perplexity"] is not None and by_label["nano tied"].panel == "nano"
    assert all(any(c.group is g for g in done) and any(c.base is g for g in done) for c in paired)
