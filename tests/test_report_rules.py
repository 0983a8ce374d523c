"""The claims table's words are data (tiecli/report/claims_rules.yaml): one name per row (ClaimId), and the same
rules, word for word, in every report and in docs/CLAIMS.md."""

from pathlib import Path

import yaml

from tiecli.report import claims_doc, claims_rules
from tiecli.report.claims_rules import ClaimId

DOC = Path(__file__).parent.parent / "docs" / "CLAIMS.md"


def test_claims_md_prints_the_rules_the_report_prints():
    text = DOC.read_text(encoding="utf-8")
    assert claims_doc.HEADING in text
    committed = text[text.index(claims_doc.HEADING) :]
    assert committed == claims_doc.section(), (
        f"docs/CLAIMS.md's '{claims_doc.HEADING}' is not what claims_rules.yaml gives: run `{claims_doc.COMMAND}`"
    )


def test_the_section_is_rewritten_from_the_data_and_the_rest_kept(tmp_path):
    doc = tmp_path / "CLAIMS.md"
    doc.write_text("# Claims\n\nOther text.\n\n" + claims_doc.HEADING + "\n\nan old rule\n", encoding="utf-8")
    claims_doc.main([str(doc)])
    text = doc.read_text(encoding="utf-8")
    assert text == "# Claims\n\nOther text.\n\n" + claims_doc.section()
    assert "an old rule" not in text and claims_rules.CLAIM_RULES["C6"] in text


def test_the_data_names_every_row_once_in_the_tables_order():
    words = yaml.safe_load(claims_rules.RULES_FILE.read_text(encoding="utf-8"))
    assert list(words["says"]) == [c.value for c in ClaimId] == list(claims_rules.ORDER)
    assert claims_rules.TEXTS[ClaimId.R5_C6_TREND] == words["says"]["R5/C6 (trend)"]


def test_a_rule_quotes_the_constants_the_code_uses():
    rule = claims_rules.CLAIM_RULES["C1"]
    low, high = claims_rules.C1_CLAIMED_SHARE
    assert f"{low:.0%}-{high:.0%}" in rule and "{" not in rule
    assert f"SESOI {claims_rules.R4_PAIRS_SESOI:g} (share)" in claims_rules.CLAIM_RULES["R4 (pairs)"]


def test_a_claim_id_reads_as_its_name_everywhere():
    trend = ClaimId.R5_C6_TREND
    assert f"{trend}" == str(trend) == "R5/C6 (trend)" == trend
    assert {"R5/C6 (trend)": 1}[trend] == 1 and ClaimId("C6") is ClaimId.C6
