# Used by `tiecli report`: pretrained models measured by `tiecli geometry --model PATH --out DIR`, as reference rows.
"""Reference rows: where real pretrained models sit next to the runs in the geometry table.

`tiecli geometry --model PATH --out DIR` writes DIR/pretrained.json; `tiecli report` finds such files
under the folders it is given and adds one row per model ("pretrained, tied: SmolLM2-135M") to its
geometry table. The rows are measurements of a single model, not means over seeds, and take part in
no comparison or claim. Reads JSON only (no torch).
"""

import os
from dataclasses import dataclass
from pathlib import Path

from tiecli.errors import TiecliError
from tiecli.run.files import read_json

PRETRAINED_FILE = "pretrained.json"


@dataclass
class Reference:
    label: str  # "pretrained, tied: SmolLM2-135M-Instruct.Q4_1"
    path: str  # the pretrained.json it came from
    values: dict[str, float | None]  # the report's geometry keys: anisotropy_input, ..., cka, row_cosine


def label(entry: dict) -> str:
    model = entry["model"]
    return f"pretrained, {'tied' if model['tied'] else 'untied'}: {model['name']}"


def find(paths: list[Path]) -> list[Path]:
    """Every pretrained.json under paths (a path may also be such a file), each once, sorted."""
    found = set()
    for path in paths:
        if path.name == PRETRAINED_FILE and path.is_file():
            found.add(path)
        for folder, _, files in os.walk(path):
            if PRETRAINED_FILE in files:
                found.add(Path(folder) / PRETRAINED_FILE)
    return sorted(found)


def load(path: Path) -> Reference:
    """One reference; one line naming the file when it is not a pretrained-geometry entry."""
    entry = read_json(path)
    if (
        not isinstance(entry, dict)
        or not all(isinstance(entry.get(key), dict) for key in ("model", "input", "output"))
        or "name" not in entry["model"]
    ):
        raise TiecliError(
            f"{str(path)!r} is not a pretrained-model geometry entry (tiecli geometry --model writes them)"
        )
    values = {f"{key}_{side}": value for side in ("input", "output") for key, value in entry[side].items()}
    values.update(entry.get("agreement") or {})
    return Reference(label(entry), str(path), values)


def load_all(paths: list[Path]) -> list[Reference]:
    return [load(p) for p in find(paths)]
