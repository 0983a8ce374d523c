# Used by the CLI commands to print results; rich tables only, no computation.
"""Terminal output: tables for a run's summary, an evaluation, a parameter breakdown, a geometry entry.

Training's progress bar and the number formats the commands print themselves are in tiecli/formats.py.
"""

from rich.table import Table

from tiecli.formats import num

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


def pretrained_table(entry: dict, label: str) -> Table:
    """`tiecli geometry --model`'s entry as geometry_table shows a run's, titled for the pretrained model `label`."""
    table = geometry_table(entry, label)
    table.title = f"{label}: geometry of {entry['n_tokens']:,} tokens (control and unused tokens left out)"
    return table
