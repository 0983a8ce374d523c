# Used by `tiecli report`: its figures, drawn off-screen with matplotlib's Agg canvas into PNG bytes.
"""The report's figures. Each function takes the report's groups (tiecli/report.py: label, mode,
panel, series, stats, runs with their curves) and returns PNG bytes, or None when no run has the
data. One panel per comparison set (the groups that differ only on the baseline axis, e.g. the
tying modes at one model size); one colour per tying mode throughout."""

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan")


def colours(groups: list[dict]) -> dict[str, str]:
    modes = list(dict.fromkeys(g["mode"] for g in groups))
    return {mode: PALETTE[i % len(PALETTE)] for i, mode in enumerate(modes)}


def panels(groups: list[dict]) -> dict[str, list[dict]]:
    out = {}
    for g in groups:
        out.setdefault(g["panel"], []).append(g)
    return out


def grid(n: int, title: str) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(max(5.2 * cols, 7), 4 * rows), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: nothing global, no display needed
    fig.suptitle(title)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def label_once(seen: set, label: str) -> str | None:
    """A legend entry for the first line of each label; the seeds' other lines stay unlabelled."""
    if label in seen:
        return None
    seen.add(label)
    return label


def per_run_panels(groups, title, ylabel, has_data, draw) -> bytes | None:
    """A panel per comparison set, draw(ax, group, run, colour, seen) for every run that has the data."""
    chosen = {p: gs for p, gs in panels(groups).items() if any(has_data(r) for g in gs for r in g["runs"])}
    if not chosen:
        return None
    colour = colours(groups)
    fig, axes = grid(len(chosen), title)
    for ax, (panel, members) in zip(axes, chosen.items()):
        seen = set()
        for g in members:
            for run in g["runs"]:
                if has_data(run):
                    draw(ax, g, run, colour[g["mode"]], seen)
        ax.set_title(panel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return png(fig)


def val_loss(groups: list[dict]) -> bytes | None:
    def draw(ax, g, run, colour, seen):
        steps, tokens, loss = zip(*run["curve"])
        ax.plot(tokens, loss, color=colour, marker=".", lw=1, alpha=0.8, label=label_once(seen, g["mode"]))
        if g["target"] is not None and "target" not in seen:
            ax.axhline(g["target"], color="black", ls=":", lw=1, label=label_once(seen, "target"))
        ax.set_xlabel("tokens seen")

    return per_run_panels(groups, "Validation loss during training (in-training subset; one line per seed)",
                          "validation loss (nats)", lambda r: bool(r["curve"]), draw)


def grad_cos(groups: list[dict]) -> bytes | None:
    def draw(ax, g, run, colour, seen):
        steps, cos = zip(*run["grad"])
        ax.plot(steps, cos, color=colour, lw=1, alpha=0.8, label=label_once(seen, g["mode"]))
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlabel("step")

    return per_run_panels(groups, "Cosine of the input-path and output-path gradients of the token matrices (one line per seed)",
                          "cos(G_in, G_out)", lambda r: bool(r["grad"]), draw)


def drift(groups: list[dict]) -> bytes | None:
    def draw(ax, g, run, colour, seen):
        steps, d_in, d_out = zip(*run["drift"])
        ax.plot(steps, d_in, color=colour, marker=".", lw=1, label=label_once(seen, f"{g['mode']} input" + (" = output" if run["tied_geometry"] else "")))
        if any(d is not None for d in d_out):
            ax.plot(steps, d_out, color=colour, marker=".", lw=1, ls="--", label=label_once(seen, f"{g['mode']} output"))
        ax.set_xlabel("step")

    return per_run_panels(groups, "Drift from initialisation |W - W0| / |W0| (solid: input embedding, dashed: output matrix)",
                          "relative drift", lambda r: bool(r["drift"]), draw)


def ppl_vs_params(groups: list[dict]) -> bytes | None:
    points = [g for g in groups if g["stats"]["perplexity"]]
    if not points:
        return None
    colour = colours(groups)
    fig, (ax,) = grid(1, "Validation perplexity vs non-embedding parameters\n(mean over seeds; bars: 95% CI, none with one seed)")
    series = {}
    for g in points:
        series.setdefault(g["series"], []).append(g)
    for i, (name, members) in enumerate(series.items()):
        members.sort(key=lambda g: g["params"]["non_embedding"])
        x = [g["params"]["non_embedding"] for g in members]
        y = [g["stats"]["perplexity"]["mean"] for g in members]
        low = [m - (g["stats"]["perplexity"]["low"] if g["stats"]["perplexity"]["low"] is not None else m) for g, m in zip(members, y)]
        high = [(g["stats"]["perplexity"]["high"] if g["stats"]["perplexity"]["high"] is not None else m) - m for g, m in zip(members, y)]
        ax.errorbar(x, y, yerr=[low, high], color=colour[members[0]["mode"]], marker="os^vD"[i % 5], capsize=4, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("validation perplexity")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return png(fig)


def spectra(groups: list[dict]) -> bytes | None:
    measured = [g for g in groups if g["runs"][0]["spectra"]]
    if not measured:
        return None
    colour = colours(groups)
    style = {panel: ("-", "--", ":", "-.")[i % 4] for i, panel in enumerate(panels(measured))}  # colour: mode; line: size
    fig, axes = grid(2, "Singular values at the last geometry step (each group's lowest seed)")
    for side, ax in enumerate(axes):
        for g in measured:
            values = g["runs"][0]["spectra"][side]
            ax.plot(range(1, len(values) + 1), values, color=colour[g["mode"]], ls=style[g["panel"]],
                    lw=1.2, label=g["label"] + (" (shared)" if g["runs"][0]["tied_geometry"] else ""))
        ax.set_yscale("log")
        ax.set_title(("input embedding", "output matrix")[side])
        ax.set_xlabel("index (descending)")
        ax.set_ylabel("singular value")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return png(fig)


def draw_all(groups: list[dict]) -> dict[str, bytes | None]:
    """Every figure by file name, None where no run has the data."""
    return {"val_loss.png": val_loss(groups), "ppl_vs_params.png": ppl_vs_params(groups), "grad_cos.png": grad_cos(groups),
            "drift.png": drift(groups), "spectra.png": spectra(groups)}
