"""GSM8K rewards (docs/methods.md §5): numeric correctness plus d1's format terms.

* ``gsm8k_correctness_reward``: 2.0 when the prediction equals the gold number. The prediction is
  read where the prompt asks for it (``rewards/prompted.py``): in the last ``<answer>`` block its
  last non-empty ``\\boxed{}``, else the block's last number (an unclosed box or block still counts);
  without an ``<answer>`` tag, or with an empty block, the last non-empty ``\\boxed{}`` anywhere;
  otherwise none (the reasoning's last number is not an answer). Numbers compare as canonical
  decimal strings after removing ``,``, ``$`` and trailing zeros (``$1,234.00`` == ``1234``); a
  number raised to a power (``5²``, ``5^2``, ``10^{3}``) is not read as its base or its exponent.
  ``strict_string=True`` compares the stripped answer text with the gold string exactly (``72.0``
  is wrong); it is *not* d1's rule (d1 reads the text after the last ``<answer>`` and keeps a gold's
  commas): ``task.rewards=d1`` is (``rewards/d1/rewards.py``).
* The format terms follow d1's (``diffu-grpo/reward_func.py``, from Will Brown's GRPO demo) with the
  corrections below: ``xml_count_reward`` (<= 0.5), ``soft_format_reward`` and
  ``strict_format_reward`` (0.5 each), ``int_reward`` (0.5). ``GSM8K_D1_REWARDS`` sums them with
  correctness: at most 4.0 (preset ``d1_fixed``; ``d1`` is d1's own functions).

Deviations from d1's functions (corrections, preset ``d1_fixed``):

* ``xml_count_reward``: 0.125 for each of ``<reasoning>\\n``, ``\\n</reasoning>\\n``,
  ``\\n<answer>\\n`` and ``\\n</answer>`` appearing exactly once, minus 0.001 per character after the
  final ``</answer>`` (surrounding whitespace is free, as d1's ``- 1`` spares one newline),
  floored at 0. d1 subtracts the trailing text twice (once per closing-tag spelling) and can go negative.
* The format checks are literal ``str.find`` scans equivalent to d1's regexes *with* DOTALL
  (d1's have none, so a reasoning over several lines fails both of d1's checks; here it passes),
  linear in the input (in C), so they need no length cap.
* ``int_reward`` is d1's ``str.isdigit`` restricted to ASCII: ``"٣"`` and ``"²"`` are not integers.
  Likewise only ASCII ``0-9`` are digits everywhere here: unicode digits are never normalised.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from diffusion_rl.rewards.answer import column, completion_text, extract_answer
from diffusion_rl.rewards.math500 import last_boxed
from diffusion_rl.rewards.prompted import answer_block

log = logging.getLogger(__name__)

CORRECT_REWARD = 2.0
FORMAT_REWARD = 0.5
XML_TAG_REWARD = 0.125
TRAILING_PENALTY = 0.001  # per character after the final </answer>
MAX_NUMBER_CHARS = 100

# a number that is neither an exponent (^2, ^{2}) nor a base (5², 5^2), nor the tail of a longer run
# of digits; atomic, so that "25²" cannot match as "2"
_NUMBER_TOKEN_RE = re.compile(r"(?>-?(?<![\^0-9.,])(?<!\^\{)[0-9](?:[0-9,]*[0-9])?(?:\.[0-9]+)?)(?![\^⁰¹²³⁴⁵⁶⁷⁸⁹])")
_CANONICAL_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?")
_ASCII_INT_RE = re.compile(r"[0-9]+")
_REASONING_TO_ANSWER_RE = re.compile(r"</reasoning>\s*<answer>")


# ---- numbers ----------------------------------------------------------------------------------
def gsm8k_gold(answer_field: str | int) -> str:
    """The number after the last ``####`` with commas removed (the whole field if there is none)."""
    if not isinstance(answer_field, str):
        return (
            str(answer_field)
            if isinstance(answer_field, int) and not isinstance(answer_field, bool)
            else ""
        )
    return answer_field.rpartition("####")[2].strip().replace(",", "")  # no marker: the whole field


def normalize_number(s: str) -> str | None:
    """Canonical decimal string of a plain number, else None.

    Removes ``,``, ``$`` (also ``\\$``), surrounding spaces and a trailing sentence period; drops
    leading zeros and trailing fractional zeros: ``"$1,234.00"`` -> ``"1234"``, ``"-0.50"`` ->
    ``"-0.5"``, ``"-0"`` -> ``"0"``. ASCII digits only; fractions and exponents are not numbers.
    """
    if not isinstance(s, str) or len(s) > MAX_NUMBER_CHARS:
        return None
    s = s.replace("\\$", "").replace("$", "").replace(",", "").strip().rstrip(".")
    m = _CANONICAL_RE.fullmatch(s)
    if m is None:
        return None
    sign, whole, frac = m.group(1), m.group(2), m.group(3) or ""
    if not whole and not frac:
        return None
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    return body if sign != "-" or body == "0" else f"-{body}"


_DEGREES = ("^{\\circ}", "^\\circ", "°")  # a degree sign, not a power: it ends the number before it


def _last_number(text: str) -> str | None:
    for degrees in _DEGREES:
        text = text.replace(degrees, " ")
    last = None
    for m in _NUMBER_TOKEN_RE.finditer(text):
        last = m
    return None if last is None else last.group(0)


def _box_number(boxed: str) -> str | None:
    return boxed if normalize_number(boxed) is not None else _last_number(boxed)


def extract_gsm8k_prediction(completion: str) -> str | None:
    """The number the completion answers (see the module docstring), else None.

    A box whose content is not a plain number yields the last number inside it
    (``\\boxed{18 \\text{ dollars}}`` -> ``18``).
    """
    text = completion_text(completion)
    block = answer_block(text)
    if block is not None:
        boxed = last_boxed(block)
        pred = (_box_number(boxed) if boxed else None) or _last_number(block)
        if pred is not None:
            return pred
    boxed = last_boxed(text)
    return _box_number(boxed) if boxed else None


def gsm8k_correct(completion: Any, gold: Any, strict_string: bool = False) -> bool:
    gold_str = gsm8k_gold(gold)  # "" for a gold that is neither text nor an integer
    if not gold_str:
        return False
    if strict_string:
        return extract_answer(completion_text(completion)) == gold_str
    pred = extract_gsm8k_prediction(completion)
    if pred is None:
        return False
    pred_num, gold_num = normalize_number(pred), normalize_number(gold_str)
    return pred_num is not None and pred_num == gold_num


# ---- format terms (d1) ------------------------------------------------------------------------
def xml_count_score(text: str) -> float:
    if not isinstance(text, str):
        return 0.0
    score = XML_TAG_REWARD * sum(
        text.count(tag) == 1
        for tag in ("<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>")
    )
    end = text.rfind("</answer>")
    if end >= 0:
        score -= TRAILING_PENALTY * len(text[end + len("</answer>") :].strip())
    return max(score, 0.0)


def strict_format_ok(text: str) -> bool:
    """d1's ``re.match(r"^<reasoning>\\n.*?\\n</reasoning>\\n<answer>\\n.*?\\n</answer>\\n$", DOTALL)``."""
    if not isinstance(text, str):
        return False
    head, mid, tail = "<reasoning>\n", "\n</reasoning>\n<answer>\n", "\n</answer>\n"
    if not text.startswith(head):
        return False
    # `$` (no MULTILINE) matches at the very end or just before a final newline.
    ends = []
    if text.endswith(tail):
        ends.append(len(text) - len(tail))
    if text.endswith(tail + "\n"):
        ends.append(len(text) - len(tail) - 1)
    mid_at = text.find(mid, len(head))  # the earliest middle leaves the most room for the answer
    return bool(ends) and mid_at >= 0 and mid_at + len(mid) <= max(ends)


def soft_format_ok(text: str) -> bool:
    """d1's ``re.match(r"<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>", DOTALL)``."""
    if not isinstance(text, str) or not text.startswith("<reasoning>"):
        return False
    m = _REASONING_TO_ANSWER_RE.search(text, len("<reasoning>"))
    return m is not None and text.find("</answer>", m.end()) >= 0


def int_score(completion: Any) -> float:
    answer = extract_answer(completion_text(completion))
    return FORMAT_REWARD if _ASCII_INT_RE.fullmatch(answer) else 0.0


# ---- TRL-style reward functions ---------------------------------------------------------------


def _map(name: str, score: Callable[..., float], completions: Any, *columns: Any) -> list[float]:
    """``score(completion, *column values)`` per completion; an unexpected error scores 0.0."""
    comps = list(completions) if isinstance(completions, Sequence) else []
    cols = [column(c, len(comps)) for c in columns]
    out = []
    for i, comp in enumerate(comps):
        try:
            out.append(float(score(comp, *(c[i] for c in cols))))
        except Exception as err:  # noqa: BLE001 - defence in depth: a reward must not kill a run
            log.warning("%s failed (%r); scoring 0.0", name, err)
            out.append(0.0)
    return out


def gsm8k_correctness_reward(
    prompts: list[str],
    completions: list[str],
    answer: list[Any],
    strict_string: bool = False,
    **_: Any,
) -> list[float]:
    """2.0 when the prediction equals the gold number (``answer`` may hold ``#### n``), else 0.0."""
    return _map(
        "gsm8k_correctness_reward",
        lambda c, a: CORRECT_REWARD if gsm8k_correct(c, a, strict_string) else 0.0,
        completions,
        answer,
    )


def gsm8k_string_correctness_reward(
    prompts: list[str], completions: list[str], answer: list[Any], **_: Any
) -> list[float]:
    """d1's exact-string correctness: ``gsm8k_correctness_reward(..., strict_string=True)``."""
    return gsm8k_correctness_reward(prompts, completions, answer, strict_string=True)


def xml_count_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """0.125 per well-formed tag seen exactly once, minus 0.001 per trailing character; in [0, 0.5]."""
    return _map("xml_count_reward", lambda c: xml_count_score(completion_text(c)), completions)


def strict_format_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """0.5 for exactly ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>\\n``."""
    return _map(
        "strict_format_reward",
        lambda c: FORMAT_REWARD if strict_format_ok(completion_text(c)) else 0.0,
        completions,
    )


def soft_format_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """0.5 for ``<reasoning>...</reasoning>\\s*<answer>...</answer>`` at the start."""
    return _map(
        "soft_format_reward",
        lambda c: FORMAT_REWARD if soft_format_ok(completion_text(c)) else 0.0,
        completions,
    )


def int_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """0.5 when the answer text is an unsigned ASCII integer (d1's ``isdigit``)."""
    return _map("int_reward", int_score, completions)


GSM8K_D1_REWARDS = [
    ("xml_count", xml_count_reward, 1.0),
    ("soft_format", soft_format_reward, 1.0),
    ("strict_format", strict_format_reward, 1.0),
    ("int", int_reward, 1.0),
    ("correct", gsm8k_correctness_reward, 1.0),  # already 2.0 when correct
]
GSM8K_PLAIN_REWARDS = [("correct", gsm8k_correctness_reward, 1.0)]
