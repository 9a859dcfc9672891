"""What every reward function shares: completions as text, item columns as lists, the answer block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The last <answer>...</answer> block wins; an unterminated final <answer> runs to the end.
_OPEN, _CLOSE = "<answer>", "</answer>"


def extract_answer(text: str) -> str:
    """The content of the last ``<answer>`` block, else the whole text (docs/methods.md §5).

    Bounded by work, not by position: one ``rfind`` over the whole text and one ``find`` from the
    tag (both linear, in C), so an answer is found wherever it is; what the caller does with a huge
    answer is the caller's bound (e.g. Countdown rejects expressions over 1000 characters).
    """
    if not isinstance(text, str):
        return ""
    last = text.rfind(_OPEN)
    if last < 0:
        return text.strip()
    start = last + len(_OPEN)
    end = text.find(_CLOSE, start)
    return (text[start:] if end < 0 else text[start:end]).strip()


def completion_text(completion: Any) -> str:
    """A completion as text; TRL's conversational form is its last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        return content if isinstance(content, str) else ""
    return ""


def column(values: Any, n: int) -> list[Any]:
    """A per-item field as a list of exactly ``n`` values (missing ones are None)."""
    values = list(values) if isinstance(values, Sequence) and not isinstance(values, str) else []
    return (values + [None] * n)[:n]
