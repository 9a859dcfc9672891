"""Digit-chain reward and metrics: a synthetic long-answer task (``tasks/chain.py``).

An item is a start line of ``width`` digits and a number of lines ``n``; each line follows from the
one before it by ``next[k] = (cur[k] + cur[k + 1]) mod 10`` (``cur[width] = 0``), and the answer
is the ``n`` lines after the start line joined by ``;``. The reward is the share of the ``n`` lines
written correctly at their place (lines past ``n`` and a missing ``;`` at the end are ignored), so
one wrong digit costs its line and, since later lines follow from it, usually the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_ANSWER_CHARS = 4096  # bounded work on any completion


def next_line(line: str) -> str:
    """``next[k] = (cur[k] + cur[k + 1]) mod 10``, the digit after the last one counting as 0."""
    d = [int(c) for c in line] + [0]
    return "".join(str((d[k] + d[k + 1]) % 10) for k in range(len(line)))


def chain_lines(start: str, n: int) -> list[str]:
    """The ``n`` lines after ``start``."""
    lines, cur = [], start
    for _ in range(n):
        cur = next_line(cur)
        lines.append(cur)
    return lines


def line_score(completion: Any, start: str, lines: int) -> float:
    """Share of the ``lines`` gold lines the completion writes correctly at their place."""
    text = completion if isinstance(completion, str) else ""
    got = text[:MAX_ANSWER_CHARS].strip().split(";")
    gold = chain_lines(start, int(lines))
    return sum(g == w.strip() for g, w in zip(gold, got)) / max(len(gold), 1)


def chain_reward(prompts: Sequence[str], completions: Sequence[str], start: Sequence[str],
                 lines: Sequence[int], **_: Any) -> list[float]:
    """Share of the gold lines written correctly (TRL signature; never raises)."""
    return [line_score(c, s, n) for c, s, n in zip(completions, start, lines, strict=True)]


def chain_metrics(completions: Sequence[str], starts: Sequence[str], lines: Sequence[int]) -> dict[str, float]:
    """``line_accuracy`` (the mean reward) and ``solved_rate`` (every line right, nothing after them)."""
    acc = solved = 0.0
    for c, s, n in zip(completions, starts, lines, strict=True):
        acc += line_score(c, s, n)
        solved += c.strip() == ";".join(chain_lines(s, int(n)))
    k = max(len(completions), 1)
    return {"line_accuracy": acc / k, "solved_rate": solved / k}
