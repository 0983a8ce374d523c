# Used by `tiecli report`: a verdict on each claim of CLAIMS.md the data can speak to.
"""The claims table: one tying mode (the "tied" role) against another (the "untied" role) at equal
architecture, whatever --baseline the other tables use. The modes are parameters of `claims`, so
any two tying modes can be compared by the same rules.

Every tested row has a p-value against 0 and, where a smallest effect size of interest (SESOI)
applies, an equivalence p-value against +-SESOI; both are Holm-adjusted within the row's family
(judge: a study's declared families, by default one per claim), and the verdict reads the adjusted values.

The claims' texts, rules and the row type are in claims_rules.py; the rows are made by family of claim in
claims_embedding.py, claims_scaling.py and claims_stability.py."""

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from tiecli.errors import TiecliError
from tiecli.report.claims_embedding import (
    agreement_claims,
    alike_claims,
    forms_claims,
    gradient_claims,
    parameter_claims,
)
from tiecli.report.claims_rules import (
    DERIVED,
    FAMILY_CLAIMS,
    LADDER,
    ORDER,
    SESOI_DEFAULTS,
    TEXTS,
    UNTIED_INIT,
    Claim,
    ClaimId,
    loss_text,
    margins,
    missing,
    tested,
)
from tiecli.report.claims_scaling import convergence_claims, data_claims, size_claims
from tiecli.report.claims_stability import Outcome, divergence_claims, drift_claims, gap_claims, stability_claims
from tiecli.report.compare import compare
from tiecli.report.gate import involved
from tiecli.report.groups import Baseline, Group
from tiecli.report.stats import ALPHA, holm
from tiecli.run.files import read_json


def claims(
    groups: list[Group],
    tied: str = "tied",
    untied: str = "untied",
    sesoi: dict[str, float] | None = None,
    target: float | None = None,
    free: tuple[str, ...] = (),
    grid: Sequence["Outcome"] = (),
    families: dict[str, tuple[str, ...]] | None = None,
) -> list[Claim]:
    """The claims table, judged: groups with tying=`tied` against those with tying=`untied` (free: the
    keys --select chose per group); target: a fixed convergence target (--target-loss); grid: every run's
    divergence outcome, --select's unselected runs and diverged runs included (outcomes()); families: the
    Holm families declared (parse_families), the others one per claim."""
    margin = margins(sesoi or SESOI_DEFAULTS)
    axis = Baseline("tying", untied, free)
    pairs = [c for c in compare(groups, axis, target) if c.group.mode == tied]
    same_size = f"{tied} and {untied} runs of the same size"
    rows = parameter_claims(pairs, same_size)
    rows += gradient_claims(pairs, [g for g in groups if g.mode == tied], tied, untied, margin["cos"])
    rows += forms_claims([g for g in groups if g.mode == untied], untied, margin["cos"])
    rows += agreement_claims([g for g in groups if g.mode in (untied, UNTIED_INIT)], untied, margin["cka"])
    rows += convergence_claims(pairs, axis, same_size, target)
    rows += [
        tested(
            ClaimId.C6,
            c.group.label,
            f"validation table ({c.split} split)",
            c.delta_loss(c.split),
            -1,
            margin["ppl"],
            loss_text,
        )
        for c in pairs
    ] or [missing(ClaimId.C6, same_size)]
    rows += size_claims(pairs, axis, f"{tied} and {untied} runs at two or more model sizes")
    rows += data_claims(pairs, axis, f"{tied} and {untied} runs at two or more values of tokens seen")
    rows += gap_claims(pairs, margin["ppl"], tied, untied)
    rows += drift_claims(pairs, margin["drift"], tied, untied)
    rows += alike_claims(pairs, tied, untied, margin["cka"])
    rows += stability_claims(pairs, margin, tied, untied)
    rows += divergence_claims(grid, tied, untied)
    return derive(judge(rows, families, row_studies(rows, groups, axis)))


def parse_families(spec, where: str) -> dict[str, tuple[str, ...]]:
    """A study's `families` (or --family's): {name: [claim, ...]}, each claim in one family at most; one line
    naming the bad entry and the valid claims otherwise."""
    valid = ", ".join(FAMILY_CLAIMS)
    if not isinstance(spec, dict) or not all(isinstance(v, list) and v for v in spec.values()):
        raise TiecliError(f"{where}: families are {{name: [claim, ...]}}, e.g. {{outcome: [C6, R6]}}; claims: {valid}")
    families: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for name, members in spec.items():
        for claim in map(str, members):
            if claim not in FAMILY_CLAIMS:
                raise TiecliError(
                    f"{where}: family {name!r} names {claim!r}, not a judged claim; valid claims: {valid}"
                )
            if claim in seen:
                raise TiecliError(
                    f"{where}: {claim} is in two families, {seen[claim]!r} and {name!r}; a claim is in one"
                )
            seen[claim] = str(name)
        families[str(name)] = tuple(map(str, members))
    return families


def family_option(items: list[str]) -> dict[str, tuple[str, ...]] | None:
    """--family NAME=CLAIM,CLAIM (repeatable): the families for this report, replacing any a sweep declared."""
    if not items:
        return None
    spec: dict[str, list[str]] = {}
    for item in items:
        name, sep, members = (part.strip() for part in item.partition("="))
        if not sep or not name or not members:
            raise TiecliError(f"--family {item!r} must be NAME=CLAIM[,CLAIM...], e.g. outcome=C6,R6")
        spec[name] = [m.strip() for m in members.split(",") if m.strip()]
    return parse_families(spec, "--family")


def declared_families(run_paths: list[str]) -> tuple[dict[str, tuple[str, ...]], str]:
    """The families the sweeps holding these runs declared (each run's folder's parent sweep.json, written by
    `tiecli sweep` from the study's `families`), and where they come from. Sweeps that declare none follow the
    others; two that declare different ones are a one-line error (--family chooses)."""
    specs: dict[str, list[str]] = {}
    for sweep in sorted({Path(p).parent / "sweep.json" for p in run_paths}):
        if not sweep.is_file():
            continue
        manifest = read_json(sweep, f"sweep {sweep.parent.name}")
        study = (manifest.get("study") if isinstance(manifest, dict) else None) or {}
        if study.get("families") is not None:
            specs.setdefault(json.dumps(study["families"], sort_keys=True), []).append(str(sweep.parent))
    if len(specs) > 1:
        where = "; ".join(f"{', '.join(folders)}: {spec}" for spec, folders in specs.items())
        raise TiecliError(f"the sweeps declare different families ({where}); choose with --family NAME=CLAIM,...")
    if not specs:
        return {}, "default"
    spec, folders = next(iter(specs.items()))
    return parse_families(json.loads(spec), f"{folders[0]}/sweep.json"), f"declared in {', '.join(folders)}/sweep.json"


def family_of(claim: str, families: dict[str, tuple[str, ...]]) -> str:
    """The declared family holding the claim, else the claim's own (the default: one family per claim)."""
    return next((name for name, members in families.items() if claim in members), claim)


def row_studies(rows: list[Claim], groups: list[Group], axis: Baseline) -> dict[int, str]:
    """{id(row): the study of the runs it reads}: a study is the folder holding a run directory (a sweep's folder,
    or the folder of loose runs), named by its last part (its whole path where two share a name); a row reading
    runs of several studies (a ladder across two sweeps) has them joined by "+". Empty when the report reads one
    study: the family names then carry none."""
    folders = {id(r): str(Path(r.path).parent) for g in groups for r in g.runs}
    if len(set(folders.values())) < 2:
        return {}
    names = {f: Path(f).name for f in folders.values()}
    if len(set(names.values())) < len(names):
        names = {f: f for f in names}
    return {
        id(row): "+".join(sorted({names[folders[id(r)]] for g in involved(row, groups, axis) for r in g.runs}))
        for row in rows
    }


def judge(
    rows: list[Claim], families: dict[str, tuple[str, ...]] | None = None, studies: dict[int, str] | None = None
) -> list[Claim]:
    """Holm-adjust the tests against 0 within each family, then the equivalence tests; then each row's verdict.
    A row's family: the declared one holding its claim, else its claim's own, within the row's study (studies:
    row_studies), so that runs of another study in the report never change a verdict."""
    for row in rows:
        if row.p is not None or row.p_equiv is not None:
            study = (studies or {}).get(id(row))
            row.family = family_of(row.claim, families or {}) + (f" in {study}" if study else "")
    for family in dict.fromkeys(r.family for r in rows if r.family):
        members = [r for r in rows if r.family == family]
        for name in ("p", "p_equiv"):
            tested_rows = [r for r in members if getattr(r, name) is not None]
            for row, adjusted in zip(tested_rows, holm([getattr(r, name) for r in tested_rows])):
                setattr(row, name + "_holm", adjusted)
    for row in rows:
        if not row.verdict:
            settle(row)
    return rows


def family_rows(rows: list[Claim]) -> dict[str, list[str]]:
    """Each family and its tests, "CLAIM: comparison", as the report prints them (re-read tests, C3 and the
    smallest-size part of R5/C6, are counted once, in the family of the test they re-read)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.family and r.claim not in DERIVED:
            out.setdefault(r.family, []).append(f"{r.claim}: {r.comparison}")
    return out


def settle(row: Claim) -> None:
    row.verdict, row.why = verdict(row)
    row.why += f"; {row.note}" if row.note else ""


def verdict(row: Claim) -> tuple[str, str]:
    ci = row.interval
    if ci is None or row.p is None:
        return "inconclusive", "one seed: no spread, so no interval and no test"
    assert row.p_holm is not None  # judge() Holm-adjusts every row that has a p
    tested_p = f"Holm p {row.p_holm:.2g} (raw {row.p:.2g})"
    if differs := row.readings.get("range_disagrees"):
        return "inconclusive", (
            f"{tested_p} at the middle target, but the readings across the range of common targets disagree in "
            f"{differs}: no verdict"
        )
    if row.p_holm < ALPHA:
        side = "above" if ci.mean > 0 else "below"
        if row.sesoi and abs(ci.mean) < row.sesoi:
            return (
                "negligible",
                f"{tested_p} < {ALPHA:g}, {side} 0, but |mean| {abs(ci.mean):.3g} < SESOI {row.sesoi_text}",
            )
        result = "supported" if (ci.mean > 0) == (row.direction > 0) else "contradicted"
        return result, f"{tested_p} < {ALPHA:g}, {side} 0" + (
            f", |mean| >= SESOI {row.sesoi_text}" if row.sesoi else ""
        )
    if row.p_equiv_holm is not None and row.p_equiv_holm < ALPHA:
        return "equivalent", f"equivalence Holm p {row.p_equiv_holm:.2g} < {ALPHA:g}: within +-{row.sesoi_text}"
    equiv = f"; equivalence Holm p {row.p_equiv_holm:.2g}" if row.p_equiv_holm is not None else ""
    return "inconclusive", f"{tested_p} >= {ALPHA:g}{equiv}"


def derive(rows: list[Claim]) -> list[Claim]:
    """Rows read off judged ones, outside the Holm family: C3 (R6's test the other way) and R5/C6 (both parts)."""
    out = list(rows)
    for r6 in (r for r in rows if r.claim == ClaimId.R6):
        c3 = dataclasses.replace(r6, claim=ClaimId.C3, says=TEXTS[ClaimId.C3], direction=-r6.direction)
        if c3.p is not None:
            settle(c3)
        out.append(c3)
    for trend in (r for r in rows if r.claim == ClaimId.R5_C6_TREND):
        c6 = next(r for r in rows if r.claim == ClaimId.C6 and r.comparison == trend.comparison.split(LADDER)[0])
        part = dataclasses.replace(
            c6,
            claim=ClaimId.R5_C6_SMALLEST,
            says=TEXTS[ClaimId.R5_C6_SMALLEST],
            comparison=trend.comparison,
            measured=f"{c6.comparison}: {c6.measured} (the C6 row)",
        )
        out += [
            part,
            Claim(
                ClaimId.R5_C6,
                TEXTS[ClaimId.R5_C6],
                trend.comparison,
                trend.figure,
                f"smallest size: {part.verdict}; trend: {trend.verdict}",
                both(part.verdict, trend.verdict),
                "the claim needs both parts: tied better at the smallest size, the gap rising with size",
            ),
        ]
    return sorted(out, key=lambda r: ORDER.index(r.claim))


def both(smallest: str, trend: str) -> str:
    verdicts = (smallest, trend)
    if verdicts == ("supported", "supported"):
        return "supported"
    return next(
        (result for result in ("contradicted", "negligible", "equivalent") if result in verdicts), "inconclusive"
    )
