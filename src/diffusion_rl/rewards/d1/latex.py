"""d1's LaTeX answer handling, reproduced rule for rule (quirks included) for ``eval.protocol=d1``
and ``task.rewards=d1``.

d1 (``eval/parser_helper.py`` and ``diffu-grpo/math500_utils.py``) takes the MATH answer from the
last ``\\boxed`` and compares answers after the string normalisation of the original MATH release
(Hendrycks et al.). This module gives the same results written as our own functions; where d1's
code raises, ours returns None and the caller does what d1's ``try`` does. Quirks kept on purpose
(each has a test in ``tests/unit/rewards/test_d1_latex.py``):

* **No box means the whole text.** :func:`d1_boxed_answer` returns the whole string when it holds
  neither ``\\boxed`` nor ``\\fbox``: d1 then compares the entire completion with the gold.
* **``\\boxed `` (with a space) anywhere wins** over any ``\\boxed{``: the answer is the text after
  the last ``\\boxed `` up to the next ``$``.
* **``\\fbox{...}`` is kept with its command**: ``\\fbox{5}`` is the answer, not ``5``.
* **An unterminated last box** gives None (d1 raises; its callers then fall back).
* **Brace counting starts at the command**: a ``}`` before the first ``{`` makes the count negative,
  and a ``\\}`` counts like ``}``.
* **Normalisation errors fall back to raw equality** (:func:`d1_is_equiv`): ``\\text{ `` twice,
  ``\\frac`` or ``\\sqrt`` at the very end, or exactly one ``/`` with non-integer sides (``x/2``:
  d1's ``int("x")`` raises a ``ValueError`` its handler does not catch) compare the strings as given.
* ``k = 5`` loses its left side only when that side has at most 2 characters (spaces included), and
  only when the string has exactly one ``=``.
* ``0.5`` alone becomes ``\\frac{1}{2}``; ``a/b`` of two integers written canonically becomes
  ``\\frac{a}{b}`` (``+1/2`` or ``01/2`` stay as they are); ``\\frac12`` becomes ``\\frac{1}{2}``.

Every step is a replace, split or find: linear in the input.
"""

from __future__ import annotations

BOXED = "\\boxed"
BOXED_SPACE = "\\boxed "
BOXED_BRACE = "\\boxed{"

# Substrings d1's normalisation deletes, in its order (``\\%`` is deleted twice in d1: same result).
_DELETE_FIRST = ("\n", "\\!")
_DELETE_AFTER_FRAC = ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$")


def d1_last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` *with* its command, the whole text if there is
    neither, None if the last one never closes (d1's ``last_boxed_only_string``)."""
    if BOXED_SPACE in text:
        after = text.rpartition(BOXED_SPACE)[2]
        return BOXED_SPACE + after.partition("$")[0]
    start = text.rfind(BOXED)
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return text
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def d1_unbox(s: str) -> str:
    """``\\boxed{x}`` -> ``x`` and ``\\boxed x`` -> ``x``; anything else unchanged (d1's ``remove_boxed``)."""
    if BOXED_SPACE in s:
        # d1 asserts the prefix here; after d1_last_boxed it always holds
        return s[len(BOXED_SPACE) :] if s.startswith(BOXED_SPACE) else s
    if s.startswith(BOXED_BRACE) and s.endswith("}"):
        return s[len(BOXED_BRACE) : -1]
    return s


def d1_boxed_answer(text: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(text))``: None where d1 raises (an unterminated box)."""
    boxed = d1_last_boxed(text)
    return None if boxed is None else d1_unbox(boxed)


# ---- normalisation (d1's strip_string) ---------------------------------------------------------
class _Raises(Exception):
    """d1's normalisation would raise here; the comparison falls back to raw equality."""


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character); ``\\sqrt`` at the very end raises in d1."""
    parts = s.split("\\sqrt")
    out = [parts[0]]
    for part in parts[1:]:
        if not part:
            raise _Raises
        out.append("\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:])
    return "".join(out)


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``; a bare ``\\frac`` ending
    the string raises in d1; a one-character argument leaves the whole string as it was."""
    parts = s.split("\\frac")
    out = [parts[0]]
    for part in parts[1:]:
        out.append("\\frac")
        if not part:
            raise _Raises
        if part[0] == "{":
            out.append(part)
            continue
        if len(part) < 2:
            return s
        first, second, rest = part[0], part[1], part[2:]
        out.append("{" + first + "}" + ("{" + second + "}" if second != "{" else second) + rest)
    return "".join(out)


def _fix_slash(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are integers written canonically.

    d1 converts each side with ``int()``: a side that is not an integer raises (and is not caught),
    a side ``int()`` accepts but that does not print back the same (``+3``, ``03``, ``1_0``) leaves
    the string unchanged.
    """
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError as err:
        raise _Raises from err
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def d1_normalize(s: str) -> str | None:
    """d1's ``strip_string``, or None where it raises."""
    try:
        for tok in _DELETE_FIRST:
            s = s.replace(tok, "")
        s = s.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
        for tok in _DELETE_AFTER_FRAC:
            s = s.replace(tok, "")
        if "\\text{ " in s:  # units on the right; d1 asserts there is only one
            head, *tails = s.split("\\text{ ")
            if len(tails) != 1:
                raise _Raises
            s = head
        s = s.replace("\\%", "")
        s = s.replace(" .", " 0.").replace("{.", "{0.")
        if not s:
            return s
        if s[0] == ".":
            s = "0" + s
        sides = s.split("=")
        if len(sides) == 2 and len(sides[0]) <= 2:
            s = sides[1]
        s = _fix_sqrt(s).replace(" ", "")
        s = _fix_fracs(s)
        if s == "0.5":
            s = "\\frac{1}{2}"
        return _fix_slash(s)
    except _Raises:
        return None


def d1_is_equiv(pred: str | None, gold: str | None) -> bool:
    """d1's ``is_equiv`` on strings: normalised equality, raw equality where normalising raises."""
    if pred is None or gold is None:
        return pred is None and gold is None
    a, b = d1_normalize(pred), d1_normalize(gold)
    if a is None or b is None:
        return pred == gold
    return a == b
