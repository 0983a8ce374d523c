# python scripts/pack_findings.py pack|unpack|rerender|slim docs/findings/STUDY ...   (commit a study's findings, compactly)
"""Commit a study's findings within the repository's size budget (tests/test_repo_size.py).

A study folder under docs/findings/ holds what a reader and `tiecli report` need: report.md,
results.csv, results.json and, where its raw runs are kept, runs.tar.xz. The report's figures and its
self-contained report.html are left out (the report draws them again from the runs), and the runs are
compacted: no checkpoints; every float in metrics.jsonl and geometry.json written to 7 significant
digits, what a float32 holds (the models train in fp32 or bf16, so the digits past the 7th are not
measurement); of the gradient diagnostics in metrics.jsonl, only those the report reads
(tiecli/report/load.py's READ_DIAG: the per-step statistics it averages over training and the curves it draws;
the others, such as the cosine by frequency bucket or the count of pairs present, were 30% of docs_budgets'
archive); and the singular values kept at the last geometry snapshot only, the one the report's spectra figure
reads (every scalar measured from them, effective and stable rank, stays at every step).
eval.json and summary.json, where the verdicts' losses come from, are kept exactly.

    pack STUDY SWEEP...   compact SWEEP's runs into STUDY/runs.tar.xz, then rerender; --without-rows leaves out
                          rows.npz (claim L1's rows, 64-256 KiB a run that does not compress) where the study's
                          report cannot read L1 anyway (its selected runs predate rows.npz); --borrow LENDER
                          (another study's folder, repeatable) leaves out each run folder or sweep.json that
                          LENDER's runs.tar.xz already holds byte for byte, and lists it in STUDY/borrowed.json
    unpack STUDY DEST     STUDY's runs into DEST: its runs.tar.xz, then the runs its borrowed.json names, each from
                          its lender's runs.tar.xz
    rerender STUDY        report the committed runs (unpack) again, with the --select its results.json
                          records, into report.md, results.csv and results.json; then slim
    slim STUDY            drop report.html and the PNGs; report.md names each figure instead of showing it;
                          results.json without its indentation, and without its runs and groups where
                          results.csv holds them (the claims, rules and settings stay; a third of the size)

tests/test_findings.py checks that the committed results.csv is what the committed runs give.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import fields
from pathlib import Path

from tiecli.report.load import READ_DIAG
from tiecli.run.records import MetricsRow

METRICS_KEPT = READ_DIAG | ({f.name for f in fields(MetricsRow)} - {"diag"})

SIGNIFICANT = 7
BORROWED = "borrowed.json"  # {lender study: [member paths, each a run folder or a sweep.json]}
SKIPPED = ("checkpoints", ".lock", "report")  # a sweep's own report/ folder is made again, not kept
IN_CSV = ("runs", "groups")  # results.json's copies of results.csv's run and group rows, the same numbers
ROWS_NOTE = "every run's and group's row is in results.csv (kind run or group), unrounded"
FIGURE = re.compile(r"^!\[(?P<title>[^\]]*)\]\((?P<file>[^)\s]+\.png)\)$", re.MULTILINE)


def rounded(value, digits: int = SIGNIFICANT):
    """value with every float at `digits` significant digits; ints, strings and structure unchanged."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value


def kept(row: dict) -> dict:
    """A metrics.jsonl step row without the diagnostics the report does not read; any other line as it is."""
    return {k: v for k, v in row.items() if k in METRICS_KEPT} if "step" in row else row


def compact_metrics(text: str) -> str:
    """metrics.jsonl's text with its floats rounded and without the diagnostics the report does not read."""
    return "\n".join(json.dumps(kept(rounded(json.loads(line)))) for line in text.splitlines() if line.strip()) + "\n"


def compact_run_files(root: Path) -> None:
    """Round the floats of every metrics.jsonl and geometry.json under root, and leave out the diagnostics the
    report does not read, in place."""
    for path in root.rglob("metrics.jsonl"):
        path.write_text(compact_metrics(path.read_text()))
    for path in root.rglob("geometry.json"):
        geometry = rounded(json.loads(path.read_text()))
        for entry in geometry["entries"][:-1]:
            for side in ("input", "output"):
                if isinstance(entry.get(side), dict):
                    entry[side].pop("singular_values", None)
        path.write_text(json.dumps(geometry) + "\n")


def pack(study: Path, sweeps: list[Path], without_rows: bool = False, lenders: tuple[Path, ...] = ()) -> None:
    """Copy each sweep (relative to the current folder, e.g. runs/sweeps/NAME) without checkpoints (and without
    rows.npz if asked), compact it, leave out what a lender holds identically, and write study/runs.tar.xz and
    study/borrowed.json atomically."""
    skipped = (*SKIPPED, "rows.npz") if without_rows else SKIPPED
    with tempfile.TemporaryDirectory() as tmp:
        for sweep in sweeps:
            shutil.copytree(sweep, Path(tmp) / sweep, ignore=shutil.ignore_patterns(*skipped))
        compact_run_files(Path(tmp))
        borrowed = {lender.name: borrowable(Path(tmp), sweeps, lender) for lender in lenders}
        borrowed = {name: paths for name, paths in borrowed.items() if paths}
        for paths in borrowed.values():
            for member in paths:
                target = Path(tmp) / member
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink()
        partial = study / "runs.tar.xz.partial"
        with tarfile.open(partial, "w:xz", preset=9) as tar:
            for sweep in sweeps:
                tar.add(Path(tmp) / sweep, arcname=str(sweep))
        write_atomically(study / BORROWED, json.dumps(borrowed, indent=1) + "\n" if borrowed else None)
        if any(p.is_file() for sweep in sweeps for p in (Path(tmp) / sweep).rglob("*")):
            partial.replace(study / "runs.tar.xz")
        else:  # every file borrowed: borrowed.json alone names the runs
            partial.unlink()
            (study / "runs.tar.xz").unlink(missing_ok=True)


def archive_files(archive: Path) -> dict[str, bytes]:
    """Every regular file in a runs.tar.xz, by its member name."""
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def borrowable(root: Path, sweeps: list[Path], lender: Path) -> list[str]:
    """The sweep.json files and run folders under root/sweeps that lender's runs.tar.xz holds byte for byte
    (a folder only when its files are exactly the lender's, none more, none fewer), a metrics.jsonl once
    compacted as ours is: a lender packed before pack left out the unread diagnostics still lends its runs."""
    held = {
        n: compact_metrics(data.decode()).encode() if n.endswith("/metrics.jsonl") else data
        for n, data in archive_files(lender / "runs.tar.xz").items()
    }
    found = []
    for sweep in sweeps:
        for entry in sorted((root / sweep).iterdir()):
            member = str(entry.relative_to(root))
            ours = {
                str(p.relative_to(root)): p for p in ([entry] if entry.is_file() else entry.rglob("*")) if p.is_file()
            }
            theirs = [n for n in held if n == member or n.startswith(member + "/")]
            if ours and sorted(ours) == sorted(theirs) and all(held[n] == p.read_bytes() for n, p in ours.items()):
                found.append(member)
    return found


def unpack(study: Path, dest: Path) -> None:
    """Extract study/runs.tar.xz into dest, then each member borrowed.json names from its lender's runs.tar.xz
    (a sibling folder of study); a member the lender no longer holds is an error naming both."""
    if (study / "runs.tar.xz").is_file():
        with tarfile.open(study / "runs.tar.xz") as tar:
            tar.extractall(dest, filter="data")
    lent = json.loads((study / BORROWED).read_text()) if (study / BORROWED).is_file() else {}
    for lender, paths in lent.items():
        if not (study.parent / lender / "runs.tar.xz").is_file():
            raise SystemExit(f"{study / BORROWED}: its lender {lender} has no runs.tar.xz beside it")
        with tarfile.open(study.parent / lender / "runs.tar.xz") as tar:
            members = tar.getmembers()
            for member in paths:
                taken = [m for m in members if m.name == member or m.name.startswith(member + "/")]
                if not taken:
                    raise SystemExit(f"{study / BORROWED}: {member} is not in {lender}/runs.tar.xz any more")
                tar.extractall(dest, members=taken, filter="data")


def write_atomically(path: Path, text: str | None) -> None:
    """path's new text through a partial file; None removes path."""
    if text is None:
        path.unlink(missing_ok=True)
        return
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def rerender(study: Path) -> None:
    """`tiecli report` on every sweep folder of study's runs (unpack), as tests/test_findings.py does."""
    select = json.loads((study / "results.json").read_text())["select"]
    with tempfile.TemporaryDirectory() as tmp:
        unpack(study, Path(tmp))
        sweeps = sorted(str(p.parent.relative_to(tmp)) for p in Path(tmp).glob("runs/sweeps/*/sweep.json"))
        args = [*sweeps, *[a for key in select for a in ("--select", key)], "--out", "again"]
        subprocess.run(
            [sys.executable, "-m", "tiecli", "report", *args], cwd=tmp, check=True, stdout=subprocess.DEVNULL
        )
        for name in ("report.md", "results.csv", "results.json"):
            shutil.copyfile(Path(tmp) / "again" / name, study / name)
    slim(study)


def slim(study: Path) -> None:
    """Leave out what the report draws again or holds twice: report.html and the PNGs (report.md then names each
    figure), results.json's indentation, and its runs and groups, each a line of results.csv (report.md and
    results.csv are the files a reader diffs)."""
    for path in [study / "report.html", *study.glob("*.png")]:
        path.unlink(missing_ok=True)
    results = study / "results.json"
    if results.is_file():
        data = json.loads(results.read_text())
        if (study / "results.csv").is_file():
            data = {k: v for k, v in data.items() if k not in IN_CSV} | {"rows": ROWS_NOTE}
        compact = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        write_atomically(results, compact + "\n")
    page = study / "report.md"
    text = FIGURE.sub(
        r"Figure `\g<file>` (\g<title>): not committed; `tiecli report` draws it from the runs.", page.read_text()
    )
    page.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("pack", "unpack", "rerender", "slim"))
    parser.add_argument("study", type=Path, help="docs/findings/STUDY")
    parser.add_argument(
        "sweeps", nargs="*", type=Path, help="pack: the sweep folders to keep, e.g. runs/sweeps/NAME; unpack: DEST"
    )
    parser.add_argument("--without-rows", action="store_true", help="pack: leave out each run's rows.npz (claim L1)")
    parser.add_argument(
        "--borrow", action="append", type=Path, default=[], help="pack: a lender's folder, docs/findings/OTHER"
    )
    args = parser.parse_args()
    if not args.study.is_dir():
        parser.error(f"{args.study}: not a folder (a study's folder under docs/findings/)")
    if args.action == "pack":
        if not args.sweeps:
            parser.error("pack needs the sweep folders to keep (e.g. runs/sweeps/NAME)")
        missing = [lender for lender in args.borrow if not (lender / "runs.tar.xz").is_file()]
        if missing:
            parser.error(f"--borrow {missing[0]}: no runs.tar.xz there (a lender is a study folder with its runs)")
        pack(args.study, args.sweeps, args.without_rows, tuple(args.borrow))
        rerender(args.study)
    elif args.action == "unpack":
        if len(args.sweeps) != 1:
            parser.error("unpack needs one destination folder (e.g. .)")
        unpack(args.study, args.sweeps[0])
    elif args.action == "rerender":
        rerender(args.study)
    else:
        slim(args.study)


if __name__ == "__main__":
    main()
