"""Offline report of a run or a multirun: ``python src/report.py <run folder | multirun folder>``.

Thin entry point around :func:`diffusion_rl.report.build.build_report`: writes PNG plots (gradient norm
with spikes marked, reward, log-ratio spread, ESS) and ``report.md`` into ``<folder>/report/`` (or
``--out DIR``) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import sys

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.report.build import build_report, markdown_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a run folder (with .hydra/) or a multirun folder")
    parser.add_argument("--out", default=None, help="where to write the report (default: <folder>/report)")
    args = parser.parse_args(argv)
    try:
        report, runs = build_report(args.folder, args.out)
    except FileNotFoundError:
        print(f"report error: {ConfigError('folder', args.folder, 'holds no run folder (a folder with .hydra/)')}",
              file=sys.stderr)
        return 2
    print(markdown_table(runs))
    print(f"\nreport: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
