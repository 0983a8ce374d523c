# Used by `tiecli report`: whether the runs can carry a verdict at all, read after the claims are judged.
"""A pass over the finished claims table: each judged row keeps the verdict its rule computed, labelled
"pilot" or "withheld" when the runs behind it cannot carry a verdict, with the condition that fired and
how to fix it. The conditions, each read from the runs' own files, per group:

  plateau    the group's mean final validation perplexity is above PLATEAU_FRACTION x the unigram
             perplexity of its corpus (summary.json corpus.baselines): the runs have not left the
             unigram plateau, so a difference measures when each seed left it. Withholds the verdict.
  baselines  no unigram perplexity in summary.json (runs made before tiecli 0.1): the plateau cannot
             be told. Pilot.
  seeds      fewer than MIN_SEEDS seeds. Pilot.
  pick       --select chose the group's learning rate on fewer than MIN_SEEDS seeds (the units every rate of its
             grid has, or those the rates run on MIN_SEEDS or more share: groups.Pick): one seed's noise can pick
             the rate. Pilot.
  screen     a rate of the grid run on fewer seeds than the pick (a screen, groups.Pick) beat the pick on the
             seeds it has: the pick is not settled. Pilot.
  lr         the group's learning rate was not selected: no --select over a learning-rate key, or one
             whose grid held a single value for this group. Pilot.
  edge       the rate --select chose is the smallest or the largest its grid tried: the best rate may lie
             beyond the grid, so the optimum is not bracketed. Pilot (a two-point grid always fires it).

A row's label comes from the groups it reads (those its comparison names and each one's untied
baseline); the exact parameter counts (R2, C1) and the rows without data are never labelled."""

import dataclasses
import json
from dataclasses import dataclass

from tiecli.report.claims_rules import LADDER, Claim, ClaimId
from tiecli.report.groups import MIN_SEEDS, Baseline, Group, pick, values

PLATEAU_FRACTION = 0.5  # at most this multiple of the unigram perplexity: off the plateau
UNJUDGED = ("no data", "not tested", "descriptive")  # verdicts no rule reached: nothing to label
EXACT = (ClaimId.R2, ClaimId.C1)  # exact parameter counts: no training, no seeds, nothing to label
PILOT, WITHHELD = "pilot", "withheld"
KINDS = ("plateau", "baselines", "seeds", "pick", "screen", "lr", "edge")  # the order the report lists them in
RULE = (
    f"a verdict is withheld (shown as 'withheld: VERDICT', what the rule computed) when a group it reads is above "
    f"{PLATEAU_FRACTION:g}x its corpus's unigram perplexity (not off the unigram plateau), and labelled 'pilot: VERDICT' "
    f"when a group has fewer than {MIN_SEEDS} seeds, no unigram baseline in summary.json, or a learning rate not "
    "chosen by --select over two or more values of a learning-rate key (train.lr, train.lr_embedding, train.lr_output), "
    f"chosen on fewer than {MIN_SEEDS} seeds (the seeds every rate of its grid ran, or where some rates were screened on "
    f"fewer, those the rates run on {MIN_SEEDS} or more share), beaten on its seeds by a rate screened on fewer, "
    "or chosen at the smallest or largest value its grid tried (the best rate may lie beyond it); R2 and C1 (exact counts) and rows without data are never labelled"
)


@dataclass(frozen=True)
class Condition:
    """Why one group's verdicts are labelled, with what the kind reads: the group's perplexity over the
    unigram's (plateau), its seeds, its train.lr (lr), the chosen rate of `key` and the grid it was chosen from
    (edge); steps: its training steps."""

    kind: str
    group: str
    steps: int
    ratio: float = 0.0
    seeds: tuple[int, ...] = ()
    lr: float | None = None
    key: str = "train.lr"
    grid: tuple[float, ...] = ()
    null: bool = False  # the chosen value of `key` is null: lr is the train.lr it trains at
    rival: str = ""  # screen: the screened group's values of the selected keys

    @property
    def label(self) -> str:
        return WITHHELD if self.kind == "plateau" else PILOT


def rate(value) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def seeds_text(seeds) -> str:
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})"


def is_lr_key(key: str) -> bool:
    """train.lr, train.lr_embedding, train.lr_output: a peak learning rate (not train.min_lr, the decay's end)."""
    return key.rsplit(".", 1)[-1].startswith("lr")


def family(group: Group, candidates: list[Group], select: tuple[str, ...]) -> list[Group]:
    """The candidates (the groups before --select) equal to this group in every setting but the selected keys."""

    def rest(g: Group) -> str:
        return json.dumps({k: v for k, v in g.setting.items() if k not in select}, sort_keys=True)

    return [g for g in candidates if rest(g) == rest(group)]


def lr_tuned(members: list[Group], select: tuple[str, ...]) -> bool:
    """Whether --select chose a learning rate from two or more values among a group's family (`members`)."""
    return any(is_lr_key(key) and len({json.dumps(g.setting.get(key)) for g in members}) > 1 for key in select)


def peak_rate(group: Group, key: str):
    """The peak rate `key` gave its parameters: a token matrix's rate left null trains at train.lr
    (optim.lr_scale), so a grid of null and 2e-3 over a body at 1e-3 is the grid 1e-3, 2e-3."""
    value = group.setting.get(key)
    return group.setting.get("train.lr") if value is None and key != "train.lr" else value


def edges(group: Group, members: list[Group], select: tuple[str, ...]) -> list[Condition]:
    """An edge condition per selected learning-rate key whose chosen rate is the smallest or the largest
    its family (`members`) tried, each rate read as the parameters trained at it (peak_rate). A key
    every member leaves null (tied's train.lr_output) was not swept: its grid is empty."""
    out = []
    for key in filter(is_lr_key, select):
        if not any(isinstance(g.setting.get(key), int | float) for g in members):
            continue
        grid = tuple(sorted({v for g in members if isinstance(v := peak_rate(g, key), int | float)}))
        chosen = peak_rate(group, key)
        if len(grid) > 1 and chosen in (grid[0], grid[-1]):
            null = group.setting.get(key) is None
            out.append(Condition("edge", group.label, group.runs[0].steps, lr=chosen, key=key, grid=grid, null=null))
    return out


def group_conditions(group: Group, candidates: list[Group], select: tuple[str, ...]) -> list[Condition]:
    """The conditions that fire for one group (a compared one, its statistics filled: report.compared)."""
    steps = group.runs[0].steps
    out = []
    ppl, unigram = group.stats.get("perplexity"), group.stats.get("unigram_perplexity")
    if not (ppl and unigram):
        out.append(Condition("baselines", group.label, steps))
    elif ppl.mean > PLATEAU_FRACTION * unigram.mean:
        out.append(Condition("plateau", group.label, steps, ratio=ppl.mean / unigram.mean))
    seeds = tuple(r.seed for r in group.runs)
    if len(seeds) < MIN_SEEDS:
        out.append(Condition("seeds", group.label, steps, seeds=seeds))
    members = family(group, candidates, select)
    if not lr_tuned(members, select):
        out.append(Condition("lr", group.label, steps, lr=group.setting.get("train.lr")))
    elif len(picked := sorted((chosen := pick(members)).units)) < MIN_SEEDS:
        out.append(Condition("pick", group.label, steps, seeds=tuple(unit[0] for unit in picked)))
    else:
        for rival in chosen.rivals:
            seeds = tuple(sorted(unit[0] for unit in chosen.against(rival)[2]))
            out.append(Condition("screen", group.label, steps, seeds=seeds, rival=values(rival, select)))
    return out + edges(group, members, select)


def conditions(groups: list[Group], candidates: list[Group], select: tuple[str, ...]) -> dict[str, list[Condition]]:
    """{group label: its conditions} for every group; candidates: the groups before --select."""
    return {g.label: group_conditions(g, candidates, select) for g in groups}


def involved(row: Claim, groups: list[Group], axis: Baseline) -> list[Group]:
    """The groups a row reads: those its comparison names (a ladder names several) and their baselines;
    every group when the comparison names none."""
    by_label = {g.label: g for g in groups}
    named = [by_label[label] for label in row.comparison.split(LADDER) if label in by_label]
    bases = [b for g in named if (b := axis.base_of(g, groups)) is not None]
    return named + bases or groups


def label(row: Claim, found: list[Condition]) -> Claim:
    """The row with its verdict labelled and the conditions ahead of its rule's why; unchanged with none."""
    if not found or row.claim in EXACT or row.verdict.startswith(UNJUDGED):
        return row
    kind = WITHHELD if any(c.label == WITHHELD for c in found) else PILOT
    return dataclasses.replace(row, verdict=f"{kind}: {row.verdict}", why=f"{kind}: {reasons(found)}. Rule: {row.why}")


def reasons(found: list[Condition]) -> str:
    """The conditions behind one row, shortly, plateau first: "nano tied at 1.00x the unigram perplexity (> 0.5x);
    2 seeds; train.lr 0.003 untuned"."""
    out = []
    for kind in KINDS:
        hits = [c for c in found if c.kind == kind]
        if not hits:
            continue
        if kind == "plateau":
            at = ", ".join(f"{c.group} at {c.ratio:.2f}x" for c in hits)
            out.append(f"{at} the unigram perplexity (> {PLATEAU_FRACTION:g}x: on the plateau)")
        elif kind == "baselines":
            out.append("no unigram baseline in summary.json, plateau unknown")
        elif kind == "seeds":
            counts = sorted({len(c.seeds) for c in hits})
            out.append(f"{'-'.join(map(str, dict.fromkeys([counts[0], counts[-1]])))} seeds (< {MIN_SEEDS})")
        elif kind == "pick":
            counts = sorted({len(c.seeds) for c in hits})
            many = "-".join(map(str, dict.fromkeys([counts[0], counts[-1]])))
            out.append(f"learning rate picked on {many} seed{'' if many == '1' else 's'} (< {MIN_SEEDS})")
        elif kind == "screen":
            out.append("; ".join(f"{c.rival}, screened on {seeds_text(c.seeds)}, beat the pick there" for c in hits))
        elif kind == "lr":
            out.append(f"train.lr {', '.join(dict.fromkeys(rate(c.lr) for c in hits))} untuned")
        else:
            out.append("; ".join(f"{c.key} {rate(c.lr)} at its grid's {side(c)} edge" for c in hits))
    return "; ".join(out)


def side(c: Condition) -> str:
    return "lower" if c.lr == c.grid[0] else "upper"


def label_rows(
    rows: list[Claim],
    groups: list[Group],
    found: dict[str, list[Condition]],
    free: tuple[str, ...] = (),
    untied: str = "untied",
) -> list[Claim]:
    """Every claims row, labelled from the conditions of the groups it reads (claims.claims' tied vs untied)."""
    axis = Baseline("tying", untied, free)
    return [label(row, [c for g in involved(row, groups, axis) for c in found.get(g.label, [])]) for row in rows]


def strongest(found: dict[str, list[Condition]]) -> str | None:
    """The report's label: withheld when any group is on the plateau, else pilot when any condition fired, else None."""
    labels = {c.label for cs in found.values() for c in cs}
    return next((kind for kind in (WITHHELD, PILOT) if kind in labels), None)


def summary(found: dict[str, list[Condition]]) -> list[tuple[str, str]]:
    """(what was found, how to fix it) per kind of condition that fired, plateau first, across the groups."""
    out = []
    for kind in KINDS:
        hits = [c for cs in found.values() for c in cs if c.kind == kind]
        if hits:
            out.append(summarise(kind, hits, len(found)))
    return out


def summarise(kind: str, hits: list[Condition], n_groups: int) -> tuple[str, str]:
    if kind == "plateau":
        at = ", ".join(f"{c.group} {c.ratio:.2f}x" for c in hits)
        steps = "/".join(f"{s:,}" for s in sorted({c.steps for c in hits}))
        return (
            f"not off the unigram plateau: {at} the unigram perplexity (verdicts need at most {PLATEAU_FRACTION:g}x)",
            f"train longer than {steps} steps (train.max_steps) until the runs leave it",
        )
    if kind == "baselines":
        return (
            f"no unigram baseline in summary.json ({', '.join(c.group for c in hits)}: made before tiecli 0.1), so the "
            "plateau cannot be told",
            "re-run with this tiecli",
        )
    if kind == "seeds":
        shared = {c.seeds for c in hits}
        every = sorted({s for c in hits for s in c.seeds})
        every += [s for s in range(len(every) + MIN_SEEDS) if s not in every][: max(0, MIN_SEEDS - len(every))]
        found = (
            f"{seeds_text(next(iter(shared)))} per group"
            if len(shared) == 1 and len(hits) == n_groups
            else ", ".join(f"{c.group} {seeds_text(c.seeds)}" for c in hits)
        )
        return f"{found}, fewer than {MIN_SEEDS}", f"run seed={','.join(map(str, every))}"
    if kind == "pick":
        picked = ", ".join(f"{c.group} on {seeds_text(c.seeds)}" for c in hits)
        return (
            f"learning rates picked on fewer than {MIN_SEEDS} seeds: {picked}; one seed's noise can decide a pick",
            f"run each grid's rates on {MIN_SEEDS} or more seeds (the sweep's seed axis, or `add` rules over every rate) "
            "and report again",
        )
    if kind == "screen":
        beaten = ", ".join(f"{c.group} by {c.rival} on {seeds_text(c.seeds)}" for c in hits)
        return (
            f"a rate screened on fewer seeds beat the pick on the seeds it ran: {beaten}; the pick is not settled",
            f"run each such rate on the seeds the pick was made on ({MIN_SEEDS} or more) and report again",
        )
    if kind == "edge":
        chosen = ", ".join(
            f"{c.group if f'{c.key}=' in c.group else f'{c.group} {c.key}={rate(c.lr)}'} "
            f"({f'null: train.lr {rate(c.lr)}, the ' if c.null else ''}"
            f"{'smallest' if side(c) == 'lower' else 'largest'} of {', '.join(map(rate, c.grid))})"
            for c in hits
        )
        return (
            f"learning rate chosen at the edge of its grid: {chosen}; the best rate may lie beyond it",
            "add a rate past each edge to the sweep (the same command with the longer list adds only the new "
            "jobs) and report again",
        )
    rates = list(dict.fromkeys(rate(c.lr) for c in hits))
    found = f"one shared lr {rates[0]}" if len(rates) == 1 else f"lr {', '.join(rates)}"
    return (
        f"{found}, untuned (no --select over a learning-rate grid)",
        "sweep train.lr (e.g. train.lr=1e-3,3e-3,1e-2) and report with --select train.lr",
    )
