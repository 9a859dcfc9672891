"""Where our protocol reads a chat answer (rewards/prompted.py), and the end of a decoded LLaDA turn.

Run: pytest tests/unit/rewards/test_prompted.py -q
"""

from __future__ import annotations

from diffusion_rl.rewards.prompted import answer_block, until_end_token


def test_answer_block_is_the_last_block_or_none():
    assert answer_block("<answer> 1 </answer> <answer>\n2\n</answer>") == "2"
    assert answer_block("<answer>\n\\boxed{36>") == "\\boxed{36>"  # cut off: runs to the end
    assert answer_block("<answer></answer>") == ""  # a tag with nothing in it
    assert answer_block("so 3 + 4 = 7") is None  # no tag: no block (not the whole text)
    assert answer_block("x</answer>") is None
    assert answer_block("<answer>1</answer>" + "x" * 200_000) == "1"  # found wherever it is (no tail window)
    assert answer_block(None) is None  # type: ignore[arg-type]


def test_until_end_token_cuts_at_the_first_of_either_token():
    assert until_end_token("a\n</answer><|eot_id|>\n\\boxed{0}<|eot_id|><|endoftext|>") == "a\n</answer>"
    assert until_end_token("a<|endoftext|>b<|eot_id|>") == "a"
    assert until_end_token("no token") == "no token"
    # a turn that ends before it starts is empty, for either token
    assert until_end_token("<|eot_id|>a") == "" and until_end_token("<|endoftext|>a<|eot_id|>") == ""
