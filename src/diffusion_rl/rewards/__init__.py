"""Reward functions for the benchmarks (docs/methods.md §5), as plain TRL-style callables.

Every function has the signature ``fn(prompts, completions, **fields) -> list[float]`` (one float per
completion; ``fields`` are per-item columns, extra ones are ignored), never raises on any completion
and bounds its work per completion. ``*_REWARDS`` lists are ``(name, fn, weight)`` triples for a
task's composite reward.
"""

from diffusion_rl.rewards.countdown import (
    countdown_numbers_used,
    countdown_reward,
    safe_eval_arith,
    solve_countdown,
)
from diffusion_rl.rewards.gsm8k import (
    GSM8K_D1_REWARDS,
    GSM8K_PLAIN_REWARDS,
    extract_gsm8k_prediction,
    gsm8k_correctness_reward,
    gsm8k_gold,
    gsm8k_string_correctness_reward,
    int_reward,
    normalize_number,
    soft_format_reward,
    strict_format_reward,
    xml_count_reward,
)
from diffusion_rl.rewards.math500 import (
    MATH_REWARDS,
    last_boxed,
    math_correctness_reward,
    math_equal,
    math_format_reward,
)

__all__ = [
    "GSM8K_D1_REWARDS",
    "GSM8K_PLAIN_REWARDS",
    "MATH_REWARDS",
    "countdown_numbers_used",
    "countdown_reward",
    "extract_gsm8k_prediction",
    "gsm8k_correctness_reward",
    "gsm8k_gold",
    "gsm8k_string_correctness_reward",
    "int_reward",
    "last_boxed",
    "math_correctness_reward",
    "math_equal",
    "math_format_reward",
    "normalize_number",
    "safe_eval_arith",
    "soft_format_reward",
    "solve_countdown",
    "strict_format_reward",
    "xml_count_reward",
]
