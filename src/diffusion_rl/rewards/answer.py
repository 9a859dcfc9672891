"""What every reward function shares: completions as text, item columns as lists, the answer block."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# The last <answer>...</answer> block wins; an unterminated final <answer> runs to the end.
_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
MAX_SCAN_CHARS = 100_000  # rewards look at most at the tail this long: bounded time on huge strings


def extract_answer(text: str) -> str:
    """The content of the last ``<answer>`` block, else the whole text (SPEC §5)."""
    if not isinstance(text, str):
        return ""
    text = text[-MAX_SCAN_CHARS:]
    last = text.rfind("<answer>")
    if last < 0:
        return text.strip()
    m = _ANSWER_RE.match(text, last)
    return m.group(1).strip() if m else ""


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
