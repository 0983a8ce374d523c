"""`tiecli runs` on an 80-column terminal: long names fold, every header and every run's state shows."""

import math

from helpers import LOSS, write_run
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.report.listing import COLUMNS

runner = CliRunner()
LONG = "micro-tied_scaled-bpe4096-shakespeare-s{seed},train.max_tokens=524288,train.lr=0.003,train.warmup_steps=20"


def rows(output: str) -> dict[str, list[str]]:
    """The table as {name: cells}: a folded name joined back as it was cut, the other cells' lines with spaces."""
    found = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[4]:  # a run's first line: its steps, on one line, are "-" at least
            found.append(cells)
        elif cells:
            found[-1] = [found[-1][0] + cells[0], *(" ".join(filter(None, ab)) for ab in zip(found[-1][1:], cells[1:]))]
    return {cells[0]: cells for cells in found}


def test_runs_fit_80_columns_with_every_header_and_state(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        write_run(root, "micro", "tied", seed).rename(root / LONG.format(seed=seed))
    write_run(root, "nano", "untied", 0, status="failed")
    writer = write_run(root, "nano", "tied", 0, status="running", keep_open=True)
    (root / "broken").mkdir()
    (root / "broken" / "summary.json").write_text('{"status": "completed"}\n')
    try:
        outputs = {width: runner.invoke(app, ["runs", str(root)], env={"COLUMNS": str(width)}) for width in (80, 72)}
    finally:
        writer.close()
    for width, result in outputs.items():  # 72: a little above the narrowest that fits every header and state keyword
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert max(map(len, lines)) <= width and "…" not in result.output
        header = next(line for line in lines if line.startswith("┃"))
        assert [c.strip() for c in header.split("┃")[1:-1]] == list(COLUMNS)
        table = rows(result.output)
        assert {name: cells[1] for name, cells in table.items()} == {
            LONG.format(seed=0): "completed",
            LONG.format(seed=1): "completed",
            "nano-untied-s0": "failed",
            "nano-tied-s0": "running",
            "broken": "unreadable: config.yaml does not exist",
        }
        assert table[LONG.format(seed=0)][2:] == [
            "micro",
            "tied",
            "20/20",
            f"{math.exp(LOSS[('micro', 'tied')][0]):.2f}",
        ]
