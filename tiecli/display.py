# Used by the CLI commands to print results; rich tables only, no computation.
"""Terminal output: training progress, and tables for a run's summary, an evaluation, a parameter breakdown."""

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

PLAIN_EVERY_S = 30.0  # without a terminal, a progress line at most this often (and at log steps only)

PARAM_ROWS = (
    ("input_embedding", "input embedding"),
    ("output_matrix", "output matrix"),
    ("shared", "shared (input = output)"),
    ("positional", "positional"),
    ("non_embedding", "non-embedding"),
    ("total", "total"),
)


def params_table(counts: dict[str, int], title: str = "parameters") -> Table:
    table = Table(title=title)
    table.add_column("part")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    for key, label in PARAM_ROWS:
        table.add_row(label, f"{counts[key]:,}", f"{counts[key] / counts['total']:.1%}")
    if "tied_phase_total" in counts:  # tying=tied_then_untied: before the switch lm_head is idle
        tied = counts["tied_phase_total"]
        table.add_row("total before untie_at", f"{tied:,}", f"{tied / counts['total']:.1%}")
    return table


def eval_table(metrics: dict, title: str) -> Table:
    table = Table(title=title)
    for column in ("tokens", "loss", "perplexity", "bits/byte"):
        table.add_column(column, justify="right")
    table.add_column("")
    table.add_row(
        f"{metrics['n_tokens']:,}",
        f"{metrics['loss']:.4f}",
        f"{metrics['perplexity']:.2f}",
        f"{metrics['bits_per_byte']:.4f}",
        "all",
    )
    for bucket, m in metrics["by_bucket"].items():
        if m["n_tokens"]:
            table.add_row(f"{m['n_tokens']:,}", f"{m['loss']:.4f}", f"{m['perplexity']:.2f}", "", f"{bucket} tokens")
    return table


def summary_table(summary) -> Table:
    """A run's Summary."""
    table = Table(title=f"run {summary.name}: {summary.status}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    p = summary.params
    embedding = p["input_embedding"] + p["output_matrix"] + p["shared"]
    rows = [
        ("parameters", f"{p['total']:,} ({embedding / p['total']:.1%} token embedding/output)"),
        *([("parameters before untie_at", f"{p['tied_phase_total']:,}")] if "tied_phase_total" in p else []),
        ("steps", f"{summary.step:,} / {summary.max_steps:,}"),
        ("tokens", f"{summary.tokens:,}"),
        ("train time", f"{summary.train_time or 0:.1f} s ({summary.tokens_per_s or 0:,.0f} tokens/s)"),
        # dtype=auto trains in bf16 on one machine and fp32 on another: a quoted output says which it was
        ("precision", f"{summary.dtype}{'' if summary.dtype == 'fp32' else ' autocast'} on {summary.device}"),
    ]
    if summary.best_val_loss is not None:
        rows.append(("best val loss (subset)", f"{summary.best_val_loss:.4f} at step {summary.best_val_step}"))
    final = summary.final_val
    if final:
        rows += [
            ("val loss", f"{final['loss']:.4f}"),
            ("val perplexity", f"{final['perplexity']:.2f}"),
            ("val bits/byte", f"{final['bits_per_byte']:.4f}"),
        ]
    for label, value in rows:
        table.add_row(label, value)
    return table


GEOMETRY_ROWS = (
    ("norm_mean", "row norm, mean"),
    ("norm_freq_spearman", "norm vs log frequency (Spearman)"),
    ("anisotropy", "anisotropy (random-pair cosine)"),
    ("cosine_to_mean", "cosine to the mean row"),
    ("top_pc_share", "top principal component share (unit rows)"),
    ("isotropy", "isotropy (Mu & Viswanath, unit rows)"),
    ("effective_rank", "effective rank"),
    ("stable_rank", "stable rank"),
    ("top_share", "top singular value share"),
    ("drift", "drift from init"),
    ("drift_rare", "drift from init, rare tokens"),
    ("forms_cosine", "related forms: pair cosine"),
    ("forms_matched_cosine", "related forms: frequency-matched random cosine"),
    ("forms_contrast", "related forms: contrast (pair - matched)"),
    ("forms_random_cosine", "related forms: random-pair cosine"),
)
AGREEMENT_ROWS = (
    ("row_cosine", "input/output cosine per token"),
    ("distance", "|W_in - W_out|_F / |W_in|_F"),
    ("knn_overlap", "10-NN overlap"),
    ("cka", "linear CKA"),
)


def num(value, spec: str = ".4g") -> str:
    """A number for a table; "-" where there is none."""
    return "-" if value is None else format(value, spec)


def geometry_table(entry: dict, title: str) -> Table:
    """One geometry.json entry: a column per side (one when tied), then input/output agreement."""
    sides = (
        [("input = output", entry["input"])]
        if entry["tied"]
        else [("input", entry["input"]), ("output", entry["output"])]
    )
    table = Table(title=f"{title}: {entry['n_tokens']:,} tokens that occur in training")
    table.add_column("geometry")
    for name, _ in sides:
        table.add_column(name, justify="right")
    for key, label in GEOMETRY_ROWS:
        if any(key in side for _, side in sides):
            table.add_row(label, *(num(side.get(key)) for _, side in sides))
    if "forms_n_pairs" in entry["input"]:
        table.add_row("related forms: pairs used", *(str(side["forms_n_pairs"]) for _, side in sides))
    for key, label in AGREEMENT_ROWS:
        if entry["agreement"]:
            table.add_row(label, num(entry["agreement"].get(key)), *[""] * (len(sides) - 1))
    return table


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
