"""Run logs: one JSON object per line (``metrics.jsonl``) and the same rows as CSV (``metrics.csv``)."""

from __future__ import annotations

import csv
import json
import math
import os


class RunLogger:
    """Append metric rows to ``<folder>/<name>.jsonl`` and ``<folder>/<name>.csv``.

    The CSV header is the key set of the first row; later rows with new keys are written to the JSONL only
    for those keys (the CSV keeps its columns). ``folder=None`` keeps rows in memory only (``rows``).
    """

    def __init__(self, folder: str | None, name: str = "metrics", *, append: bool = False) -> None:
        self.rows: list[dict] = []
        self.folder, self._csv_cols = folder, None
        if folder:
            os.makedirs(folder, exist_ok=True)
            self.jsonl = os.path.join(folder, f"{name}.jsonl")
            self.csv = os.path.join(folder, f"{name}.csv")
            if not append:
                for p in (self.jsonl, self.csv):
                    if os.path.exists(p):
                        os.remove(p)
            elif os.path.exists(self.csv):
                with open(self.csv) as f:
                    self._csv_cols = next(csv.reader(f), None)

    def log(self, row: dict) -> None:
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.rows.append(row)
        if not self.folder:
            return
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._csv_cols is None:
            self._csv_cols = list(row)
            with open(self.csv, "a", newline="") as f:
                csv.writer(f).writerow(self._csv_cols)
        with open(self.csv, "a", newline="") as f:
            csv.writer(f).writerow(["" if row.get(c) is None else row.get(c) for c in self._csv_cols])


def read_jsonl(path: str) -> list[dict]:
    """All rows of a JSONL log."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
