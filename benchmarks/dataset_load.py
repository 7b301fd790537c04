"""Loading a conversation dataset: the registry cache against a compile per row, side by side in one process.

    python benchmarks/dataset_load.py

1000 rows (the ten example conversations, a hundred times over) share one tool list: DatasetDomain compiles
each distinct list once; the comparison compiles every row's schemas again, as the first version did.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from envace_gym.domains import DatasetDomain

DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "openai.jsonl"


class _NeverKeeps(dict):
    def get(self, key, default=None):
        return None

    def setdefault(self, key, value):
        return value


class _CompilePerRow(DatasetDomain):
    def __setattr__(self, name, value):
        super().__setattr__(name, _NeverKeeps() if name == "_compiled" else value)


def main() -> None:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    rows = [{**row, "id": f"{row['id']}/{k}"} for k in range(100) for row in rows]
    times: dict[str, list[float]] = {"cached": [], "per row": []}
    for _ in range(3):  # interleaved, best of three: this machine is noisy
        for label, cls in (("cached", DatasetDomain), ("per row", _CompilePerRow)):
            started = time.perf_counter()
            cls(rows, name="desk")
            times[label].append(time.perf_counter() - started)
    cached, per_row = min(times["cached"]), min(times["per row"])
    print(f"{len(rows)} rows, one shared tool list (best of 3): cached {cached:.2f} s, "
          f"compiled per row {per_row:.2f} s, {per_row / cached:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
