"""``task.rewards=d1``: d1's training rewards (``diffu-grpo/reward_func.py``) exactly, quirks included.

A run that wants d1's training dynamics needs d1's reward values, not corrected ones: these
functions return what d1's do on every completion (checked against d1's code on its released
generations; hand cases per quirk in ``tests/unit/rewards/test_d1_rewards.py``). The corrected set, preset
``d1_fixed``, is ``rewards/gsm8k.py`` and friends; docs/scoring.md lists how they differ.

GSM8K (the sum is at most 4.0 nominally; d1 weights every term 1.0):

* ``d1_xml_count_reward``: 0.125 for each of ``<reasoning>\\n``, ``\\n</reasoning>\\n``,
  ``\\n<answer>\\n`` and ``\\n</answer>`` seen exactly once; the third also costs 0.001 per character
  after the last ``\\n</answer>\\n`` (the whole text when absent), the fourth 0.001 per character
  after the last ``\\n</answer>`` but one. It can be negative.
* ``d1_soft_format_reward`` (0.5): ``<reasoning>`` at the very start, ``</reasoning>`` *on the same
  line*, whitespace, ``<answer>``, ``</answer>`` on the line ``<answer>`` is on (d1's regex has no
  DOTALL: any newline inside the reasoning fails it).
* ``d1_strict_format_reward`` (0.5): exactly ``<reasoning>\\n<one line>\\n</reasoning>\\n<answer>\\n
  <one line>\\n</answer>\\n`` (one more final newline allowed): a multi-line reasoning fails.
* ``d1_int_reward`` (0.5): the answer text ``str.isdigit()``: ``"٣"`` and ``"²"`` count.
* ``d1_gsm8k_correctness_reward`` (2.0): the answer text *equals* the gold string (``72.0``,
  ``\\boxed{72}`` and ``$72`` are wrong; a gold ``43,500`` keeps its comma). The answer text is
  everything after the last ``<answer>`` up to the next ``</answer>``, stripped (the whole text when
  there is no ``<answer>``). The gold is the text between the first and a second ``####`` of the
  ``answer`` column (a column without ``####`` is taken as already extracted, as d1's dataset is).

Countdown (``d1_countdown_reward``): 1.0 right, 0.1 an answer that is wrong or invalid, 0 without a
closed ``<answer>`` block (the last block counts). Validity and value as in d1's evaluation
(``rewards/d1/arith.py``: ``**``, ``//``, decimals and unary signs allowed; no ``eval``, and a power
too large to compute scores 0.1 where d1's ``eval`` would hang).

Sudoku (``d1_sudoku_reward``): the ``str.isdigit()`` characters of the last *closed* ``<answer>``
block (``"²"`` counts as a cell), cut or ``0``-padded to 16; the share of the puzzle's empty cells
equal to the solution's; 0.0 without a closed block or when the puzzle has no empty cell.

MATH (``diffu-grpo/math500_utils.py``):

* ``d1_math_correctness_reward`` (2.0): d1's last box of the completion (the whole completion
  without one) :func:`d1_is_equiv` to the last box of the ``solution`` column (``answer`` when
  there is none). d1 crashes on a gold whose last box never closes; we score such items 0.0.
* ``d1_math_format_reward``: ``0.5 * (1.0 if "<answer>" occurs + (1.0 if a backspace character
  followed by "oxed" is in the first answer block else 0.5))``. d1 writes ``"\\boxed"`` in a plain
  string literal, where ``\\b`` is a backspace, so the box test never passes: 0.75 with an
  ``<answer>`` tag, 0.25 without, whatever the box.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from diffusion_rl.rewards.answer import column, completion_text
from diffusion_rl.rewards.d1.arith import d1_arith_value, d1_uses_numbers
from diffusion_rl.rewards.d1.latex import d1_boxed_answer, d1_is_equiv

log = logging.getLogger(__name__)

TAG_REWARD = 0.125
FORMAT_REWARD = 0.5
CORRECT_REWARD = 2.0
COUNTDOWN_CORRECT, COUNTDOWN_FORMAT = 1.0, 0.1
TOLERANCE = 1e-5
N_CELLS = 16
_BACKSPACE_OXED = "\x08oxed"  # d1's "\boxed" in a plain string: a backspace, then "oxed"
_OPEN, _CLOSE = "<answer>", "</answer>"


# ---- what d1 reads ------------------------------------------------------------------------------
def d1_xml_answer(text: str) -> str:
    """d1's ``extract_xml_answer``: after the last ``<answer>``, up to the next ``</answer>``, stripped."""
    return text.rpartition(_OPEN)[2].partition(_CLOSE)[0].strip()


def d1_last_answer_block(text: str) -> str | None:
    """The last of ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)``: None if none closes."""
    last, pos = None, 0
    while (start := text.find(_OPEN, pos)) >= 0:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        last, pos = text[start + len(_OPEN) : end], end + len(_CLOSE)
    return last


def d1_hash_gold(answer: Any) -> str | None:
    """d1's ``extract_hash_answer``: between the first and a second ``####``, stripped."""
    if not isinstance(answer, str):
        return None if answer is None else str(answer)
    return answer.split("####")[1].strip() if "####" in answer else answer.strip()


# ---- GSM8K format terms -------------------------------------------------------------------------
def d1_xml_count(text: str) -> float:
    # the order of the float operations is d1's, so the sums match to the last bit
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += TAG_REWARD
    if text.count("\n</reasoning>\n") == 1:
        count += TAG_REWARD
    if text.count("\n<answer>\n") == 1:
        count += TAG_REWARD
        count -= len(text.rpartition("\n</answer>\n")[2]) * 0.001
    if text.count("\n</answer>") == 1:
        count += TAG_REWARD
        count -= (len(text.rpartition("\n</answer>")[2]) - 1) * 0.001
    return count


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def d1_soft_format_ok(text: str) -> bool:
    """``re.match(r"<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>", text)`` (``.`` stops at newlines)."""
    head = "<reasoning>"
    if not text.startswith(head):
        return False
    first_line_end = _line_end(text, len(head))
    pos, close, close_line_end = len(head), -1, -1
    while 0 <= (r := text.find("</reasoning>", pos)) < first_line_end:
        pos = r + 1
        a = r + len("</reasoning>")
        while a < len(text) and text[a].isspace():
            a += 1
        if not text.startswith(_OPEN, a):
            continue
        body = a + len(_OPEN)
        if close < body:  # positions only grow from one candidate to the next: find each once
            close = text.find(_CLOSE, body)
            close = len(text) + 1 if close < 0 else close
        if close_line_end < body:
            close_line_end = _line_end(text, body)
        if close < close_line_end:
            return True
    return False


def d1_strict_format_ok(text: str) -> bool:
    """``re.match(r"^<reasoning>\\n.*?\\n</reasoning>\\n<answer>\\n.*?\\n</answer>\\n$", text)``:
    one line of reasoning, one line of answer, ``$`` also before a final newline."""
    head, middle = "<reasoning>\n", "\n</reasoning>\n<answer>\n"
    if not text.startswith(head):
        return False
    reasoning_end = _line_end(text, len(head))
    if not text.startswith(middle, reasoning_end):
        return False
    answer_end = _line_end(text, reasoning_end + len(middle))
    return text[answer_end:] in ("\n</answer>\n", "\n</answer>\n\n")


# ---- TRL-style reward functions -----------------------------------------------------------------
def _per_completion(name: str, completions: Any, score: Callable[..., float], *columns: Any) -> list[float]:
    """``score(text, *column values)`` per completion; an unexpected error scores 0.0 (d1 would crash)."""
    comps = list(completions) if isinstance(completions, Sequence) and not isinstance(completions, str) else []
    cols = [column(c, len(comps)) for c in columns]
    out = []
    for i, comp in enumerate(comps):
        try:
            out.append(float(score(completion_text(comp), *(c[i] for c in cols))))
        except Exception as err:  # noqa: BLE001 - defence in depth: a reward must not kill a run
            log.warning("%s failed (%r); scoring 0.0", name, err)
            out.append(0.0)
    return out


def d1_xml_count_reward(prompts: list[str], completions: list[Any], **_: Any) -> list[float]:
    return _per_completion("d1_xml_count_reward", completions, d1_xml_count)


def d1_soft_format_reward(prompts: list[str], completions: list[Any], **_: Any) -> list[float]:
    return _per_completion("d1_soft_format_reward", completions,
                           lambda t: FORMAT_REWARD if d1_soft_format_ok(t) else 0.0)


def d1_strict_format_reward(prompts: list[str], completions: list[Any], **_: Any) -> list[float]:
    return _per_completion("d1_strict_format_reward", completions,
                           lambda t: FORMAT_REWARD if d1_strict_format_ok(t) else 0.0)


def d1_int_reward(prompts: list[str], completions: list[Any], **_: Any) -> list[float]:
    return _per_completion("d1_int_reward", completions,
                           lambda t: FORMAT_REWARD if d1_xml_answer(t).isdigit() else 0.0)


def d1_gsm8k_correctness_reward(prompts: list[str], completions: list[Any], answer: list[Any],
                                **_: Any) -> list[float]:
    def score(text: str, gold: Any) -> float:
        expected = d1_hash_gold(gold)
        return CORRECT_REWARD if expected is not None and d1_xml_answer(text) == expected else 0.0

    return _per_completion("d1_gsm8k_correctness_reward", completions, score, answer)


def d1_countdown_score(text: str, numbers: Any, target: Any) -> float:
    expr = d1_last_answer_block(text)
    if expr is None:
        return 0.0
    expr = expr.strip()
    if not d1_uses_numbers(expr, list(numbers) if isinstance(numbers, Sequence) else []):
        return COUNTDOWN_FORMAT
    value = d1_arith_value(expr)
    try:
        right = value is not None and abs(value - target) < TOLERANCE
    except TypeError:  # a target that is not a number: d1's except gives the format score
        right = False
    return COUNTDOWN_CORRECT if right else COUNTDOWN_FORMAT


def d1_countdown_reward(prompts: list[str], completions: list[Any], numbers: list[Any], target: list[Any],
                        **_: Any) -> list[float]:
    return _per_completion("d1_countdown_reward", completions, d1_countdown_score, numbers, target)


def d1_sudoku_score(text: str, puzzle: Any, solution: Any) -> float:
    block = d1_last_answer_block(text)
    digits = "" if block is None else "".join(c for c in block.strip() if c.isdigit())
    if not digits:
        return 0.0
    grid = digits[:N_CELLS].ljust(N_CELLS, "0")
    empty = [i for i in range(N_CELLS) if puzzle[i] == "0"]
    return sum(grid[i] == solution[i] for i in empty) / len(empty) if empty else 0.0


def d1_sudoku_reward(prompts: list[str], completions: list[Any], puzzle: list[Any], solution: list[Any],
                     **_: Any) -> list[float]:
    return _per_completion("d1_sudoku_reward", completions, d1_sudoku_score, puzzle, solution)


def d1_math_score(text: str, answer: Any, solution: Any = None) -> float:
    gold_text = solution if isinstance(solution, str) and solution else answer
    gold = d1_boxed_answer(gold_text) if isinstance(gold_text, str) else None
    if gold is None:
        return 0.0
    pred = d1_boxed_answer(text)
    return CORRECT_REWARD if d1_is_equiv(text if pred is None else pred, gold) else 0.0


def d1_math_correctness_reward(prompts: list[str], completions: list[Any], answer: list[Any],
                               solution: list[Any] | None = None, **_: Any) -> list[float]:
    return _per_completion("d1_math_correctness_reward", completions, d1_math_score, answer, solution)


def d1_math_format_score(text: str) -> float:
    tagged = _OPEN in text
    block = text.split(_OPEN)[1].partition(_CLOSE)[0] if tagged else text
    return (float(tagged) + (1.0 if _BACKSPACE_OXED in block else 0.5)) * 0.5


def d1_math_format_reward(prompts: list[str], completions: list[Any], **_: Any) -> list[float]:
    return _per_completion("d1_math_format_reward", completions, d1_math_format_score)
