"""Digit-chain reward and metrics: a synthetic long-answer task (``tasks/chain.py``).

An item is a start line of ``width`` digits and a number of lines ``n``; each line follows from the
one before it by a rule, and the answer is the ``n`` lines after the start line joined by ``;``.
Rules: ``rotate`` (the line moved one digit to the left, ``next[k] = cur[(k + 1) mod width]``: a copy
of the line above, which the embedded model learns within a short warm start) and ``sum``
(``next[k] = (cur[k] + cur[k + 1]) mod 10``, ``cur[width] = 0``: two digits of the line above per
digit; learned far more slowly). The reward is the share of the ``n`` lines
written correctly at their place (lines past ``n`` and a missing ``;`` at the end are ignored), so
one wrong digit costs its line and, since later lines follow from it, usually the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_ANSWER_CHARS = 4096  # bounded work on any completion


RULES = ("rotate", "sum")


def next_line(line: str, rule: str = "rotate") -> str:
    """The line after ``line`` under ``rule`` (module docstring)."""
    if rule == "rotate":
        return line[1:] + line[:1]
    if rule == "sum":
        d = [int(c) for c in line] + [0]
        return "".join(str((d[k] + d[k + 1]) % 10) for k in range(len(line)))
    raise ValueError(f"unknown chain rule {rule!r}; allowed: {', '.join(RULES)}")


def chain_lines(start: str, n: int, rule: str = "rotate") -> list[str]:
    """The ``n`` lines after ``start``."""
    lines, cur = [], start
    for _ in range(n):
        cur = next_line(cur, rule)
        lines.append(cur)
    return lines


def line_score(completion: Any, start: str, lines: int, rule: str = "rotate") -> float:
    """Share of the ``lines`` gold lines the completion writes correctly at their place."""
    text = completion if isinstance(completion, str) else ""
    got = text[:MAX_ANSWER_CHARS].strip().split(";")
    gold = chain_lines(start, int(lines), rule)
    return sum(g == w.strip() for g, w in zip(gold, got)) / max(len(gold), 1)


def chain_reward(prompts: Sequence[str], completions: Sequence[str], start: Sequence[str],
                 lines: Sequence[int], rule: Sequence[str] | None = None, **_: Any) -> list[float]:
    """Share of the gold lines written correctly (TRL signature; never raises)."""
    rules = rule or ["rotate"] * len(completions)
    return [line_score(c, s, n, r) for c, s, n, r in zip(completions, start, lines, rules, strict=True)]


def chain_metrics(completions: Sequence[str], starts: Sequence[str], lines: Sequence[int],
                  rules: Sequence[str]) -> dict[str, float]:
    """``line_accuracy`` (the mean reward) and ``solved_rate`` (every line right, nothing after them)."""
    acc = solved = 0.0
    for c, s, n, r in zip(completions, starts, lines, rules, strict=True):
        acc += line_score(c, s, n, r)
        solved += c.strip() == ";".join(chain_lines(s, int(n), r))
    k = max(len(completions), 1)
    return {"line_accuracy": acc / k, "solved_rate": solved / k}
