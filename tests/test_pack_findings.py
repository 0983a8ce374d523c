"""scripts/pack_findings.py's pack: what a committed runs archive keeps (no checkpoints, rows.npz only when asked
for, only the diagnostics the report reads), with metrics.jsonl's floats at 7 significant digits and eval.json
exact."""

import csv
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from helpers import script, tiecli, write_run


def sweep(root: Path) -> Path:
    """A sweep folder with one run holding every kind of file pack treats differently."""
    run = root / "runs" / "sweeps" / "s" / "nano-tied-s0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_10.pt").write_bytes(b"x" * 100)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 5.123456789012}) + "\n")
    (run / "eval.json").write_text(json.dumps({"loss": 5.123456789012}))
    (run / "rows.npz").write_bytes(b"rows")
    (root / "runs" / "sweeps" / "s" / "sweep.json").write_text("{}")
    return Path("runs/sweeps/s")


@pytest.mark.parametrize("without_rows", [False, True])
def test_pack_keeps_what_the_report_reads_and_leaves_rows_out_only_when_asked(tmp_path, monkeypatch, without_rows):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "study"
    study.mkdir()
    script("pack_findings").pack(study, [sweep(tmp_path)], without_rows)
    with tarfile.open(study / "runs.tar.xz") as tar:
        names = set(tar.getnames())
        metrics = json.loads(tar.extractfile("runs/sweeps/s/nano-tied-s0/metrics.jsonl").read())
        evals = json.loads(tar.extractfile("runs/sweeps/s/nano-tied-s0/eval.json").read())
    run = "runs/sweeps/s/nano-tied-s0"
    assert f"{run}/eval.json" in names and "runs/sweeps/s/sweep.json" in names
    assert not any("checkpoints" in n for n in names)
    assert (f"{run}/rows.npz" in names) is not without_rows
    assert metrics["loss"] == 5.123457 and evals["loss"] == 5.123456789012
    assert not (study / "runs.tar.xz.partial").exists()


def test_slim_writes_the_same_results_json_without_indentation_and_names_the_figures(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    results = {"select": ["train.lr"], "claims": [{"claim": "C6", "measured": "Δloss 0.116"}]}
    (study / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
    (study / "report.md").write_text("# tiecli report\n\n![Validation loss](val_loss.png)\n")
    (study / "val_loss.png").write_bytes(b"png")
    (study / "report.html").write_text("<html></html>")
    script("pack_findings").slim(study)
    text = (study / "results.json").read_text()
    assert json.loads(text) == results and "\n " not in text and "Δ" in text
    assert sorted(p.name for p in study.iterdir()) == ["report.md", "results.json"]
    assert "Figure `val_loss.png` (Validation loss): not committed" in (study / "report.md").read_text()


def test_slim_leaves_the_rows_results_csv_holds_to_results_csv_and_keeps_the_claims(tmp_path, monkeypatch):
    for mode in ("tied", "untied"):
        for seed in range(3):
            write_run(tmp_path / "runs", "nano", mode, seed)
    monkeypatch.chdir(tmp_path)
    assert tiecli("report", "runs", "--out", "study").exit_code == 0
    study = tmp_path / "study"
    full = json.loads((study / "results.json").read_text())
    script("pack_findings").slim(study)
    slimmed = json.loads((study / "results.json").read_text())
    assert len(full["runs"]) == 6 and len(full["groups"]) == 2
    assert "runs" not in slimmed and "groups" not in slimmed and "results.csv" in slimmed["rows"]
    assert {k: v for k, v in slimmed.items() if k != "rows"} == {
        k: v for k, v in full.items() if k not in ("runs", "groups")
    }
    with (study / "results.csv").open() as f:
        in_csv = list(csv.DictReader(f))
    for kind in ("run", "group"):  # every row results.json dropped is a line of results.csv, the same numbers
        lines = [{k: v for k, v in row.items() if v != ""} for row in in_csv if row["kind"] == kind]
        assert lines == [{k: str(v) for k, v in row.items() if v is not None and v != ""} for row in full[kind + "s"]]


def test_pack_borrows_only_what_a_lender_holds_byte_for_byte_and_unpack_gives_it_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = script("pack_findings")
    shared = sweep(tmp_path)
    changed = shared / "nano-untied-s0"
    changed.mkdir()
    (changed / "eval.json").write_text(json.dumps({"loss": 5.5}))
    lender, borrower = tmp_path / "lender", tmp_path / "borrower"
    lender.mkdir()
    borrower.mkdir()
    module.pack(lender, [shared])
    (changed / "eval.json").write_text(json.dumps({"loss": 5.25}))  # no longer what the lender holds
    own = Path("runs/sweeps/own")
    (tmp_path / own / "micro-tied-s0").mkdir(parents=True)
    (tmp_path / own / "sweep.json").write_text("{}")
    (tmp_path / own / "micro-tied-s0" / "eval.json").write_text(json.dumps({"loss": 4.0}))
    module.pack(borrower, [shared, own], lenders=(lender,))
    borrowed = json.loads((borrower / "borrowed.json").read_text())
    assert borrowed == {"lender": ["runs/sweeps/s/nano-tied-s0", "runs/sweeps/s/sweep.json"]}
    with tarfile.open(borrower / "runs.tar.xz") as tar:
        names = set(tar.getnames())
    assert "runs/sweeps/s/nano-untied-s0/eval.json" in names and "runs/sweeps/own/micro-tied-s0/eval.json" in names
    assert not [n for n in names if n.startswith("runs/sweeps/s/nano-tied-s0") or n.endswith("s/sweep.json")]
    module.unpack(borrower, tmp_path / "out")
    out = tmp_path / "out" / "runs" / "sweeps"
    assert json.loads((out / "s" / "nano-tied-s0" / "metrics.jsonl").read_text())["loss"] == 5.123457
    assert json.loads((out / "s" / "nano-untied-s0" / "eval.json").read_text()) == {"loss": 5.25}
    assert (out / "s" / "sweep.json").is_file() and (out / "own" / "micro-tied-s0" / "eval.json").is_file()
    shutil.rmtree(tmp_path / shared / "nano-tied-s0")
    module.pack(lender, [shared])  # the lender re-packed without a run the borrower takes
    with pytest.raises(SystemExit, match="nano-tied-s0 is not in lender/runs.tar.xz any more"):
        module.unpack(borrower, tmp_path / "again")


def test_pack_keeps_the_diagnostics_the_report_reads_and_every_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "sweeps" / "s" / "tiny-tied-s0"
    run.mkdir(parents=True)
    (run.parent / "sweep.json").write_text("{}")
    read = {"grad_cos": 0.0311, "grad_norm_in": 0.03, "grad_norm_out": 0.67, "pair_claimed": 0.12}
    unread = {"grad_cos_frequent": -0.033, "grad_norm_ratio": 0.045, "pair_n": 71, "pair_cancel_adam": 0.06}
    rows = [
        {"format": 1},
        {"step": 0, "tokens": 0, "lr": 0.0, "val_loss": 8.3, "val_ppl": 4237.6, "train_eval_loss": 8.31},
        {"step": 10, "tokens": 20480, "lr": 1e-4, "loss": 7.5, "grad_norm": 0.79, "tokens_per_s": 818.5}
        | read
        | unread,
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = tmp_path / "study"
    study.mkdir()
    script("pack_findings").pack(study, [Path("runs/sweeps/s")])
    with tarfile.open(study / "runs.tar.xz") as tar:
        packed = [json.loads(line) for line in tar.extractfile(f"runs/sweeps/s/{run.name}/metrics.jsonl")]
    assert packed[:2] == rows[:2]
    assert packed[2] == {k: v for k, v in rows[2].items() if k not in unread}
    assert read.keys() <= script("pack_findings").READ_DIAG  # the report's own list, not a copy


def test_a_lender_packed_with_every_diagnostic_still_lends_the_run_it_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = sweep(tmp_path)
    row = {"step": 10, "tokens": 20480, "lr": 1e-4, "loss": 5.123457, "grad_cos": 0.0311, "grad_cos_rare": -0.0036}
    (tmp_path / shared / "nano-tied-s0" / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    lender, borrower = tmp_path / "lender", tmp_path / "borrower"
    lender.mkdir()
    borrower.mkdir()
    with tarfile.open(lender / "runs.tar.xz", "w:xz") as tar:  # as pack wrote it before it left diagnostics out
        tar.add(tmp_path / shared, arcname=str(shared), filter=lambda m: None if "checkpoints" in m.name else m)
    script("pack_findings").pack(borrower, [shared], lenders=(lender,))
    borrowed = json.loads((borrower / "borrowed.json").read_text())
    assert "runs/sweeps/s/nano-tied-s0" in borrowed["lender"]
    row["grad_cos_rare"] = 0.5  # now our copy differs from the lender's in a field the report does not read
    (tmp_path / shared / "nano-tied-s0" / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    script("pack_findings").pack(borrower, [shared], lenders=(lender,))
    assert "runs/sweeps/s/nano-tied-s0" in json.loads((borrower / "borrowed.json").read_text())["lender"]
    row["grad_cos"] = 0.5  # and now in one it reads
    (tmp_path / shared / "nano-tied-s0" / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    script("pack_findings").pack(borrower, [shared], lenders=(lender,))
    assert "runs/sweeps/s/nano-tied-s0" not in json.loads((borrower / "borrowed.json").read_text()).get("lender", [])
