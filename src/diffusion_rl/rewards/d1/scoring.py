"""``eval.protocol=d1``: d1's evaluation parsers (``eval/parse_and_get_acc.py``), item by item.

The papers' LLaDA rows were scored with these rules; reproducing them, quirks included, is what
lets a number computed here stand beside a published one. Each task's scorer takes the raw
completion (the text after d1's ``<reasoning>`` prefill, special tokens and all) and our item, and
returns ``(answer, points, out_of)``; the metric is ``sum(points) / sum(out_of)``. Our own protocol
(the default) is in ``rewards/gsm8k.py``, ``math500.py``, ``countdown.py`` and ``sudoku.py``; the
docs/scoring.md lists every difference with its count on d1's released generations.

**GSM8K** (accuracy). Gold: the first ``#### <number>`` of the solution, ``$`` and ``,`` allowed,
as a float; *a negative gold cannot be read* (the pattern has no sign), so such items are always
wrong. Prediction, compared as floats (``14.0`` == 14):

1. the *first* ``\\boxed{...}`` (content up to the first ``}``, on one line) that is not empty or
   dots: the whole content if Python's ``float`` reads it (``1_000``, ``inf``, Unicode digits
   included), else its *first* number (``-?\\d+\\.?\\d*``: ``\\boxed{5^2}`` is 5, ``\\boxed{2,500}`` 2);
2. else the *first* ``<answer>...</answer>`` block: its text if ``float`` reads it, else its *last*
   number (``1,234`` reads 234). No closed answer block and no box: no prediction.

**MATH500** (accuracy). Prediction: the last box by :func:`d1_boxed_answer` -- *without any box the
whole completion* is the prediction (never equal to a gold); an empty box or an unterminated last
box falls back to the first ``<answer>`` block. Compared by :func:`d1_is_equiv` (string
normalisation, not mathematical equivalence: ``\\frac{1}{2}`` == ``0.5`` but ``1/2`` != ``0.5``).

**Countdown** (accuracy). Expression: the last box's content; *without any box the whole
completion*; only an unterminated last box falls back to the first ``<answer>`` block (else again
the whole completion). ``\\div`` -> ``/``, ``\\times`` and ``\\cdot`` -> ``*``; then the first
``<expr> = <number>`` anywhere in it (``[0-9+\\-*/() ]+=[0-9. ]+``) keeps only ``<expr>``. Right when
:func:`d1_uses_numbers` and :func:`d1_arith_value` is within 1e-5 of the target.

**Sudoku** (cell accuracy *pooled over cells*: correct empty cells of all puzzles / empty cells
of all puzzles, not the mean of per-puzzle accuracies). The solution is the first of these that
finds non-blank text: digits in a code fence after the first ``<answer>``; the text from the first
``<answer>`` to the first ``</answer>``, ``<|eot_id|>`` or ``<|endoftext|>``; the text after the first
``</answer>``; the first 16 digits followed by ``</answer>``; the first standalone 16-digit run. All
whitespace is removed and *every other character counts as a cell* (``[4321...]`` shifts the grid
by one), cut or ``0``-padded to 16.

Scans are linear; regular expressions that could backtrack quadratically are written as finds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diffusion_rl.rewards.d1.arith import d1_arith_value, d1_uses_numbers
from diffusion_rl.rewards.d1.latex import d1_boxed_answer, d1_is_equiv

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
LLADA_END_TOKENS = ("<|eot_id|>", "<|endoftext|>")
N_CELLS = 16
TOLERANCE = 1e-5

_GOLD_RE = re.compile(r"####\s*\$?([\d,]+(?:\.\d+)?)")
_NUMBER_RE = re.compile(r"-?\d+\.?\d*")
_DOTS_RE = re.compile(r"\.+")
_EXPRESSION_RUN_RE = re.compile(r"[0-9+\-*/() ]+")
_AFTER_EQUALS = frozenset("0123456789. ")
_GRID_BEFORE_CLOSE_RE = re.compile(r"(\d{16})\s*</answer>")  # = d1's r".*?(\d{16})\s*</answer>" with DOTALL
_STANDALONE_GRID_RE = re.compile(r"\b(\d{16})\b")
_WHITESPACE_RE = re.compile(r"\s")


def first_answer_block(text: str) -> str | None:
    """``re.search(r"<answer>(.*?)</answer>", text, re.DOTALL).group(1)``: from the first
    ``<answer>`` to the next ``</answer>``; None when that first tag is never closed."""
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return None
    end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
    return None if end < 0 else text[start + len(ANSWER_OPEN) : end]


def _float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


# ---- GSM8K --------------------------------------------------------------------------------------
def d1_gsm8k_gold(answer_field: Any) -> float | None:
    """The first ``#### <digits>`` as a float (d1's ``Parser.extract_answer_gsm8k``); None for a
    negative gold, which the pattern cannot read."""
    if not isinstance(answer_field, str):
        return None
    m = _GOLD_RE.search(answer_field)
    return None if m is None else _float(m.group(1).replace(",", ""))


def _box_contents(text: str) -> list[str]:
    """``re.findall(r"\\boxed{(.*?)}", text)``: each box up to its first ``}``, within one line."""
    out, pos = [], 0
    while (start := text.find("\\boxed{", pos)) >= 0:
        begin = start + len("\\boxed{")
        close, newline = text.find("}", begin), text.find("\n", begin)
        if close >= 0 and (newline < 0 or close < newline):
            out.append(text[begin:close])
            pos = close + 1
        else:  # no "}" on this line: no box starting on the rest of it can close either
            pos = len(text) if newline < 0 else newline
    return out


def d1_gsm8k_prediction(text: str) -> float | None:
    for content in _box_contents(text):
        content = content.strip()
        if not content or _DOTS_RE.fullmatch(content):
            continue
        value = _float(content)
        if value is not None:
            return value
        numbers = _NUMBER_RE.findall(content)
        if numbers:
            return float(numbers[0])
    block = first_answer_block(text)
    if block is None or not block.strip():
        return None
    block = block.strip()
    value = _float(block)
    if value is not None:
        return value
    numbers = _NUMBER_RE.findall(block)
    return float(numbers[-1]) if numbers else None


def _score_gsm8k(text: str, item: dict[str, Any]) -> tuple[str, float, int]:
    pred, gold = d1_gsm8k_prediction(text), d1_gsm8k_gold(item.get("answer"))
    return ("" if pred is None else repr(pred)), float(pred is not None and pred == gold), 1


# ---- MATH500 ------------------------------------------------------------------------------------
def d1_math_prediction(text: str) -> str | None:
    pred = d1_boxed_answer(text)
    if not pred:  # None (unterminated box) or "" (an empty box): the first answer block, if closed
        block = first_answer_block(text)
        if block is not None:
            pred = block.strip()
    return pred


def _score_math(text: str, item: dict[str, Any]) -> tuple[str, float, int]:
    pred = d1_math_prediction(text)
    return pred or "", float(pred is not None and d1_is_equiv(pred, item.get("answer"))), 1


# ---- Countdown ----------------------------------------------------------------------------------
def d1_countdown_expression(text: str) -> str:
    expr = d1_boxed_answer(text)
    if expr is None:  # only an unterminated box falls back to the answer block
        block = first_answer_block(text)
        expr = text if block is None else block.strip()
    expr = expr.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    return _left_of_equals(expr)


def _left_of_equals(expr: str) -> str:
    """``re.search(r"([0-9+\\-*/() ]+)=[0-9. ]+", expr).group(1).strip()``, else ``expr``.

    The greedy run cannot stop before its maximal end (the next character would be in the run, not
    ``=``), so the match is the first maximal run directly followed by ``=`` and one of ``0-9. ``;
    written as a scan because the regex backtracks quadratically on a long run without ``=``.
    """
    for run in _EXPRESSION_RUN_RE.finditer(expr):
        end = run.end()
        if expr.startswith("=", end) and end + 1 < len(expr) and expr[end + 1] in _AFTER_EQUALS:
            return run.group().strip()
    return expr


def d1_countdown_correct(expr: str, numbers: list[int], target: Any) -> bool:
    if not d1_uses_numbers(expr, numbers):
        return False
    value = d1_arith_value(expr.strip())
    return value is not None and abs(value - target) < TOLERANCE


def _score_countdown(text: str, item: dict[str, Any]) -> tuple[str, float, int]:
    expr = d1_countdown_expression(text)
    return expr, float(d1_countdown_correct(expr, list(item["numbers"]), item["target"])), 1


# ---- Sudoku -------------------------------------------------------------------------------------
def _fenced_digits(text: str) -> str:
    """``<answer>.*?```\\s*([\\d\\s]+)```" (DOTALL), stripped: the first fence after the first
    ``<answer>`` that holds only digits and whitespace up to a closing fence."""
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return ""
    pos = start + len(ANSWER_OPEN)
    while (fence := text.find("```", pos)) >= 0:
        end = fence + 3
        while end < len(text) and (text[end].isdecimal() or text[end].isspace()):
            end += 1
        if end > fence + 3 and text.startswith("```", end):
            return text[fence + 3 : end].strip()  # the regex stops at this first match, blank or not
        pos = fence + 1
    return ""


def _first_of(text: str, start: int, ends: tuple[str, ...], default: int) -> int:
    found = [i for i in (text.find(e, start) for e in ends) if i >= 0]
    return min(found, default=default)


def _after_answer(text: str) -> str:
    """``<answer>(.*?)(?:<|eot_id|>|<|endoftext|>|</answer>)`` (DOTALL), stripped."""
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return ""
    body = start + len(ANSWER_OPEN)
    end = _first_of(text, body, (*LLADA_END_TOKENS, ANSWER_CLOSE), -1)
    return text[body:end].strip() if end >= 0 else ""


def _after_close(text: str) -> str:
    """``</answer>\\s*(.*?)(?:<|eot_id|>|<|endoftext|>|$)`` (DOTALL), stripped. (``$`` also matches
    before a final newline: that newline is stripped all the same, so the text's end stands for both.)"""
    close = text.find(ANSWER_CLOSE)
    if close < 0:
        return ""
    body = close + len(ANSWER_CLOSE)
    while body < len(text) and text[body].isspace():
        body += 1
    return text[body : _first_of(text, body, LLADA_END_TOKENS, len(text))].strip()


def _grid_search(regex: re.Pattern[str]) -> Callable[[str], str]:
    return lambda text: m.group(1).strip() if (m := regex.search(text)) else ""


# d1's patterns in its order; the first that finds non-blank text wins
_SUDOKU_READERS: tuple[Callable[[str], str], ...] = (
    _fenced_digits, _after_answer, _after_close,
    _grid_search(_GRID_BEFORE_CLOSE_RE), _grid_search(_STANDALONE_GRID_RE),
)


def d1_sudoku_solution(text: str) -> str:
    """The grid text d1 reads (whitespace removed, not yet cut or padded); "" if none."""
    for read in _SUDOKU_READERS:
        found = read(text)
        if found:
            return _WHITESPACE_RE.sub("", found)
    return ""


def _score_sudoku(text: str, item: dict[str, Any]) -> tuple[str, float, int]:
    puzzle, solution = item["puzzle"], item["solution"]
    empty = [i for i in range(N_CELLS) if puzzle[i] == "0"]
    grid = d1_sudoku_solution(text)
    if not grid:
        return "", 0.0, len(empty)
    grid = grid[:N_CELLS].ljust(N_CELLS, "0")
    return grid, float(sum(grid[i] == solution[i] for i in empty)), len(empty)


# ---- d1's released generation files ------------------------------------------------------------
def _gsm8k_item(question: str, gold: Any) -> dict[str, Any]:
    # d1 stores the gold as the float it read (None when it could not); "#### 18" reads back the same
    if isinstance(gold, float) and gold.is_integer():
        gold = int(gold)
    return {"question": question, "answer": "" if gold is None else f"#### {gold}"}


def _sudoku_item(question: str, gold: Any) -> dict[str, Any]:
    # d1 reads the puzzle from the question: its first 16 characters if they are digits, else
    # the 16 digits after "Sudoku puzzle: "
    if len(question) >= N_CELLS and question[:N_CELLS].isdigit():
        puzzle = question[:N_CELLS]
    else:
        m = re.search(r"Sudoku puzzle: ([0-9]{16})", question)
        if m is None:
            raise ValueError(f"no 16-digit puzzle in the question {question[:80]!r}")
        puzzle = m.group(1)
    return {"puzzle": puzzle, "solution": str(gold)}


def _countdown_item(question: str, gold: Any) -> dict[str, Any]:
    numbers, target = gold
    return {"numbers": [int(n) for n in numbers], "target": int(target)}


@dataclass(frozen=True)
class D1Protocol:
    """How d1 scores one task: its file prefix, its metric, a scorer, and our item from its record."""

    file_prefix: str  # d1's generation files are ``{file_prefix}_{model}_{length}_{steps}_{shard}_generations.json``
    metric: str
    score: Callable[[str, dict[str, Any]], tuple[str, float, int]]
    item: Callable[[str, Any], dict[str, Any]]  # (question, ground_truth) -> our task's item
    question_key: str | None = None  # our item's field holding d1's question, where the gold is lossy


D1_PROTOCOLS: dict[str, D1Protocol] = {
    "gsm8k": D1Protocol("gsm8k", "accuracy", _score_gsm8k, _gsm8k_item, "question"),
    "math500": D1Protocol("math500", "accuracy", _score_math,
                          lambda q, gold: {"problem": q, "answer": str(gold)}, "problem"),
    "countdown": D1Protocol("countdown", "accuracy", _score_countdown, _countdown_item),
    "sudoku": D1Protocol("sudoku", "cell_accuracy", _score_sudoku, _sudoku_item),
}


def d1_score(task: str, completions: list[str], items: list[dict[str, Any]]) -> tuple[list[tuple[str, float, int]], dict[str, float]]:
    """Per item ``(answer, points, out_of)`` and the metric ``{name: sum(points) / sum(out_of)}``."""
    protocol = D1_PROTOCOLS[task]
    scored = [protocol.score(c if isinstance(c, str) else "", it) for c, it in zip(completions, items, strict=True)]
    total = sum(s[2] for s in scored)
    return scored, {protocol.metric: sum(s[1] for s in scored) / total if total else 0.0}
