# Used by `tiecli train` (its progress), `tiecli sweep` and `tiecli report`; imports nothing of tiecli's.
"""Numbers and durations as text, and training's progress: what the running and command layers print.

The CLI's tables (tiecli/display.py) sit above every command; what a command or the training loop
prints itself lives here, below them, so that none of them reaches up to the command line.
"""

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

PLAIN_EVERY_S = 30.0  # without a terminal, a progress line at most this often (and at log steps only)


def num(value, spec: str = ".4g") -> str:
    """A number for a table; "-" where there is none."""
    return "-" if value is None else format(value, spec)


def typed(value) -> str:
    """A YAML value as it is typed on the command line: true, false and null for YAML's booleans and null."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def dash(value, spec: str) -> str:
    """A number on the bar; "—" where there is none yet."""
    return "—" if value is None else format(value, spec)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class TrainProgress:
    """Training progress: a rich bar on a terminal, plain lines in a log (nohup, SLURM, CI, a sweep's job log).

    The bar puts what matters first (step/total, loss, latest validation loss, tokens/s, ETA), so it
    survives 80 columns; the run's name gets a line of its own. With `compiling`, the bar says so
    until the first step ends. The ETA runs from the end of this session's first step, so neither the
    compile nor the first step's allocations count. Plain lines come at log steps, at most every
    PLAIN_EVERY_S seconds, plus one per evaluation.
    """

    def __init__(self, console: Console, name: str, total: int, start: int, log_interval: int, compiling: bool = False):
        self.console, self.name, self.total, self.start = console, name, total, start
        self.log_interval, self.started, self.compiling = log_interval, time.perf_counter(), compiling
        self.last_line, self.loss, self.tps, self.val = float("-inf"), None, None, None
        self.first: tuple[int, float] | None = None  # (step, time) at the end of the first step: the ETA's origin
        self.bar = (
            Progress(
                TextColumn("step {task.completed}/{task.total}"),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("val {task.fields[val]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TextColumn("{task.fields[eta]}"),
                BarColumn(bar_width=None),
                console=console,
                expand=True,
            )
            if console.is_terminal
            else None
        )

    def __enter__(self) -> "TrainProgress":
        self.console.print(f"training {self.name}", highlight=False, markup=False, soft_wrap=True)
        if self.bar:
            self.bar.start()
            eta = "compiling" if self.compiling else "ETA —"
            self.task = self.bar.add_task(
                "", total=self.total, completed=self.start, loss="—", val="—", tps="—", eta=eta
            )
        elif self.compiling:
            self.plain("compiling the training step (torch.compile); the first step waits for it")
        return self

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()

    def advance(self, step: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = (step, now)
        if self.bar:
            self.bar.update(self.task, completed=step, eta=f"ETA {duration(self.eta(step, now))}")

    def eta(self, step: int, now: float) -> float | None:
        """Seconds left at the pace since the first step ended (since the start, before any step ended)."""
        origin, since = self.first or (self.start, self.started)
        done = step - origin
        return (now - since) / done * (self.total - step) if done > 0 else None

    def log(self, row) -> None:
        """A metrics row was written: update the bar, or print a plain line when one is due."""
        if row.loss is not None:
            self.loss, self.tps = row.loss, row.tokens_per_s
        if row.val_loss is not None:
            self.val = row.val_loss
        if self.bar:
            self.bar.update(
                self.task, loss=dash(self.loss, ".3f"), val=dash(self.val, ".3f"), tps=dash(self.tps, ",.0f")
            )
            return
        now = time.perf_counter()
        if row.loss is not None and (now - self.last_line >= PLAIN_EVERY_S or row.step == self.total):
            self.last_line = now
            self.plain(
                f"step {row.step}/{self.total} loss {num(self.loss, '.4f')} {num(self.tps, ',.0f')} tok/s "
                f"elapsed {duration(now - self.started)} ETA {duration(self.eta(row.step, now))}"
            )
        if row.val_loss is not None:
            self.plain(f"eval step {row.step}/{self.total}: val loss {row.val_loss:.4f} (perplexity {row.val_ppl:.2f})")

    def plain(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)
