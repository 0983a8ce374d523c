# tiecli report [RUNS_OR_SWEEPS...] [--baseline tying=untied] [--select KEY] [--sesoi KEY=VALUE] [--target-loss X]
#   [--family NAME=CLAIMS] [--out DIR]
#   and   tiecli runs [DIR]
"""From finished run directories to tables, plots and a verdict on each claim of CLAIMS.md.

Reads run directories only through RunReader (config, overrides, summary, metrics, eval,
geometry); never imports torch. The steps, one module each:
  load     which folders are runs; each usable run as a typed `Run`, or the reason it is skipped
  groups   runs into `Group`s (one setting, several seeds), their labels, --select, the `Baseline`
  stats    intervals and tests over seeds, each run's values and convergence
  compare  each group against the baseline: paired by seed, at equal parameters and equal compute
  claims   a verdict on each claim, one tying mode against another, Holm-corrected: claims_rules (texts, rules,
           the row), claims_embedding / claims_scaling / claims_stability (the rows, by family of claim)
  gate     the verdicts labelled pilot or withheld when the runs cannot carry them, and why
  headline what was compared, the main difference, how far the runs got: the report's first lines
  tables   the tables every report has;  rule_tables  the tables behind the claims' rules
  render   a table spec, report.md and report.html;  terminal  what the command prints
  plots    the figures
  results  results.csv and results.json;  listing  `tiecli runs`

Every rule is stated once, in stated_rules, and printed in every report and in results.json.
"""

import dataclasses
import json
import math
import os
from pathlib import Path

from tiecli.errors import TiecliError
from tiecli.report import (
    claims,
    claims_rules,
    claims_stability,
    compare,
    gate,
    headline,
    load,
    reference,
    render,
    results,
    rule_tables,
    stats,
    tables,
    terminal,
)
from tiecli.report.groups import (
    IGNORED_KEYS,
    IGNORED_PREFIXES,
    Baseline,
    Group,
    NotSelected,
    check_select,
    group_runs,
    select,
    units,
)
from tiecli.report.listing import runs_table
from tiecli.run.files import staged

__all__ = ["Options", "report", "runs_table"]
DEFAULT_BASELINE = Baseline(
    "tying", "untied"
)  # the CLI's default: a selection without untied runs simply has no baseline


def default_out(paths: list[Path]) -> Path:
    """report/ inside the sweep folder when one sweep is given, else ./report."""
    if len(paths) == 1 and (paths[0] / "sweep.json").is_file():
        return paths[0] / "report"
    return Path("report")


def check_out(out: Path) -> None:
    """The output folder must be a folder, or creatable as one: one line, before anything is computed."""
    for folder in (out, *out.parents):
        if folder.is_dir():
            return
        if folder.exists():
            raise TiecliError(
                f"--out {str(out)!r} is a file, not a folder"
                if folder == out
                else f"--out {str(out)!r} cannot be made: {str(folder)!r} is a file"
            )


@dataclasses.dataclass(frozen=True)
class Options:
    """How the report judges: --select keys, --sesoi values (SESOI_DEFAULTS' units), --target-loss, --family."""

    select: tuple[str, ...] = ()
    sesoi: tuple[str, ...] = ()
    target_loss: float | None = None
    families: tuple[str, ...] = ()

    def checked(self, axis: Baseline) -> dict[str, float]:
        """The SESOI values; one line for a bad option, before any run is read."""
        if self.target_loss is not None and not (math.isfinite(self.target_loss) and self.target_loss > 0):
            raise TiecliError(f"--target-loss {self.target_loss} must be a positive loss in nats")
        if axis.key in self.select:
            raise TiecliError(f"--select {', '.join(self.select)}: cannot select on the baseline's key {axis.key}")
        return claims_rules.parse_sesoi(list(self.sesoi))


def load_groups(paths: list[Path]):
    """The usable runs, their groups, every run left out with why, and the second runs of one seed."""
    runs, skipped = load.load_runs(paths)
    groups, twins = group_runs(runs)
    skipped += twins
    if not groups:
        where = ", ".join(map(str, paths))
        raise TiecliError(
            f"no completed run directories under {where}"
            + (f" ({len(skipped)} skipped; `tiecli runs` says why)" if skipped else "")
        )
    return runs, groups, skipped, twins


@dataclasses.dataclass(frozen=True)
class Selection:
    """The runs read, grouped and selected: the groups --select kept; the groups before it (candidates: gate reads
    whether a learning rate was chosen from a grid); every run left out; the groups --select left out; what is read
    before --select (the divergence row's grid, every learning rate; the scope, every run); the Holm families."""

    groups: list[Group]
    candidates: list[Group]
    skipped: list[load.Skipped]
    dropped: list[NotSelected]
    grid: list[claims_stability.Outcome]
    scope: dict
    families: dict[str, tuple[str, ...]]
    family_source: str


def selected(paths: list[Path], axis: Baseline, options: Options, chosen) -> Selection:
    """The runs under paths as groups, --select applied; chosen: the --family option's families, if any."""
    runs, groups, skipped, _ = load_groups(paths)
    families, family_source = (chosen, "--family") if chosen else claims.declared_families([r.path for r in runs])
    if axis != DEFAULT_BASELINE:
        axis.check(groups)
    grid = claims_stability.outcomes(groups, [s.diverged for s in skipped if s.diverged])
    scope = results.scope([r for g in groups for r in g.runs])
    check_select(groups, options.select, axis)
    kept, dropped = select(groups, options.select)
    return Selection(kept, groups, skipped, dropped, grid, scope, families, family_source)


@dataclasses.dataclass(frozen=True)
class Compared:
    """The groups against the baseline: the groups compared (see compared), each non-baseline group's comparison,
    and each non-baseline group against the baseline at its total parameters (equal) and its FLOPs (compute)."""

    groups: list[Group]
    comparisons: list[compare.Comparison]
    equal: dict[str, compare.EqualParams]
    compute: dict[str, compare.EqualParams]


def compare_all(groups: list[Group], axis: Baseline, target_loss: float | None) -> Compared:
    groups, comparisons = compared(groups, compare.compare(groups, axis, target_loss), axis)
    others = [g for g in groups if not axis.matches(g)]
    return Compared(
        groups,
        comparisons,
        {g.label: compare.equal_params(g, groups, axis) for g in others},
        {g.label: compare.equal_compute(g, groups, axis) for g in others},
    )


def report(paths: list[Path], baseline: str, out: Path | None, console, options: Options = Options()) -> Path:
    """Read, group, compare and judge the runs under paths; print the tables and write the report folder."""
    from tiecli.report import plots  # matplotlib: loaded by `tiecli report`, not by `tiecli runs`

    axis = Baseline.parse(baseline)
    sesoi = options.checked(axis)
    chosen = claims.family_option(list(options.families))
    out = out or default_out(paths)
    check_out(out)
    selection = selected(paths, axis, options, chosen)
    done = compare_all(selection.groups, dataclasses.replace(axis, free=options.select), options.target_loss)
    groups, skipped = done.groups, selection.skipped
    claim_rows = claims.claims(
        groups,
        sesoi=sesoi,
        target=options.target_loss,
        free=options.select,
        grid=selection.grid,
        families=selection.families,
    )
    conditions, shown, top = labelled(groups, selection.candidates, claim_rows, done.comparisons, options.select)
    added = rule_tables.added_tables(groups, done.comparisons, done.compute, selection.dropped, baseline)
    references = reference.load_all(paths)  # pretrained models (tiecli geometry --model --out) under paths
    specs = tables.build_tables(
        tables.TableInputs(groups, done.comparisons, done.equal, shown, skipped, baseline, added, references)
    )
    rules = stated_rules(baseline, sesoi, options) | family_rules(claim_rows, selection.family_source)
    rules |= {"units": units(groups)}
    header = (
        f"{sum(len(g.runs) for g in groups)} runs in {len(groups)} groups{not_selected(selection.dropped)}, "
        f"{len(skipped)} skipped; baseline {baseline}; sources: {', '.join(map(str, paths))}; "
        f"{results.scope_text(selection.scope)}"
    )
    for renderable in terminal.terminal(top, shown, specs, skipped, header, str(out / "report.md")):
        console.print(renderable)
    images, absent = plots.draw_all(groups)  # absent: a line for each figure not drawn, saying why
    rows = results.result_rows(groups, done.comparisons, done.equal, done.compute) + results.divergence_rows(
        claims_stability.grid_pairs(selection.grid)
    )
    made = settings(sesoi, options, selection.scope, claim_rows, selection.family_source, selection.dropped)
    write(
        out,
        {
            **{name: png for name, png in images.items() if png},
            "report.md": render.markdown_page(header, rules, specs, images, absent, top),
            "report.html": render.html_page(header, rules, specs, images, absent, top),
            "results.csv": results.csv_text(rows),
        },
        results.results_json(baseline, rules, rows, claim_rows, skipped, labels(top, shown, conditions) | made),
    )
    console.print(f"report written to {out}")
    return out


def not_selected(dropped) -> str:
    """The header's count of what --select left out, in runs and in groups."""
    if not dropped:
        return ""
    runs = sum(d.runs for d in dropped)
    return f" ({runs} more run{'s' if runs != 1 else ''} in {len(dropped)} group{'s' if len(dropped) != 1 else ''} not selected)"


def settings(sesoi: dict, options: Options, scope: dict, claim_rows, family_source: str, dropped) -> dict:
    """results.json's record of how the report was made: SESOIs, target, --select, families, scope."""
    return {
        "sesoi": sesoi,
        "target_loss": options.target_loss,
        "select": list(options.select),
        "multiple_comparisons": "holm",
        "scope": scope,
        "families": claims.family_rows(claim_rows),
        "family_source": family_source,
        "not_selected": [dataclasses.asdict(d) for d in dropped],
    }


def labelled(groups, candidates, claim_rows, comparisons, select: tuple[str, ...]):
    """The gate's conditions per group, the claims as shown (labelled pilot or withheld), and the headline."""
    found = gate.conditions(groups, candidates, select)
    shown = gate.label_rows(claim_rows, groups, found, select)
    return found, shown, headline.lines(groups, shown, found, comparisons, select)


def labels(top: list[str], shown: list[claims_rules.Claim], found: dict[str, list[gate.Condition]]) -> dict:
    """results.json's headline and labels: the strongest label, each condition that fired with its fix, each
    row's verdict as shown (the claims keep the verdicts their rules computed)."""
    return {
        "headline": top,
        "labels": {
            "label": gate.strongest(found),
            "conditions": [{"found": what, "fix": fix} for what, fix in gate.summary(found)],
            "shown": [{"claim": c.claim, "comparison": c.comparison, "verdict": c.verdict} for c in shown],
        },
    }


def compared(
    groups: list[Group], comparisons: list[compare.Comparison], axis: Baseline
) -> tuple[list[Group], list[compare.Comparison]]:
    """The groups, each with its pair's convergence target (none for a baseline), its statistics and the axis its
    figure panel and series leave out (axis.free: the --select keys); and the comparisons, made of those groups."""
    targets = {c.group.label: c.target for c in comparisons}
    done: dict[int, Group] = {}
    for g in groups:
        with_target = dataclasses.replace(g, target=targets.get(g.label), axis=axis)
        done[id(g)] = dataclasses.replace(with_target, stats=stats.aggregate(with_target))
    return list(done.values()), [
        dataclasses.replace(c, group=done[id(c.group)], base=done[id(c.base)]) for c in comparisons
    ]


def family_rules(rows: list[claims_rules.Claim], source: str) -> dict[str, str]:
    """Which tested rows form which Holm family, for the Rules section (and results.json's rules)."""
    where = {
        "default": "default: one family per claim and study (the folder holding the runs; a family's name adds its "
        "study's when the report reads more than one), across the study's sizes, budgets and vocabularies",
        "--family": "chosen with --family; claims it does not name form one family each",
    }.get(source, f"{source}; claims it does not name form one family each")
    listed = "; ".join(f"{name} ({len(tests)}): {', '.join(tests)}" for name, tests in claims.family_rows(rows).items())
    return {"families": f"{where}. Holm within each: {listed or 'no tested rows'}"}


REPORT_FILES = {"report.md", "report.html", "results.csv", "results.json", *render.PLOT_TITLES}


def write(out: Path, files: dict[str, str | bytes], results_json: dict) -> None:
    """The report's files, all or none: each is staged under a temporary name in out, then all are renamed
    into place (renames need no space) and an earlier report's files this one lacks (a figure) removed, so a
    full disk leaves the earlier report whole. Other files in out are left alone."""
    files = {**files, "results.json": json.dumps(results_json, indent=2) + "\n"}
    temporaries: dict[str, Path] = {}
    try:
        for name, data in files.items():
            temporaries[name] = staged(out / name, data)
        for name, tmp in temporaries.items():
            os.replace(tmp, out / name)
        for name in REPORT_FILES - files.keys():
            (out / name).unlink(missing_ok=True)
    except OSError as e:
        for tmp in temporaries.values():
            tmp.unlink(missing_ok=True)
        where = f" ({Path(e.filename).name})" if e.filename else ""
        raise TiecliError(
            f"cannot write the report to {str(out)!r}: {e.strerror or e}{where}; any report there is left as it was"
        ) from None


def stated_rules(baseline: str, sesoi: dict[str, float], options: Options) -> dict[str, str]:
    """Every rule the numbers follow, printed at the end of report.md and report.html and kept in results.json."""
    ignored_keys = ", ".join(
        [*IGNORED_KEYS, *(p + "*" for p in IGNORED_PREFIXES), "train.max_steps when train.max_tokens is set"]
    )
    margin = claims_rules.margins(sesoi)
    target = (
        f"--target-loss {options.target_loss:g} for every pair"
        if options.target_loss is not None
        else "per compared pair: the higher of the two groups' best in-training validation losses (each group's best: the highest "
        "of its runs' lowest, so every run of the pair reaches the target); other groups in the report never move it"
    )
    return {
        "grouping": "same resolved config except seed; ignored keys: " + ignored_keys,
        "selection": (
            f"--select {' '.join(options.select)}: among groups equal but for these keys, the value with the lowest "
            "seed-mean final validation loss over the seeds they all have is kept, the others are listed as not selected; "
            "baselines are matched ignoring these keys, so each group is compared at its own best value"
        )
        if options.select
        else "none (--select)",
        "baseline": f"{baseline}: the group with that value equal in every other key; differences paired by seed",
        "interval": f"mean +- t({0.5 + stats.CONFIDENCE / 2}, n-1) * sd / sqrt(n) over seeds",
        "splits": "validation tables and --select: the whole validation split (eval.json val, else summary.json final_val); test "
        "table: eval.json test; claims on final loss use test when every run of the pair has it, else val (each row says)",
        "perplexity differences": "per seed Δloss = loss_group - loss_baseline (log perplexity), t-interval over seeds, shown as "
        "100 (exp(Δloss) - 1) % with the bounds transformed the same way",
        "convergence target": target
        + f"; steps interpolated linearly between evaluations; a note when fewer than {stats.MIN_EVALS} "
        "evaluations precede the target",
        "equal total parameters (smaller body)": "the baseline's loss linear in log(total parameters) between the two bracketing "
        "baseline sizes, seed by seed: an untied model of equal total has a smaller body and "
        f"fewer FLOPs; a baseline group within {compare.PARAMS_MATCH:.0%} of the group's total is read as is, "
        "paired by seed (a model narrowed to match it); n/a outside the baseline's sizes, or non-monotone: the "
        "baseline's seed-mean loss does not fall across the bracket",
        "equal compute": "training FLOPs = 6 x (non-embedding parameters + V x C) x tokens (the V x C output head is a matmul "
        "tied or not; the input lookup is not); the baseline's loss linear in log FLOPs across its sizes and token "
        "budgets, with the same bracket and non-monotone rules",
        "smallest effect of interest (SESOI)": "; ".join(text for _, text in margin.values())
        + " (--sesoi ppl=, cos=, cka=, drift=, gnorm=, spikes=)",
        "multiple comparisons": "Holm-Bonferroni correction on, within each family of the claims table's tested rows "
        "(tests against 0 and equivalence tests apart, each at 5% family-wise); verdicts use the adjusted p-values; the "
        "families are listed under families",
        "verdict": claims_rules.VERDICT_RULE,
        "verdict labels": gate.RULE,
        **{f"claim {k}": v for k, v in claims_rules.CLAIM_RULES.items()},
    }
