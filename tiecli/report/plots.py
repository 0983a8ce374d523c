# Used by `tiecli report`: its figures, drawn off-screen with matplotlib's Agg canvas into PNG bytes.
"""The report's figures. Each figure function takes the report's groups (tiecli.report.groups.Group:
label, mode, panel, series, target, stats, runs with their curves) and returns a matplotlib Figure, or
raises NotDrawn saying why; draw_all encodes them as PNG. One panel per comparison set (the groups
that differ only on the baseline axis, e.g. the tying modes at one model size), in numeric order;
each line its own colour and marker, the same in every panel. A group's target is the convergence
target of its own pair (the group against its baseline; None for a baseline), so val_loss.png draws
one target line per pair in a panel."""

import io
import re
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

if TYPE_CHECKING:
    from tiecli.report.groups import Group

PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
    "tab:cyan",
)
MARKERS = "osD^v<>PXph*"  # 12 against 10 colours: 60 lines before a colour and marker pair repeats
PANEL_WIDTH, PANEL_HEIGHT = 5.2, 4.0  # inches
TITLE_CHARS_PER_INCH = 9  # a title at matplotlib's "large" size (12 pt) wraps at about this many characters per inch


class NotDrawn(Exception):
    """A figure that is not drawn; the message says why."""


@dataclass(frozen=True)
class Style:
    name: str  # the legend entry
    colour: str
    marker: str


def natural(text: str) -> tuple:
    """Sort key with the numbers in text compared as numbers: "30" < "200" < "300"."""
    parts = re.split(r"(\d+(?:\.\d+)?)", text)
    return tuple(float(p) if i % 2 else p for i, p in enumerate(parts))


def size_order(g: "Group") -> tuple:
    return g.params["non_embedding"], natural(g.label)


def styles(names) -> dict[str, Style]:
    """A colour and marker pair for each distinct name, in the order given."""
    return {
        n: Style(n, PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]) for i, n in enumerate(dict.fromkeys(names))
    }


def panels(groups: list["Group"]) -> dict[str, list["Group"]]:
    """The groups by panel: panels by parameter count, then by the numbers in their names; groups likewise."""
    out: dict[str, list[Group]] = {}
    for g in sorted(groups, key=size_order):
        out.setdefault(g.panel, []).append(g)
    return dict(sorted(out.items(), key=lambda item: (size_order(item[1][0])[0], natural(item[0]))))


def panel_styles(groups: list["Group"]) -> dict[str, Style]:
    """Each group's style by label, named by what tells the groups of a panel apart: the tying mode, else
    the series (the label less the model size), else the whole label. Equal names, equal styles."""
    by_panel = panels(groups).values()
    name = next(
        f
        for f in (lambda g: g.mode, lambda g: g.series, lambda g: g.label)
        if all(len({f(g) for g in members}) == len(members) for members in by_panel)
    )
    style = styles(name(g) for g in sorted(groups, key=size_order))
    return {g.label: style[name(g)] for g in groups}


def wrap(text: str, inches: float) -> str:
    return textwrap.fill(text, max(20, int(inches * TITLE_CHARS_PER_INCH)))


def grid(n: int, title: str) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = -(-n // cols)
    width = max(PANEL_WIDTH * cols, 7)
    fig = Figure(figsize=(width, PANEL_HEIGHT * rows), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: nothing global, no display needed
    fig.suptitle(wrap(title, width))  # wrapped to the figure's width: never clipped at its edges
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def label_once(seen: set, label: str) -> str | None:
    """A legend entry for the first line of each label; the seeds' other lines stay unlabelled."""
    if label in seen:
        return None
    seen.add(label)
    return label


def per_run_panels(groups, title, axis_labels, has_data, draw, missing, finish=None) -> Figure:
    """A panel per comparison set, draw(ax, group, run, style, seen) for every run that has the data,
    then finish(ax, members, style) once per panel when given; NotDrawn(missing) when no run has it.
    The x axis (steps or tokens) has whole-number ticks."""
    chosen = {p: gs for p, gs in panels(groups).items() if any(has_data(r) for g in gs for r in g.runs)}
    if not chosen:
        raise NotDrawn(missing)
    style = panel_styles(groups)
    fig, axes = grid(len(chosen), title)
    for ax, (panel, members) in zip(axes, chosen.items()):
        seen: set[str] = set()
        for g in members:
            for run in g.runs:
                if has_data(run):
                    draw(ax, g, run, style[g.label], seen)
        if finish:
            finish(ax, members, style)
        ax.set_title(wrap(panel, PANEL_WIDTH))
        ax.set_xlabel(axis_labels[0])
        ax.set_ylabel(axis_labels[1])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def pair_targets(ax, members: list["Group"], style: dict[str, Style]) -> None:
    """A dotted line at the convergence target of each compared pair in the panel, in the colour of the
    pair's group (not its baseline) and labelled "target: GROUP vs BASELINE". The baseline is named when
    it is the panel's one group without a target (the usual case: the panel is the groups that differ
    only on the baseline axis), else "its baseline". Pairs with the same target (--target-loss) share
    one black line that names them all."""
    bases = [g for g in members if g.target is None]
    against = style[bases[0].label].name if len(bases) == 1 else "its baseline"
    by_target: dict[float, list[Group]] = {}
    for g in members:
        if g.target is not None:
            by_target.setdefault(g.target, []).append(g)
    for target, pair in by_target.items():
        colour = style[pair[0].label].colour if len(pair) == 1 else "black"
        names = ", ".join(style[g.label].name for g in pair)
        ax.axhline(target, color=colour, ls=":", lw=1.3, zorder=0, label=f"target: {names} vs {against}")


def val_loss(groups: list["Group"]) -> Figure:
    def draw(ax, g, run, style, seen):
        _, tokens, loss = zip(*run.curve)
        ax.plot(
            tokens,
            loss,
            color=style.colour,
            marker=style.marker,
            ms=4,
            lw=1,
            alpha=0.8,
            label=label_once(seen, style.name),
        )

    return per_run_panels(
        groups,
        "Validation loss during training (in-training subset; one line per seed; dotted: the "
        "convergence target of each compared pair, in its group's colour; black when pairs share it)",
        ("tokens seen", "validation loss (nats)"),
        lambda r: bool(r.curve),
        draw,
        "no run has in-training validation losses",
        pair_targets,
    )


def grad_cos(groups: list["Group"]) -> Figure:
    def draw(ax, g, run, style, seen):
        steps, cos = zip(*run.grad)
        ax.plot(
            steps,
            cos,
            color=style.colour,
            marker=style.marker,
            ms=3,
            lw=1,
            alpha=0.8,
            label=label_once(seen, style.name),
        )
        ax.axhline(0, color="black", lw=0.6)

    return per_run_panels(
        groups,
        "Cosine of the input-path and output-path gradients of the token matrices (one line per seed)",
        ("step", "cos(G_in, G_out)"),
        lambda r: bool(r.grad),
        draw,
        "no run has gradient statistics (diag.every = 0)",
    )


def drift(groups: list["Group"]) -> Figure:
    def draw(ax, g, run, style, seen):
        steps, d_in, d_out = zip(*run.drift)
        if run.tied_geometry:  # one matrix: a thick line over the untied ones, which show through it
            ax.plot(
                steps,
                d_in,
                color=style.colour,
                marker=style.marker,
                lw=2.5,
                alpha=0.75,
                zorder=3,
                label=label_once(seen, f"{style.name} input = output"),
            )
            return
        ax.plot(
            steps,
            d_in,
            color=style.colour,
            marker=style.marker,
            lw=1.2,
            zorder=2,
            label=label_once(seen, f"{style.name} input"),
        )
        if any(d is not None for d in d_out):
            ax.plot(
                steps,
                d_out,
                color=style.colour,
                marker=style.marker,
                mfc="white",
                lw=1.2,
                ls="--",
                zorder=1,
                label=label_once(seen, f"{style.name} output"),
            )

    return per_run_panels(
        groups,
        "Drift from initialisation |W - W0| / |W0|, judged by C2/C7 drift on the input side (thick: the one "
        "tied matrix; thin solid: input embedding, dashed: output matrix)",
        ("step", "relative drift"),
        lambda r: bool(r.drift),
        draw,
        "no run has geometry entries (diag.geometry off)",
    )


def ppl_vs_params(groups: list["Group"]) -> Figure:
    return ppl_against(
        groups,
        lambda g: g.params["non_embedding"],
        lambda g: g.series,
        "non-embedding parameters",
        "one model size: perplexity against parameters needs two or more",
    )


def ppl_vs_tokens(groups: list["Group"]) -> Figure:
    """R5's data axis: each mode's perplexity as the same model sees more tokens (budgets of one setting)."""
    return ppl_against(
        groups,
        lambda g: g.tokens,
        lambda g: g.budget_series,
        "tokens seen",
        "one token budget: perplexity against tokens seen needs two or more",
    )


def ppl_against(groups: list["Group"], x_of, series_of, xlabel: str, one_point: str) -> Figure:
    """Validation perplexity against x_of(group) on a log axis: one line per series_of(group)."""
    series: dict[str, list[Group]] = {}
    for g in sorted((g for g in groups if g.stats["perplexity"]), key=lambda g: (x_of(g), natural(g.label))):
        series.setdefault(series_of(g), []).append(g)
    if not any(len({x_of(g) for g in members}) > 1 for members in series.values()):
        raise NotDrawn(one_point if series else "no group has a validation perplexity")
    style = styles(series)
    fig, (ax,) = grid(1, f"Validation perplexity vs {xlabel} (mean over seeds; bars: 95% CI, none with one seed)")
    for name, members in series.items():
        cis = [g.stats["perplexity"] for g in members]
        y = [ci.mean for ci in cis]
        low = [ci.mean - (ci.low if ci.low is not None else ci.mean) for ci in cis]
        high = [(ci.high if ci.high is not None else ci.mean) - ci.mean for ci in cis]
        ax.errorbar(
            [x_of(g) for g in members],
            y,
            yerr=[low, high],
            color=style[name].colour,
            marker=style[name].marker,
            capsize=4,
            label=name,
        )
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation perplexity")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


def spectra(groups: list["Group"]) -> Figure:
    measured = sorted((g for g in groups if g.runs[0].spectra), key=size_order)
    if not measured:
        raise NotDrawn("no run has geometry entries (diag.geometry off)")
    style = styles(g.label for g in measured)
    fig, axes = grid(2, "Singular values at the last geometry step (each group's lowest seed)")
    for side, ax in enumerate(axes):
        for g in measured:
            assert g.runs[0].spectra is not None  # measured keeps only groups whose first run has spectra
            values = g.runs[0].spectra[side]
            ax.plot(
                range(1, len(values) + 1),
                values,
                color=style[g.label].colour,
                marker=style[g.label].marker,
                markevery=max(1, len(values) // 8),
                ms=4,
                lw=1.2,
                label=g.label + (" (shared)" if g.runs[0].tied_geometry else ""),
            )
        ax.set_yscale("log")
        ax.set_title(("input embedding", "output matrix")[side])
        ax.set_xlabel("index (descending)")
        ax.set_ylabel("singular value")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return fig


FIGURES = {
    "val_loss.png": val_loss,
    "ppl_vs_params.png": ppl_vs_params,
    "ppl_vs_tokens.png": ppl_vs_tokens,
    "grad_cos.png": grad_cos,
    "drift.png": drift,
    "spectra.png": spectra,
}


def draw_all(groups: list["Group"]) -> tuple[dict[str, bytes], list[str]]:
    """PNG bytes of each figure drawn, by file name; and for each one not drawn, a line saying why."""
    images, absent = {}, []
    for name, figure in FIGURES.items():
        try:
            images[name] = png(figure(groups))
        except NotDrawn as e:
            absent.append(f"{name}: not drawn ({e})")
    return images, absent
