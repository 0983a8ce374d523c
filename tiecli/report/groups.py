# Used by `tiecli report`: runs into groups (one setting, several seeds), their labels, and the baseline.
"""Groups of runs equal in every setting but the seed, and the baseline a group is compared with."""

import dataclasses
import json
import statistics
from dataclasses import dataclass, field

from tiecli.errors import TiecliError
from tiecli.formats import typed
from tiecli.report.load import Run, Skipped

GROUPS = ("model", "tying", "data", "tokenizer")  # the config groups whose choices name a run
# Settings that change when and what is measured, not what the model learns.
IGNORED_KEYS = (
    "device",
    "compile",
    "train.log_interval",
    "train.eval_interval",
    "train.eval_batches",
    "train.checkpoint_interval",
    "train.checkpoints",
    "train.keep_checkpoints",  # how many full checkpoints stay on disk: the training is the same
    "eval.buckets",
    "eval.test",
    "train.sample_tokens",  # a text sample printed after training
    "data.num_proc",  # tokenizer processes: the same tokens whatever their number
)
# gradient statistics and geometry never touch training's RNG or weights; trackers only mirror the files
IGNORED_PREFIXES = ("diag.", "logger.")
SIZE_KEYS = ("model.n_layer", "model.n_head", "model.n_embd")  # what model/*.yaml set: the size ladder
BUDGET_KEYS = ("train.max_steps", "train.max_tokens")  # the data axis of R5


@dataclass(frozen=True)
class Group:
    """One setting, several seeds. Immutable: group_runs makes it, label_groups returns it labelled (parts), and
    the report returns it compared (report.compared: target, stats, axis); what it shows follows from those."""

    setting: dict  # the flattened config less the seed and the ignored keys
    choices: dict
    runs: tuple[Run, ...]
    parts: dict[str, str] = field(default_factory=dict)  # label pieces by config group or key (label_groups)
    target: float | None = None  # convergence target loss: its compared pair's, None for a baseline
    stats: dict = field(default_factory=dict)  # per-run number -> stats.Interval over the seeds (or None)
    axis: "Baseline | None" = None  # the baseline's axis, its free keys the --select keys

    @property
    def label(self) -> str:
        return " ".join(self.parts.values())

    @property
    def panel(self) -> str:
        """The figure panel: the label less the baseline axis."""
        return " ".join(v for k, v in self.parts.items() if not (self.axis and self.axis.on_axis(k))) or "all runs"

    @property
    def series(self) -> str:
        """ppl_vs_params' series: the label less the model size and the --select keys (a line per mode through
        each size's own selected rate, not a line per rate)."""
        return " ".join(v for k, v in self._kept().items() if k != "model" and k not in SIZE_KEYS)

    @property
    def budget_series(self) -> str:
        """ppl_vs_tokens' series: the label less the token budget and the --select keys."""
        return " ".join(v for k, v in self._kept().items() if k not in BUDGET_KEYS)

    def _kept(self) -> dict[str, str]:
        free = self.axis.free if self.axis else ()
        return {k: v for k, v in self.parts.items() if k not in free}

    @property
    def mode(self) -> str:
        return str(self.choices.get("tying"))

    @property
    def params(self) -> dict[str, int]:
        return self.runs[0].params

    @property
    def tokens(self) -> int:
        """Training tokens each run saw (a group's runs share the budget)."""
        return self.runs[0].tokens


def ignored(key: str, setting: dict) -> bool:
    # With a token budget, train.max_steps is never read: steps = ceil(max_tokens / tokens per step).
    unused_steps = key == "train.max_steps" and setting.get("train.max_tokens") is not None
    return key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES) or unused_steps


SPLIT_SEED = "data.split_seed"  # which text is held out: a second random factor when it varies with the seed


def group_runs(runs: list[Run]) -> tuple[list[Group], list[Skipped]]:
    """Groups of runs equal in every setting but the seed, labelled; a second run of a group's unit is skipped.
    data.split_seed joins the seed in the unit (seed, split_seed) wherever no seed has two of it (split_unit)."""
    members: dict[str, tuple[dict, dict, list[Run]]] = {}  # by setting: (setting, choices, runs)
    skipped: list[Skipped] = []
    unit_split = split_unit(runs)
    for run in runs:
        setting = {k: v for k, v in run.setting.items() if k != "seed" and not ignored(k, run.setting)}
        if unit_split.get(_setting_key(run)):
            setting.pop(SPLIT_SEED, None)
        _, _, same = members.setdefault(json.dumps(setting, sort_keys=True), (setting, run.choices, []))
        twin = next((r for r in same if r.unit == run.unit), None)
        if twin:
            skipped.append(Skipped(run.path, f"same settings and seed as {twin.path}"))
        else:
            same.append(run)
    groups = label_groups(
        [
            Group(setting, choices, tuple(sorted(same, key=lambda r: r.unit)))
            for setting, choices, same in members.values()
        ]
    )
    return sorted(groups, key=lambda g: (g.params["non_embedding"], g.label)), skipped


def _setting_key(run: Run) -> str:
    """The run's setting less the seed, the ignored keys and data.split_seed."""
    return json.dumps(
        {k: v for k, v in run.setting.items() if k not in ("seed", SPLIT_SEED) and not ignored(k, run.setting)},
        sort_keys=True,
    )


def split_unit(runs: list[Run]) -> dict[str, bool]:
    """Per setting (less seed and split seed): whether data.split_seed belongs to the unit, i.e. is a function of
    the seed there (each seed has one split seed; a fixed split is one too). Where one seed has several, the split
    is a factor of its own (a study varying it on purpose) and the groups split on it, as on any other key."""
    splits: dict[str, dict[int, set]] = {}
    for run in runs:
        splits.setdefault(_setting_key(run), {}).setdefault(run.seed, set()).add(run.setting.get(SPLIT_SEED))
    return {key: all(len(s) == 1 for s in by_seed.values()) for key, by_seed in splits.items()}


def units(groups: list[Group]) -> str:
    """What varies across the report's units: the seed only, or the seed and the held-out split."""
    varying = [g.label for g in groups if len({r.setting.get(SPLIT_SEED) for r in g.runs}) > 1]
    if not varying:
        fixed = sorted({str(r.setting.get(SPLIT_SEED)) for g in groups for r in g.runs})
        return (
            f"seed only: each group holds out one fixed split ({SPLIT_SEED}={', '.join(fixed)}), so intervals leave "
            "out the variance of which text is held out"
        )
    where = (
        "every group"
        if len(varying) == len(groups)
        else f"{len(varying)} of {len(groups)} groups ({', '.join(varying)})"
    )
    return (
        f"seed and held-out split: {SPLIT_SEED} varies with the seed in {where}; a unit is (seed, {SPLIT_SEED}), runs "
        "pair by unit, so intervals include the variance of which text is held out"
    )


def label_groups(groups: list[Group]) -> list[Group]:
    """The groups labelled (parts): the model and tying choices, the other choices that differ between groups, and
    KEY=VALUE for each differing key that the choices do not explain (e.g. train.max_tokens=...)."""
    keys = sorted(set().union(*(g.setting for g in groups)))
    differing = [k for k in keys if len({json.dumps(g.setting.get(k)) for g in groups}) > 1]
    shown = [c for c in GROUPS if c in ("model", "tying") or len({g.choices.get(c) for g in groups}) > 1]

    def explained(key):  # the value follows from the group choice (model=micro sets model.n_embd)
        group = key.split(".")[0]
        if group not in GROUPS:
            return False
        by_choice: dict[object, set[str]] = {}
        for g in groups:
            by_choice.setdefault(g.choices.get(group), set()).add(json.dumps(g.setting.get(key)))
        return all(len(values) == 1 for values in by_choice.values())

    unexplained = [k for k in differing if not explained(k)]
    return [
        dataclasses.replace(
            g, parts={c: str(g.choices.get(c)) for c in shown} | {k: f"{k}={g.setting.get(k)}" for k in unexplained}
        )
        for g in groups
    ]


# --- selection (--select KEY) -------------------------------------------------------------------------


MIN_SEEDS = 3  # a --select pick, and a verdict, rest on at least this many seeds (gate)


@dataclass
class NotSelected:
    """A group --select left out: its own values of the selected keys, and the group chosen in its place."""

    group: str
    values: str  # KEY=VALUE of the selected keys
    loss: float  # seed-mean final validation loss over the seeds compared
    chosen: str  # KEY=VALUE of the selected group
    chosen_loss: float
    seeds: int  # the units (seeds) the group was compared with the chosen one on
    runs: int = 0  # the group's runs, all left out of the report's groups
    screened: bool = False  # run on fewer seeds than the pick was made on, compared on its own (Pick)


@dataclass(frozen=True)
class Pick:
    """One --select family's choice: the group with the lowest seed-mean final validation loss among `ranked`
    over `units`, and the groups `screened` out, each with its own units.

    The units are those every group of the family has (a rate checked on one seed and the pick then run on five
    are compared on that seed: where each seed holds out its own text, a five-seed mean against one seed's loss
    would compare held-out texts rather than rates), except where fewer than MIN_SEEDS are shared but two or
    more groups share MIN_SEEDS or more: then those groups are ranked on the units they share, and a group run
    on fewer (a rate screened on one seed, such as a point past a grid's edge that lost there) is compared with
    the chosen group on the units both have. It brackets the pick when it lost there; one that won (`rivals`)
    leaves the pick unsettled, which the gate reports."""

    chosen: Group
    units: frozenset
    ranked: tuple[Group, ...]
    screened: tuple[Group, ...] = ()

    def against(self, group: Group) -> tuple[float, float, set]:
        """A screened group's mean loss and the chosen group's, over the units both have."""
        both = {r.unit for r in group.runs} & {r.unit for r in self.chosen.runs}
        return mean_loss(group, both), mean_loss(self.chosen, both), both

    @property
    def rivals(self) -> list[Group]:
        """The screened groups that beat the chosen one on the units they were run on."""
        return [g for g in self.screened if (pair := self.against(g))[0] < pair[1]]


def pick(members: list[Group]) -> Pick:
    """The family's choice (Pick): on the units all its groups share, else as a screen (see Pick)."""
    shared = shared_units(members)
    ranked = [g for g in members if len({r.unit for r in g.runs}) >= MIN_SEEDS]
    core = shared_units(ranked) if len(ranked) > 1 else set()
    if len(shared) >= MIN_SEEDS or len(core) < MIN_SEEDS:
        ranked, core = members, shared
    chosen = min(ranked, key=lambda g: mean_loss(g, core))
    screened = tuple(g for g in members if not any(g is r for r in ranked))
    return Pick(chosen, frozenset(core), tuple(ranked), screened)


def select(groups: list[Group], keys: tuple[str, ...]) -> tuple[list[Group], list[NotSelected]]:
    """Among the groups equal in every setting but the selected keys (e.g. one tying mode at one size
    over a grid of train.lr), keep the one with the lowest seed-mean final validation loss (pick); the
    others are left out and listed. The kept groups are labelled afresh."""
    if not keys:
        return groups, []
    for key in keys:
        check_key(key, groups, f"--select {key}")
    families: dict[str, list[Group]] = {}
    for g in groups:
        families.setdefault(
            json.dumps({k: v for k, v in g.setting.items() if k not in keys}, sort_keys=True), []
        ).append(g)
    kept, dropped = [], []
    for members in families.values():
        chosen = pick(members)
        kept.append(chosen.chosen)
        dropped += [
            NotSelected(
                g.label,
                values(g, keys),
                mean_loss(g, set(chosen.units)),
                values(chosen.chosen, keys),
                mean_loss(chosen.chosen, set(chosen.units)),
                len(chosen.units),
                len(g.runs),
            )
            for g in chosen.ranked
            if g is not chosen.chosen
        ]
        for g in chosen.screened:
            loss, chosen_loss, both = chosen.against(g)
            dropped.append(
                NotSelected(
                    g.label,
                    values(g, keys),
                    loss,
                    values(chosen.chosen, keys),
                    chosen_loss,
                    len(both),
                    len(g.runs),
                    True,
                )
            )
    return label_groups([g for g in groups if any(g is k for k in kept)]), dropped  # the report's order


def check_select(groups: list[Group], keys: tuple[str, ...], axis: "Baseline") -> None:
    """One line when a selected key tells the comparison's sides apart (tying.mode: tied against untied): picking
    on it would pick between them, not within each. A key of the axis's config group that varies within a side,
    such as untied's tying.output_std, is selectable: each mode is then compared at its own best value of it."""
    sides = sorted({str(axis.actual(g)) for g in groups})
    for key in filter(axis.on_axis, keys):  # off the axis (train.lr), each side may run its own grid
        values = [{json.dumps(g.setting.get(key)) for g in groups if str(axis.actual(g)) == side} for side in sides]
        if len(sides) > 1 and sum(map(len, values)) == len(set().union(*values)):  # no value on two sides
            raise TiecliError(
                f"--select {', '.join(keys)}: cannot select on the baseline's key {axis.key}: {key} tells "
                f"{' and '.join(f'{axis.key}={s}' for s in sides)} apart; select keys that vary within one {axis.key}"
            )


def shared_units(members: list[Group]) -> set[tuple]:
    """The units (seed, split seed) every group of `members` has; empty when none is shared (then each
    group's own mean is used)."""
    return set.intersection(*({r.unit for r in g.runs} for g in members)) if members else set()


def mean_loss(group: Group, units: set[tuple]) -> float:
    """The group's mean final validation loss over the runs of `units` (all its runs when empty)."""
    return statistics.fmean(r.loss for r in group.runs if not units or r.unit in units)


def values(group: Group, keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={group.setting.get(k)}" for k in keys)


def check_key(key: str, groups: list[Group], option: str) -> None:
    """One line when a setting is not one runs are grouped by: ignored, or absent, naming the keys that differ."""
    if any(key in g.setting for g in groups):
        return
    if any(key in r.setting for g in groups for r in g.runs):
        raise TiecliError(f"{option}: runs are not grouped by {key} (it does not change what a run learns)")
    differing = [
        k
        for k in sorted(set().union(*(g.setting for g in groups)))
        if len({json.dumps(g.setting.get(k)) for g in groups}) > 1
    ]
    keys = ", ".join(differing[:6]) or "none"
    raise TiecliError(
        f"no run has a setting {key!r} ({option}); config groups: {', '.join(GROUPS)}; "
        f"keys that differ between the runs: {keys}"
    )


# --- the baseline -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    """KEY=VALUE: a config group and its choice (tying=untied) or a dotted key and its value (train.lr=0.001).
    The key is the axis of comparison: a group's baseline equals it in every setting off that axis and
    off the free keys (those --select chose per group, e.g. train.lr)."""

    key: str
    value: str
    free: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Baseline":
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise TiecliError(f"--baseline {text!r} must be KEY=VALUE, e.g. tying=untied")
        return cls(key.strip(), value.strip())

    def __str__(self) -> str:
        return f"{self.key}={self.value}"

    def on_axis(self, key: str) -> bool:
        """Whether a setting belongs to the axis: the key itself or, for a config group, its keys."""
        return key == self.key or key.startswith(self.key + ".")

    def actual(self, group: Group):
        return group.choices.get(self.key) if self.key in GROUPS else group.setting.get(self.key)

    def matches(self, group: Group) -> bool:
        actual = self.actual(group)
        if self.key in GROUPS:
            return str(actual) == self.value
        return str(actual) == self.value or typed(actual) == self.value or _same_number(actual, self.value)

    def rest(self, group: Group, free=()) -> str:
        """The group's setting off the axis (and off the free keys), as a comparable string."""
        free = (*self.free, *free)
        return json.dumps(
            {k: v for k, v in group.setting.items() if not self.on_axis(k) and k not in free}, sort_keys=True
        )

    def base_of(self, group: Group, groups: list[Group]) -> Group | None:
        """The baseline group equal to group off the axis; None for a baseline group itself or without one."""
        if self.matches(group):
            return None
        return next(
            (b for b in groups if b is not group and self.matches(b) and self.rest(b) == self.rest(group)), None
        )

    def check(self, groups: list[Group]) -> None:
        """One line naming what exists when no group has KEY=VALUE."""
        if any(self.matches(g) for g in groups):
            return
        if self.key in GROUPS or any(self.key in g.setting for g in groups):
            present = sorted({typed(self.actual(g)) for g in groups if self.key in GROUPS or self.key in g.setting})
            raise TiecliError(f"no run has {self}; {self.key} values present: {', '.join(present)}")
        check_key(self.key, groups, f"--baseline {self}")


def _same_number(actual, text: str) -> bool:
    """Whether a numeric setting equals text read as a number (3e-3 is 0.003); a boolean is not a number here."""
    if isinstance(actual, bool) or not isinstance(actual, int | float):
        return False
    try:
        return float(text) == actual
    except ValueError:
        return False
