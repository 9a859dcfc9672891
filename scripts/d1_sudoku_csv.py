"""Write the 4x4 Sudoku test set of d1's released LLaDA generations as a ``Puzzle,Solution`` CSV.

d1's released evaluation files (``d1_llada_eval/sudoku_*_generations.json``, packed in
``tests/fixtures/d1_llada_eval/``; unpack with ``tar -xJf``) hold the
public test puzzles (in each ``question``) and their reference solutions (``ground_truth``). This
writes them once, in file order, as the CSV the Sudoku task reads, so a policy can be evaluated on
the papers' puzzles:

    python scripts/d1_sudoku_csv.py /tmp/d1/d1_llada_eval outputs/data/sudoku_d1_test.csv
    python src/eval.py task=sudoku task.data_path=outputs/data/sudoku_d1_test.csv ckpt_path=<run>
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def puzzles(folder: Path) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    files = sorted(folder.glob("sudoku_*_generations.json"), key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])
    for path in files:
        for g in json.loads(path.read_text())["generations"]:
            found = re.findall(r"\b[0-4]{16}\b", g["question"])
            if found and re.fullmatch(r"[1-4]{16}", str(g["ground_truth"])):
                seen.setdefault(found[-1], str(g["ground_truth"]))
    return list(seen.items())


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    rows = puzzles(Path(sys.argv[1]))
    out = Path(sys.argv[2])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("Puzzle,Solution\n" + "".join(f"{p},{s}\n" for p, s in rows))
    print(f"{len(rows)} puzzles written to {out}")


if __name__ == "__main__":
    main()
