"""Where our protocol looks for the answer a chat prompt asks for (the default, not d1's rules).

d1's evaluation prompts ask for ``<answer>\\n\\boxed{...}\\n</answer>`` after a ``<reasoning>`` block,
and LLaDA sometimes writes only one of the two. The text tasks read, in this order:

1. the last ``<answer>`` block (up to ``</answer>``, or to the end when the tag was cut off): its
   last closed ``\\boxed{}`` if it has one, else its own text;
2. when there is no ``<answer>`` tag, or its block is empty: the last non-empty closed ``\\boxed{}``
   anywhere (a box *instead of* the tags);
3. nothing else: a completion cut off before its answer has no answer. The last number of the
   reasoning is not an answer (reading it gave GSM8K answers the model never gave).

:func:`answer_block` finds 1; each task module combines it with ``last_boxed`` (``math500.py``).
:func:`until_end_token` cuts a decoded LLaDA completion at its first end-of-turn / end-of-text
token, as our own decoding does (``models/policy.py``): text generated after the turn ended is
not part of the answer (d1's files keep it, and d1's parsers read it).
"""

from __future__ import annotations

from diffusion_rl.rewards.answer import extract_answer

ANSWER_TAG = "<answer>"
LLADA_END_TOKENS = ("<|eot_id|>", "<|endoftext|>")


def answer_block(text: str) -> str | None:
    """The stripped content of the last ``<answer>`` block (to the end if unclosed); None without an
    ``<answer>`` tag anywhere (one linear scan: a tag is found wherever it is)."""
    if not isinstance(text, str) or ANSWER_TAG not in text:
        return None
    return extract_answer(text)


def until_end_token(text: str) -> str:
    """``text`` before the first LLaDA end token (``<|eot_id|>`` or ``<|endoftext|>``)."""
    cut = len(text)
    for token in LLADA_END_TOKENS:
        at = text.find(token, 0, cut)
        if at >= 0:
            cut = at
    return text[:cut]
