# python -m tiecli.report.claims_doc [docs/CLAIMS.md]   (writes the doc's section of the report's rules, word for word)
"""docs/CLAIMS.md's last section, "The report's rules, word for word": the claims table's rows, the verdict rule and
each claim's rule, made from claims_rules.yaml with the constants the report fills in, as every report prints them.
tests/test_report_rules.py fails when the committed section is not what this writes."""

import sys
from pathlib import Path

from tiecli.report.claims_rules import CLAIM_RULES, RULES_FILE, TEXTS, VERDICT_RULE

HEADING = "## The report's rules, word for word"
COMMAND = "python -m tiecli.report.claims_doc"


def section() -> str:
    """The section, from its heading to the end of the file."""
    says = "\n".join(f"| `{claim}` | {text} |" for claim, text in TEXTS.items())
    rules = "\n\n".join(f"**claim {claim}**: {rule}" for claim, rule in CLAIM_RULES.items())
    return (
        f"{HEADING}\n\n"
        f"<!-- written by `{COMMAND}` from tiecli/report/{RULES_FILE.name}: edit that file, then run it -->\n\n"
        "What every report prints: each row's claim in the claims table, and under Rules (appendix) the verdict rule "
        "and each claim's rule, with the constants the rules quote filled in.\n\n"
        f"| claim | says |\n|---|---|\n{says}\n\n"
        f"**verdict**: {VERDICT_RULE}\n\n"
        f"{rules}\n"
    )


def written(text: str) -> str:
    """text (docs/CLAIMS.md) with its section replaced by section(), or appended when it has none."""
    before, found, _ = text.partition(HEADING)
    return (before if found else before.rstrip("\n") + "\n\n") + section()


def main(argv: list[str]) -> None:
    path = Path(argv[0] if argv else "docs/CLAIMS.md")
    if not path.is_file():
        sys.exit(f"{path}: no such file (run from the repository's root, or name docs/CLAIMS.md)")
    path.write_text(written(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"{path}: {HEADING.removeprefix('## ')} written from {RULES_FILE.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
