# tiecli runs [DIR]
"""One line per run directory, readable or not: name, state, size, mode, steps, val perplexity."""

import math
from pathlib import Path

from rich.table import Table

from tiecli.errors import TiecliError
from tiecli.formats import num as _num
from tiecli.report.load import find_run_dirs, reason
from tiecli.run.files import FormatError
from tiecli.run.reader import RunReader

COLUMNS = ("name", "state", "size", "mode", "steps", "val perplexity")
NUMBERS = ("steps", "val perplexity")  # right-aligned
FOLDED = ("name", "state")  # long names and reasons fold over lines; the other cells are short


def runs_table(path: Path) -> Table:
    """Every run directory under path; a run whose writer died while it was `running` shows `interrupted`."""
    dirs = find_run_dirs([path])
    if not dirs:
        raise TiecliError(f"no run directories under {str(path)!r}")
    lines = [run_line(run, path) for run in dirs]
    keyword = max(len(line[1].split()[0]) for line in lines)  # "completed", "interrupted", "unreadable:"
    table = Table(title=f"runs under {path}")
    for column in COLUMNS:  # every header and state keyword whole; only the name and the state fold to fit the terminal
        table.add_column(
            column,
            justify="right" if column in NUMBERS else "left",
            no_wrap=column not in FOLDED,
            min_width=max(len(column), keyword if column == "state" else 0),
            overflow="fold",
        )
    for line in lines:
        table.add_row(*line)
    return table


def run_line(path: Path, root: Path) -> list[str]:
    name = str(path.relative_to(root)) if path != root else path.name  # sweeps nest runs: show where
    reader = RunReader(path)
    try:
        config, choices, summary, status = (
            reader.config(),
            reader.overrides()["choices"],
            reader.summary(),
            reader.status(),
        )
        assert status is not None  # summary() above read summary.json, so the status is set
        final = (reader.final_val() or {}) if status == "completed" else {}
        if final and not math.isfinite(final.get("loss", 0.0)):
            status += ", val loss not finite: left out of reports"
        return [
            name,
            status,
            str(choices["model"]),
            str(config["tying"]["mode"]),
            f"{summary.step:,}/{summary.max_steps:,}",
            _num(final.get("perplexity"), ".2f"),
        ]
    except FormatError as e:
        return [name, f"unreadable: {reason(e, reader.name)}", "-", "-", "-", "-"]
    except (KeyError, TypeError) as e:
        return [name, f"unreadable: a file lacks an expected field ({type(e).__name__}: {e})", "-", "-", "-", "-"]
