"""Compact a recorded experiment's folder for the repository, in place.

A result page under ``docs/results/`` keeps each run's ``summary.json``, ``.hydra/config.yaml``,
``.hydra/overrides.yaml`` and ``train.log`` as they are, its metrics as ``metrics.csv.xz`` (every row
and column, 7 significant digits), each test item's reward as ``eval_rewards.csv.xz``, and its report
with palette PNGs; the generations (``eval_generations.jsonl``), training samples (``samples.jsonl``)
and Hydra's own settings (``.hydra/hydra.yaml``) go, since re-running the page's command at its commit
regenerates them. ``python src/report.py`` reads the compacted folder as it read the original
(``diffusion_rl.report.compact`` says what is kept and how).

    cp -r <multirun folder>/* docs/results/<name>/      # the runs, beside the page's INTRO.md
    python src/report.py docs/results/<name> --out docs/results/<name>
    python scripts/compact_results.py docs/results/<name>

Running it again on a compacted folder changes nothing.
"""

from __future__ import annotations

import argparse

from diffusion_rl.report.compact import compact_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="a recorded experiment's folder (docs/results/<name>)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        done = compact_folder(folder)
        print(f"{folder}: {done.runs} runs, {done.plots} plots compacted; "
              f"{done.bytes_before:,} -> {done.bytes_after:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
