# Used by `tiecli report`: what it prints on the terminal.
"""The terminal gets the headline, a short claims table and the warnings (terminal), and points to
report.md for the rest; a table wider than the console is split into narrower ones, each with the
first column, so that no column is dropped and no header cut (rich_tables)."""

from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tiecli.report.claims_rules import Claim, ClaimId
from tiecli.report.gate import WITHHELD
from tiecli.report.load import Skipped
from tiecli.report.render import NO_DATA, NOT_TESTED, TableSpec

FOLD_MIN = 8  # on the terminal, a text column is at least this wide (or its header's width) before the table is split


def _drawn_width(widths: list[int]) -> int:
    """A rich table's width: each column, a space either side and a border; and the left edge."""
    return sum(widths) + 3 * len(widths) + 1


def _measure(spec: TableSpec, width: int) -> list[tuple[int, int, int]]:
    """Per column (need, word, natural). need: the least width it is drawn with, never under its header's
    (a column that does not fit at its need goes to the next table); word: its longest word's; natural:
    its longest cell's."""
    out = []
    for i, header in enumerate(spec.columns):
        cells = [row[i] for row in spec.rows]
        natural = max(len(text) for text in (header, *cells))
        word = max((len(w) for text in cells for w in text.split()), default=1)
        if i == 0:  # the group, repeated in every table: folded past a quarter of the width
            need = min(natural, max(len(header), width // 4))
            natural = max(need, word) if spec.text else natural  # folded text: no wider than that (or its longest word)
        elif spec.text:  # folded text
            need = max(len(header), min(word, FOLD_MIN))
        else:  # numbers: never broken inside one
            need = max(len(header), word)
        out.append((need, min(max(word, need), natural), natural))
    return out


def split_columns(needs: list[int], width: int) -> list[list[int]]:
    """Column indices of each terminal table: the first column in each and the others in order, in as few
    tables as fit width, with about as many columns in each (else packed in order)."""
    packed = [[0]]
    for i in range(1, len(needs)):
        if len(packed[-1]) > 1 and _drawn_width([needs[c] for c in [*packed[-1], i]]) > width:
            packed.append([0])
        packed[-1].append(i)
    k, rest = len(packed), list(range(1, len(needs)))
    ends = [round(len(rest) * (n + 1) / k) for n in range(k)]
    even = [[0, *rest[start:end]] for start, end in zip([0, *ends], ends)]
    return even if all(_drawn_width([needs[c] for c in chunk]) <= width for chunk in even) else packed


def fit_widths(need: list[int], word: list[int], natural: list[int], width: int, text: bool = False) -> list[int]:
    """Column widths from their needs up to width: first so that words stay whole, then whole cells, the
    columns that lack the least first (numbers: as many whole cells as fit); text: the room left shared
    in proportion to what each column lacks, so that a long text column is not squeezed to a word a line
    by short ones made whole."""
    widths = list(need)
    for target in (word, natural):
        if text and target is natural:
            return share(widths, natural, width)
        for i in sorted(range(len(widths)), key=lambda i: target[i] - widths[i]):
            widths[i] += max(0, min(target[i] - widths[i], width - _drawn_width(widths)))
    return widths


def share(widths: list[int], natural: list[int], width: int) -> list[int]:
    """widths grown toward natural by the room left within width, in proportion to each column's lack."""
    lack = [max(0, n - w) for w, n in zip(widths, natural)]
    room = max(0, width - _drawn_width(widths))
    if sum(lack) <= room:
        return [max(w, n) for w, n in zip(widths, natural)]
    return [w + room * gap // sum(lack) for w, gap in zip(widths, lack)]


def rich_tables(spec: TableSpec, width: int) -> list[Table]:
    """The spec as terminal tables no wider than width: wide specs split, each part with the first column,
    every header whole; the note under the last."""
    measured = _measure(spec, width)
    chunks = split_columns([m[0] for m in measured], width)
    tables = []
    for n, chunk in enumerate(chunks, 1):
        need, word, natural = ([measured[c][k] for c in chunk] for k in range(3))
        widths = fit_widths(need, word, natural, width, spec.text)
        title = spec.title + (f" ({n}/{len(chunks)})" if len(chunks) > 1 else "")
        # escape(): "[95% CI]" and "[low, high]" are text here, not rich markup
        table = Table(
            title=escape(title), caption=escape(spec.note) if n == len(chunks) else None, caption_justify="left"
        )
        for c, w in zip(chunk, widths):
            justify: JustifyMethod = "left" if c == 0 or spec.text else "right"
            table.add_column(escape(spec.columns[c]), width=w, justify=justify, overflow="fold")
        for row in spec.rows:
            table.add_row(*(escape(row[c]) for c in chunk))
        tables.append(table)
    return tables


@dataclass
class TerminalTable:
    """A spec to print: rich_tables at the console's width, decided when it is printed."""

    spec: TableSpec

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        yield from rich_tables(self.spec, options.max_width)


def rich_table(spec: TableSpec) -> TerminalTable:
    return TerminalTable(spec)


# Each claim's name beside its id, for the terminal's short table (report.md has the claim's full text under Rules).
NAMES = {
    ClaimId.R2: "largest tensor",
    ClaimId.C1: "parameter share saved",
    ClaimId.R4: "gradient cancellation, whole matrix",
    ClaimId.R4_PAIRS: "gradient opposition, related forms",
    ClaimId.R3: "related forms: pulled in, pushed out",
    ClaimId.C2_C7: "input and output spaces kept close",
    ClaimId.R6: "untied converges faster",
    ClaimId.C3: "tied converges faster",
    ClaimId.R6_SCHEDULE: "steps to a target, one schedule",
    ClaimId.C6: "tying lowers perplexity",
    ClaimId.R5_C6_SMALLEST: "tying helps the smallest model",
    ClaimId.R5_C6_TREND: "tying's help shrinks with size",
    ClaimId.R5_C6: "tying helps small models, less large",
    ClaimId.R5: "untying wins with more data",
    ClaimId.R5_C2_GAP: "tying regularises: raw gap",
    ClaimId.R5_C2_GAP_EQUAL_FIT: "tying regularises: gap at equal fit",
    ClaimId.C2_C7_DRIFT: "tying reduces embedding drift",
    ClaimId.C2_SPIKES: "tying stabilises: loss spikes",
    ClaimId.C2_GRAD_NORM: "tying stabilises: gradient norm",
    ClaimId.C2_DIVERGENCE: "tying stabilises: divergence",
}


def claims_summary(claim_rows: list[Claim]) -> TableSpec:
    """The claims table for the terminal: each claim by id and name, what it measured and its verdict, label included."""
    return TableSpec(
        "Claims (tied vs untied, equal architecture unless stated)",
        "pilot verdicts (see above) show what the rule computed, to be confirmed; a withheld row has no verdict, only "
        "what the rule alone would give; why, figures and rules: report.md",
        ["claim", "comparison", "verdict", "measured [95% CI]"],
        [[f"{c.claim}: {NAMES.get(c.claim, c.says)}", c.comparison, *short_verdict(c)] for c in claim_rows],
        text=True,
    )


def short_verdict(row: Claim) -> list[str]:
    """(verdict, measured); a row without data, or not tested, says why where the measurement would be; a withheld
    verdict reads as none, with what the rule alone gives."""
    for untested in (NO_DATA, NOT_TESTED):
        if row.verdict.startswith(untested):
            why = row.verdict.removeprefix(untested).removeprefix(":").strip()
            return [untested, "; ".join(part for part in (why, row.measured if untested == NOT_TESTED else "") if part)]
    if row.verdict.startswith(f"{WITHHELD}: "):
        return [f"{WITHHELD}, no verdict (rule alone: {row.verdict.removeprefix(f'{WITHHELD}: ')})", row.measured]
    return [row.verdict, row.measured]


def terminal(
    headline: list[str], claim_rows: list[Claim], specs: list[TableSpec], skipped: list[Skipped], header: str, page: str
):
    """What `tiecli report` prints: the headline, the short claims table, the warnings, one line per run
    left out, the header (runs, groups, sources) and where the full tables are (page: report.md's path).
    Yields rich renderables."""
    for line in headline:
        yield Text(line)
    yield Text("")
    yield rich_table(claims_summary(claim_rows))
    yield from (rich_table(s) for s in specs if s.title == "Warnings")
    for s in skipped:
        yield Text(f"skipped {s.path}: {s.reason}")
    yield Text(header)
    yield Text(f"every table, the figures and the rules: {page}")
