# Used by `tiecli figure RESULTS.csv... --out FILE`: the findings figure, from reports' results.csv files.
"""One figure of what reports found: each compared group's test perplexity against its baseline (untied by
default), in percent, with its 95% interval over seeds and each seed's own point, by model size (non-embedding
parameters) and by training tokens, a zero line on both.

It reads nothing but results.csv files, each written by `tiecli report`: a compared group's run rows carry
`claims_delta_loss`, the run's loss minus its same-seed baseline's on the claims split, so every point here is
computed from the same per-seed numbers as the report's C6 and R5 rows, with the same t-interval, and matches
them. A model size that a file has at two or more token budgets goes to the tokens panel (one line per size);
the rest go to the size panel (one line per file and mode)."""

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tiecli.config.compose import default_config_dir, group_options
from tiecli.errors import TiecliError
from tiecli.report.stats import Interval, mean_ci, ppl_change

JITTER = 0.04  # each seed's point sits this far (in log10 units of x) beside its neighbours, so none hide


@dataclass(frozen=True)
class Point:
    series: str  # the line this point belongs to: the source's label, the mode, and on the tokens panel the size
    panel: str  # "size" or "tokens"
    x: float  # non-embedding parameters (size panel) or training tokens (tokens panel)
    deltas: tuple[float, ...]  # per seed: loss minus the same-seed baseline's, nats, on the claims split

    @property
    def interval(self) -> Interval | None:
        return ppl_change(mean_ci(self.deltas))

    @property
    def seeds_pct(self) -> list[float]:
        return [100 * math.expm1(d) for d in self.deltas]


def read_points(label: str, path: Path) -> list[Point]:
    """The compared groups of one results.csv, one point each, placed on the size or the tokens panel."""
    try:
        rows = list(csv.DictReader(path.open(newline="")))
    except OSError as e:
        raise TiecliError(f"{path}: cannot read it ({e.strerror or e})") from None
    if rows and "claims_delta_loss" not in rows[0]:
        raise TiecliError(f"{path}: not a results.csv written by `tiecli report` (no claims_delta_loss column)")
    modes, sizes = (group_options(group, [default_config_dir()]) for group in ("tying", "model"))
    groups: dict[tuple[str, float, float], list[float]] = defaultdict(list)
    names: dict[float, str] = {}
    for row in rows:
        if row["kind"] == "run" and row["claims_delta_loss"]:
            words = row["group"].split()
            mode = next((word for word in words if word in modes), "compared")
            params = float(row["params_non_embedding"])
            names[params] = next((word for word in words if word in sizes), f"{params / 1e6:.2g}M non-embedding")
            groups[mode, params, float(row["tokens"])].append(float(row["claims_delta_loss"]))
    budgets = defaultdict(set)
    for mode, params, tokens in groups:
        budgets[mode, params].add(tokens)
    points = []
    for (mode, params, tokens), deltas in sorted(groups.items()):
        if len(budgets[mode, params]) > 1:
            points.append(Point(f"{label}, {mode}, {names[params]}", "tokens", tokens, tuple(deltas)))
        else:
            points.append(Point(f"{label}, {mode}", "size", params, tuple(deltas)))
    return points


def draw(points: list[Point], title: str) -> Figure:
    """Two panels (size, tokens), or one when the other has no point; intervals as bars, seeds as small dots."""
    panels = [p for p in ("size", "tokens") if any(pt.panel == p for pt in points)]
    if not panels:
        raise TiecliError("no compared group in the given results (no run row has claims_delta_loss): nothing to draw")
    fig = Figure(figsize=(5.4 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: nothing global, no display needed
    fig.suptitle(title)
    colours = {s: f"C{i % 10}" for i, s in enumerate(dict.fromkeys(pt.series for pt in points))}
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for series, colour in colours.items():
            line = sorted((pt for pt in points if pt.series == series and pt.panel == panel), key=lambda p: p.x)
            if line:
                _draw_series(ax, line, series, colour)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("non-embedding parameters" if panel == "size" else "training tokens")
        ax.set_ylabel("test perplexity vs baseline, %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def _draw_series(ax, line: list[Point], series: str, colour: str) -> None:
    n = sorted({len(pt.deltas) for pt in line})
    seeds = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    xs, means, lows, highs = [], [], [], []
    for pt in line:
        ci = pt.interval
        if ci is None:
            continue
        xs.append(pt.x)
        means.append(ci.mean)
        lows.append(ci.mean - ci.low if ci.low is not None else 0.0)
        highs.append(ci.high - ci.mean if ci.high is not None else 0.0)
        offsets = [(j - (len(pt.deltas) - 1) / 2) * JITTER for j in range(len(pt.deltas))]
        ax.scatter([pt.x * 10**o for o in offsets], pt.seeds_pct, s=9, color=colour, alpha=0.45, linewidths=0)
    ax.errorbar(xs, means, yerr=[lows, highs], color=colour, marker="o", capsize=3, label=f"{series} ({seeds} seeds)")


def write_figure(sources: list[str], out: Path, title: str) -> Path:
    """`tiecli figure`: sources are results.csv paths, each optionally LABEL=PATH; the label names its lines
    (default: the folder the file is in). Writes a PNG, or an SVG when out ends in .svg, atomically."""
    points = []
    for source in sources:
        # a path may itself hold "=" (a run folder named for its overrides): only a source that is not a file is split
        label, _, path = ("", "", source) if Path(source).is_file() else source.partition("=")
        path_ = Path(path)
        if not path_.is_file():
            raise TiecliError(
                f"{path}: no such results.csv (give the results.csv a `tiecli report` wrote, or LABEL=PATH)"
            )
        points += read_points(label or path_.parent.name or path_.stem, path_)
    suffix = out.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise TiecliError(f"--out {out}: the figure is written as .png or .svg; give a file name ending in one of them")
    fig = draw(points, title)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    # no version or date in the file: the same results give the same bytes
    stamp = {"Software": None} if suffix == ".png" else {"Date": None}
    fig.savefig(partial, format=suffix[1:], dpi=100, metadata=stamp)
    partial.replace(out)
    return out
