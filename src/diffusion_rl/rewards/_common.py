"""Input handling shared by the reward functions: completions as text, item columns as lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
