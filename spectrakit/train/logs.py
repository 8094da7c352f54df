"""Run logs: one JSON object per line (``metrics.jsonl``) and the same rows as CSV (``metrics.csv``)."""

from __future__ import annotations

import csv
import io
import json
import math
import os

from spectrakit._files import open_append, read_regular, write_atomic


class RunLogger:
    """Append metric rows to ``<folder>/<name>.jsonl`` and ``<folder>/<name>.csv``.

    The CSV header is the key set of the first row; later rows with new keys are written to the JSONL only
    for those keys (the CSV keeps its columns). ``folder=None`` keeps rows in memory only (``rows``).
    """

    def __init__(self, folder: str | None, name: str = "metrics", *, append: bool = False) -> None:
        self.rows: list[dict] = []
        self.folder, self._csv_cols = folder, None
        self._fresh = False
        if folder:
            os.makedirs(folder, exist_ok=True)
            self.jsonl = os.path.join(folder, f"{name}.jsonl")
            self.csv = os.path.join(folder, f"{name}.csv")
            if not append:
                self._fresh = True  # old files are removed at the first row (unless resume() keeps them)
            elif os.path.exists(self.csv):
                with open(self.csv) as f:
                    self._csv_cols = next(csv.reader(f), None)

    def resume(self, last_step: int, key: str = "step") -> list[dict]:
        """Continue an interrupted run: keep the rows of the existing log whose ``key`` is at most
        ``last_step`` (the rows after the checkpoint are dropped, so they are not logged twice), load them
        into :attr:`rows` and append from there. Returns the kept rows."""
        self._fresh = False
        if not self.folder:
            return self.rows
        kept = [r for r in (read_jsonl(self.jsonl) if os.path.exists(self.jsonl) else [])
                if r.get(key, -math.inf) is not None and r.get(key, -math.inf) <= last_step]
        self.rows = kept
        write_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
        self._csv_cols = list(kept[0]) if kept else None
        buf = io.StringIO(newline="")
        if kept:
            w = csv.writer(buf)
            w.writerow(self._csv_cols)
            w.writerows(["" if r.get(c) is None else r.get(c) for c in self._csv_cols] for r in kept)
        write_atomic(self.csv, buf.getvalue())
        return kept

    def log(self, row: dict) -> None:
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.rows.append(row)
        if not self.folder:
            return
        if self._fresh:
            self._fresh = False
            for p in (self.jsonl, self.csv):
                if os.path.exists(p):
                    os.remove(p)
        with open_append(self.jsonl) as f:
            f.write(json.dumps(row) + "\n")
        if self._csv_cols is None:
            self._csv_cols = list(row)
            with open_append(self.csv, newline="") as f:
                csv.writer(f).writerow(self._csv_cols)
        with open_append(self.csv, newline="") as f:
            csv.writer(f).writerow(["" if row.get(c) is None else row.get(c) for c in self._csv_cols])


def read_jsonl(path: str) -> list[dict]:
    """All rows of a JSONL log (a regular file of at most 1 GiB; ``ValueError`` otherwise)."""
    return [json.loads(line) for line in read_regular(path, 1 << 30, "log").splitlines() if line.strip()]
