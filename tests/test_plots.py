"""The report's figures at one, two and three model sizes, checked on the matplotlib Figure objects:
panel order, a colour and marker per group, whole-number step ticks, titles inside the figure."""

import dataclasses

import pytest
from helpers import write_run

from tiecli.report import load, plots
from tiecli.report.compare import compare
from tiecli.report.groups import Baseline, group_runs
from tiecli.report.stats import mean_ci

# three sizes whose names sort, as text, unlike their parameter counts (micro < nano < small)
SIZES = {
    "nano": {"n_layer": 2, "n_head": 4, "n_embd": 64, "non_embedding": 40_000},
    "micro": {"n_layer": 4, "n_head": 4, "n_embd": 128, "non_embedding": 800_000},
    "small": {"n_layer": 6, "n_head": 4, "n_embd": 192, "non_embedding": 3_000_000},
}
LOSS = {"nano": 3.0, "micro": 2.6, "small": 2.3}
PER_PANEL = {"val_loss.png": plots.val_loss, "grad_cos.png": plots.grad_cos, "drift.png": plots.drift}


def report_groups(root, baseline="tying=untied"):
    """The groups of the runs under root, with what the figures read: panel, series, perplexity, and the
    convergence target of each group's pair (None for a baseline), as the report sets them."""
    axis = Baseline.parse(baseline)
    groups, _ = group_runs(load.load_runs([root])[0])
    targets = {c.group.label: c.target for c in compare(groups, axis)}
    return [
        dataclasses.replace(
            g, axis=axis, stats={"perplexity": mean_ci(r.perplexity for r in g.runs)}, target=targets.get(g.label)
        )
        for g in groups
    ]


def panel_named(g, name):
    """g with its figure panel named `name`: its model part renamed (the tying part is the baseline's axis)."""
    return dataclasses.replace(g, parts={**g.parts, "model": name})


@pytest.fixture
def grid(tmp_path, monkeypatch):
    """grid(n): the groups of tied and untied runs, seeds 0 and 1, at the first n of nano, micro, small."""
    import helpers

    monkeypatch.setattr(helpers, "SIZES", SIZES)

    def make(n_sizes):
        root = tmp_path / f"sizes{n_sizes}"
        for size in list(SIZES)[:n_sizes] if not root.exists() else []:  # written once, read afresh each call
            for mode in ("tied", "untied"):
                for seed in (0, 1):
                    write_run(root, size, mode, seed, loss=LOSS[size] + 0.05 * seed + (mode == "tied") * 0.02)
        return report_groups(root)

    return make


def drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def lines(ax):
    """The labelled data lines of a panel (reference lines such as the target carry no marker)."""
    return [line for line in ax.get_lines() if line.get_marker() not in (None, "None", "")]


@pytest.mark.slow
@pytest.mark.parametrize("n_sizes", [1, 2, 3])
def test_titles_lie_inside_the_figure(grid, n_sizes):
    groups = grid(n_sizes)
    for figure in (*PER_PANEL.values(), plots.spectra, *([plots.ppl_vs_params] if n_sizes > 1 else [])):
        fig = figure(groups)
        renderer = drawn(fig)
        width, height = fig.bbox.width, fig.bbox.height
        for text in [fig._suptitle, *(ax.title for ax in fig.axes)]:
            box = text.get_window_extent(renderer)
            assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0 and box.y1 <= height, (
                figure.__name__,
                text.get_text(),
            )


@pytest.mark.slow
def test_panels_follow_parameter_count_then_the_numbers_in_their_names(grid):
    groups = grid(3)
    for figure in PER_PANEL.values():
        assert [ax.get_title() for ax in figure(groups).axes] == ["nano", "micro", "small"]
    named = {"micro": iter(("lr 300", "lr 30")), "nano": iter(("lr 200", "lr 200"))}
    groups = [panel_named(g, next(named[g.panel])) if g.panel in named else g for g in groups]
    for g in groups:
        if g.panel == "lr 200":  # at micro's parameter count too: among one count, the numbers in the names decide
            g.runs[0].params = {**g.runs[0].params, "non_embedding": SIZES["micro"]["non_embedding"]}
    assert [p for p in plots.panels(groups)] == ["lr 30", "lr 200", "lr 300", "small"]


def test_each_group_has_its_own_marker_and_colour(grid):
    groups = grid(2)
    for figure in PER_PANEL.values():
        for ax in figure(groups).axes:
            by_name = {}
            for line in lines(ax):
                if line.get_label().startswith("_"):
                    continue  # a further seed or the output matrix of a labelled group
                name = line.get_label().split()[0]
                by_name.setdefault(name, set()).add((line.get_color(), line.get_marker()))
            assert set(by_name) == {"tied", "untied"}
            assert all(len(s) == 1 for s in by_name.values()) and len(set().union(*by_name.values())) == 2
    ax = plots.ppl_vs_params(groups).axes[0]
    markers = [c.lines[0].get_marker() for c in ax.containers]
    assert len(markers) == 2 and len(set(markers)) == 2
    for ax in plots.spectra(groups).axes:
        styles = [(line.get_color(), line.get_marker()) for line in ax.get_lines()]
        assert len(styles) == 4 and len(set(styles)) == 4 and len({m for _, m in styles}) == 4


@pytest.mark.slow
def test_groups_of_one_mode_in_a_panel_are_told_apart(grid):
    """Compared along another axis (here the model), a panel's groups share a tying mode: named by label."""
    groups = [dataclasses.replace(g, axis=Baseline.parse("model=nano")) for g in grid(2)]  # panels: the modes
    assert {g.panel for g in groups} == {"tied", "untied"}
    ax = plots.val_loss(groups).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(legend) == [
        "micro tied",
        "nano tied",
        "target: micro tied vs its baseline",
        "target: nano tied vs its baseline",
    ]
    assert len({(line.get_color(), line.get_marker()) for line in lines(ax)}) == 2


def targets(ax):
    """{label: y} of a panel's target lines (dotted, no marker)."""
    return {line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"}


@pytest.mark.slow
def test_each_panel_draws_the_target_of_each_of_its_pairs(grid, tmp_path):
    """Targets are per compared pair: the higher of the pair's best losses, in the pair's group's colour."""
    groups = grid(2)
    for ax, size in zip(plots.val_loss(groups).axes, ("nano", "micro")):
        tied = LOSS[size] + 0.05 + 0.02  # the tied seed 1 run's lowest loss: the highest of the pair's lows
        assert targets(ax) == {"target: tied vs untied": pytest.approx(tied)}
        colour = next(line.get_color() for line in lines(ax) if line.get_label() == "tied")
        assert next(line.get_color() for line in ax.get_lines() if line.get_label().startswith("target")) == colour
    root = tmp_path / "modes"  # two modes against one baseline in one panel: two pairs, two targets
    for mode, extra in (("untied", 0.0), ("tied", 0.02), ("tied_bias", 0.2)):
        for seed in (0, 1):
            write_run(
                root, "nano", "tied" if mode == "tied_bias" else mode, seed, loss=3.0 + 0.05 * seed + extra, named=mode
            )
    groups = report_groups(root)
    (ax,) = plots.val_loss(groups).axes
    assert targets(ax) == {
        "target: tied vs untied": pytest.approx(3.07),
        "target: tied_bias vs untied": pytest.approx(3.25),
    }
    # one target for every pair (--target-loss): one line naming the pairs
    groups = [dataclasses.replace(g, target=None if g.mode == "untied" else 3.5) for g in groups]
    (ax,) = plots.val_loss(groups).axes
    assert targets(ax) == {"target: tied, tied_bias vs untied": 3.5}


@pytest.mark.slow
@pytest.mark.parametrize("n_sizes", [1, 3])
def test_step_axes_have_whole_number_ticks(grid, n_sizes):
    groups = grid(n_sizes)
    for figure in PER_PANEL.values():
        fig = figure(groups)
        drawn(fig)
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), (figure.__name__, ticks)


@pytest.mark.slow
def test_tied_drift_is_drawn_over_the_untied_lines_in_its_own_style(grid):
    groups = grid(1)
    ax = plots.drift(groups).axes[0]
    by_label = {line.get_label(): line for line in ax.get_lines()}
    tied, untied_in, untied_out = by_label["tied input = output"], by_label["untied input"], by_label["untied output"]
    assert tied.get_zorder() > max(untied_in.get_zorder(), untied_out.get_zorder())
    assert tied.get_linewidth() > untied_out.get_linewidth() and untied_out.get_linestyle() == "--"
    assert tied.get_color() != untied_out.get_color() and tied.get_marker() != untied_out.get_marker()
    seeds = {
        colour: [line.get_zorder() for line in ax.get_lines() if line.get_color() == colour]
        for colour in (tied.get_color(), untied_in.get_color())
    }
    assert min(seeds[tied.get_color()]) > max(
        seeds[untied_in.get_color()]
    )  # every seed's tied line over every untied one


@pytest.mark.slow
def test_perplexity_against_parameters_or_tokens_needs_two_points_on_that_axis(grid):
    with pytest.raises(plots.NotDrawn, match="one model size"):
        plots.ppl_vs_params(grid(1))
    images, absent = plots.draw_all(grid(1))
    assert "ppl_vs_params.png" not in images and absent == [
        "ppl_vs_params.png: not drawn (one model size: perplexity against parameters needs two or more)",
        "ppl_vs_tokens.png: not drawn (one token budget: perplexity against tokens seen needs two or more)",
    ]
    images, absent = plots.draw_all(grid(2))
    assert set(images) == set(plots.FIGURES) - {"ppl_vs_tokens.png"} and absent == [
        "ppl_vs_tokens.png: not drawn (one token budget: perplexity against tokens seen needs two or more)"
    ]
    assert all(png.startswith(b"\x89PNG") for png in images.values())


def test_a_figure_without_data_says_what_is_missing(grid):
    groups = grid(1)
    for g in groups:
        for r in g.runs:
            r.grad = []
    with pytest.raises(plots.NotDrawn, match="gradient statistics"):
        plots.grad_cos(groups)
    _, absent = plots.draw_all(groups)
    assert any(line.startswith("grad_cos.png: not drawn (no run has gradient statistics") for line in absent)
