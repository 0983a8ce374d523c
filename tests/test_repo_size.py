"""The repository travels: the tracked tree stays within the size budget that a device machine's working-tree limit
(64 MiB, corpus and wheels included) leaves room under, and docs/ within its share (scripts/pack_findings.py)."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE_BUDGET = 20_900_000  # bytes, every tracked file: under 20 MiB
DOCS_BUDGET = 17_000_000  # bytes, the tracked files under docs/


def tracked_sizes() -> dict[str, int]:
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the budget is on what git tracks")
    names = [n for n in listing.decode().split("\0") if n]
    return {n: (ROOT / n).stat().st_size for n in names if (ROOT / n).is_file()}


def largest(sizes: dict[str, int], n: int = 5) -> str:
    return ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:n])


def test_the_tracked_tree_fits_its_budget():
    sizes = tracked_sizes()
    assert sum(sizes.values()) <= TREE_BUDGET, f"{sum(sizes.values()) / 1e6:.2f} MB tracked; largest: {largest(sizes)}"


def test_docs_fit_their_budget():
    docs = {n: s for n, s in tracked_sizes().items() if n.startswith("docs/")}
    assert sum(docs.values()) <= DOCS_BUDGET, f"{sum(docs.values()) / 1e6:.2f} MB under docs/; largest: {largest(docs)}"


def test_no_study_commits_what_the_report_draws_again():
    drawn = [n for n in tracked_sizes() if n.startswith("docs/") and (n.endswith(".html") or n.endswith(".png"))]
    assert drawn == ["docs/findings/findings.png"], drawn
