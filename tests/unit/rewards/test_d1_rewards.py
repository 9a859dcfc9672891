"""``task.rewards=d1`` (rewards/d1/rewards.py): d1's training rewards, one hand case per quirk, the
presets that select them, and bounded work where d1's own reward hangs.

Run: pytest tests/unit/rewards/test_d1_rewards.py -q
"""

from __future__ import annotations

import pytest

from diffusion_rl.rewards import gsm8k as ours
from diffusion_rl.rewards.d1 import rewards as d1
from tests.unit.tasks.test_text_tasks import make_task

ONE_LINE = "<reasoning>\n9 - 2 = 7\n</reasoning>\n<answer>\n7\n</answer>\n"
MULTI_LINE = "<reasoning>\n9 - 2\n= 7\n</reasoning>\n<answer>\n7\n</answer>\n"


def _one(fn, completion, **fields):
    return fn([""], [completion], **{k: [v] for k, v in fields.items()})[0]


# ---- GSM8K format terms --------------------------------------------------------------------------
def test_xml_count_subtracts_trailing_text_twice_and_can_go_negative():
    assert _one(d1.d1_xml_count_reward, ONE_LINE) == pytest.approx(0.5)  # one "\n" after: free
    # no final newline: the third term finds no "\n</answer>\n" and charges the whole text; the
    # fourth term's "- 1" turns into a bonus of 0.001
    bare = ONE_LINE[:-1]
    assert _one(d1.d1_xml_count_reward, bare) == pytest.approx(0.5 - 0.001 * len(bare) + 0.001)
    # trailing text costs 0.001 per character in each of the last two terms
    assert _one(d1.d1_xml_count_reward, ONE_LINE + "x" * 10) == pytest.approx(0.5 - 0.010 - 0.010)
    assert _one(d1.d1_xml_count_reward, "\n<answer>\n" + "x" * 500) < 0
    assert _one(ours.xml_count_reward, "\n<answer>\n" + "x" * 500) == 0.125  # d1_fixed: floored, once


def test_format_regexes_have_no_dotall():
    # soft: "." never crosses a newline, so the newline after <reasoning> that the prompt asks for fails it
    assert _one(d1.d1_soft_format_reward, ONE_LINE) == 0.0
    assert _one(ours.soft_format_reward, ONE_LINE) == _one(ours.soft_format_reward, MULTI_LINE) == 0.5  # DOTALL
    # strict: one line of reasoning passes, two fail
    assert _one(d1.d1_strict_format_reward, ONE_LINE) == 0.5
    assert _one(d1.d1_strict_format_reward, MULTI_LINE) == 0.0
    assert _one(ours.strict_format_reward, MULTI_LINE) == 0.5
    # soft: </reasoning> on the first line, any whitespace, <answer>, </answer> on <answer>'s line
    assert _one(d1.d1_soft_format_reward, "<reasoning>r</reasoning>\n\n<answer>7</answer> tail") == 0.5
    assert _one(d1.d1_soft_format_reward, "<reasoning>r</reasoning> <answer>7\n</answer>") == 0.0
    # a later </reasoning> on the first line can still match
    assert _one(d1.d1_soft_format_reward, "<reasoning>a</reasoning> <b> </reasoning>\n<answer>7</answer>") == 0.5
    # strict: one more final newline is allowed ($ before a final "\n"), not two
    assert _one(d1.d1_strict_format_reward, ONE_LINE + "\n") == 0.5
    assert _one(d1.d1_strict_format_reward, ONE_LINE + "\n\n") == 0.0


def test_int_is_str_isdigit():
    for answer, value in [("7", 0.5), ("٣", 0.5), ("²", 0.5), ("7.0", 0.0), ("-7", 0.0)]:
        assert _one(d1.d1_int_reward, f"<answer>{answer}</answer>") == value, answer
    assert _one(ours.int_reward, "<answer>²</answer>") == 0.0  # d1_fixed: ASCII only


def test_correctness_is_exact_string_equality():
    gold = "reasoning\n#### 72"
    assert _one(d1.d1_gsm8k_correctness_reward, "<answer>\n72\n</answer>", answer=gold) == 2.0
    for wrong in ["72.0", "\\boxed{72}", "$72", "72 dollars"]:
        assert _one(d1.d1_gsm8k_correctness_reward, f"<answer>{wrong}</answer>", answer=gold) == 0.0, wrong
    # the gold keeps its comma; the text after the last <answer> counts, up to the next </answer>
    assert _one(d1.d1_gsm8k_correctness_reward, "<answer>43,500</answer>", answer="#### 43,500") == 2.0
    assert _one(d1.d1_gsm8k_correctness_reward, "<answer>1</answer><answer>72", answer=gold) == 2.0
    assert _one(d1.d1_gsm8k_correctness_reward, "72", answer=gold) == 2.0  # no tag: the whole text
    assert _one(d1.d1_gsm8k_correctness_reward, "<answer>72</answer>", answer="72") == 2.0  # already extracted


# ---- Countdown, Sudoku ---------------------------------------------------------------------------
def test_countdown_levels_and_pythons_arithmetic():
    nums, target = [2, 3, 1], 8
    assert _one(d1.d1_countdown_reward, "<answer>2**3*1</answer>", numbers=nums, target=target) == 1.0
    assert _one(d1.d1_countdown_reward, "<answer>2*3+1</answer>", numbers=nums, target=target) == 0.1
    assert _one(d1.d1_countdown_reward, "<answer>2**3", numbers=nums, target=target) == 0.0  # no closed block
    assert _one(d1.d1_countdown_reward, "\\boxed{2**3*1}", numbers=nums, target=target) == 0.0  # boxes unread
    # the last closed block counts
    assert _one(d1.d1_countdown_reward, "<answer>2**3*1</answer> <answer>1</answer>", numbers=nums, target=8) == 0.1


def test_countdown_reward_is_bounded_where_d1_hangs():
    # d1's eval would compute 9**(9**9); here it is "too large", wrong, at once
    assert _one(d1.d1_countdown_reward, "<answer>9**9**9</answer>", numbers=[9, 9, 9], target=1) == 0.1


def test_sudoku_reads_isdigit_characters_of_a_closed_block():
    puzzle, grid = "4320004330100004", "4321124334122134"
    assert _one(d1.d1_sudoku_reward, f"<answer>{grid}</answer>", puzzle=puzzle, solution=grid) == 1.0
    assert _one(d1.d1_sudoku_reward, f"<answer>{grid}", puzzle=puzzle, solution=grid) == 0.0  # unclosed
    # "²" is a digit to str.isdigit: it takes a cell and shifts the rest
    assert _one(d1.d1_sudoku_reward, f"<answer>²{grid}</answer>", puzzle=puzzle, solution=grid) < 1.0
    assert _one(d1.d1_sudoku_reward, f"<answer>{grid}</answer>", puzzle=grid, solution=grid) == 0.0  # no empty cell


# ---- MATH ----------------------------------------------------------------------------------------
def test_math_correctness_uses_the_solutions_last_box_and_string_normalisation():
    fields = {"answer": "\\frac{1}{2}", "solution": "so \\boxed{\\dfrac12}"}
    assert _one(d1.d1_math_correctness_reward, "<answer>\\boxed{0.5}</answer>", **fields) == 2.0
    assert _one(d1.d1_math_correctness_reward, "<answer>\\boxed{2/4}</answer>", **fields) == 0.0
    assert _one(d1.d1_math_correctness_reward, "<answer>0.5</answer>", **fields) == 0.0  # no box: whole text
    # a gold whose last box never closes crashes d1; here that item scores 0
    assert _one(d1.d1_math_correctness_reward, "\\boxed{1}", answer="1", solution="\\boxed{1") == 0.0


def test_math_format_box_test_never_passes():
    # d1's "\boxed" is a backspace then "oxed": 0.5 * (tag + 0.5)
    assert _one(d1.d1_math_format_reward, "<answer>\\boxed{1}</answer>") == 0.75
    assert _one(d1.d1_math_format_reward, "\\boxed{1}") == 0.25
    assert _one(d1.d1_math_format_reward, "<answer>\x08oxed</answer>") == 1.0


def test_rewards_never_raise():
    for fn in (d1.d1_xml_count_reward, d1.d1_soft_format_reward, d1.d1_int_reward, d1.d1_math_format_reward):
        assert fn([], [None, 3, [{"content": ONE_LINE}]]) == fn([], ["", "", ONE_LINE])
    assert d1.d1_countdown_reward([], ["<answer>1</answer>"], numbers=[None], target=[None]) == [0.1]


# ---- presets -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("task_name", "overrides", "names"),
    [
        ("gsm8k", [], ["xml_count", "soft_format", "strict_format", "int", "correct"]),  # auto = d1_fixed
        ("gsm8k", ["task.rewards=d1"], ["d1_xml_count", "d1_soft_format", "d1_strict_format", "d1_int", "d1_correct"]),
        ("math500", ["task.rewards=d1"], ["d1_correct", "d1_format"]),
        ("math500", ["task.rewards=d1_fixed"], ["format", "correct"]),
        ("countdown", ["task.rewards=d1"], ["d1_correct"]),
        ("sudoku", ["task.rewards=d1"], ["d1_cell"]),
        ("sudoku", [], ["cell"]),
    ],
)
def test_presets(tmp_path, task_name, overrides, names):
    assert [n for n, _, _ in make_task(tmp_path, task_name, *overrides).reward_functions()] == names


def test_d1_preset_scores_as_d1(tmp_path):
    task = make_task(tmp_path, "gsm8k", "task.rewards=d1")
    item = {"question": "q", "answer": "#### 72"}
    # d1's most for a right answer in the prompted format: 3.5 (soft never passes), 3.0 over two lines
    assert task.rewards([ONE_LINE.replace("7\n</answer>", "72\n</answer>")], [item]).item() == pytest.approx(3.5)
    assert task.rewards([MULTI_LINE.replace("7\n</answer>", "72\n</answer>")], [item]).item() == pytest.approx(3.0)
    fixed = make_task(tmp_path, "gsm8k", "task.rewards=d1_fixed")
    assert fixed.rewards([MULTI_LINE.replace("7\n</answer>", "72\n</answer>")], [item]).item() == pytest.approx(4.0)
    sudoku = make_task(tmp_path, "sudoku", "task.rewards=d1")
    item = {"puzzle": "4320004330100004", "solution": "4321124334122134"}
    assert sudoku.rewards(["4321124334122134"], [item]).item() == 1.0  # a compact answer is read as tagged


def test_format_scans_equal_d1s_regexes():
    import random
    import re

    soft = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>")
    strict = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")
    pieces = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "7", "x", "\t"]
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert d1.d1_soft_format_ok(text) == bool(soft.match(text)), text
        assert d1.d1_strict_format_ok(text) == bool(strict.match(text)), text
        assert d1.d1_last_answer_block(text) == (re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL) or [None])[-1]


# ---- the readers and scores one by one ------------------------------------------------------------
def test_hash_gold_is_between_the_first_two_hashes():
    assert d1.d1_hash_gold("a #### 1 #### 2") == "1"
    assert d1.d1_hash_gold(" 72 ") == "72"  # already extracted
    assert d1.d1_hash_gold(72) == "72" and d1.d1_hash_gold(None) is None


def test_countdown_score_edges():
    # 1/100000 is the double nearest 1e-5, TOLERANCE itself: |value - 0| < 1e-5 fails by nothing
    assert d1.d1_countdown_score("<answer>1/100000</answer>", [1, 100000], 0) == 0.1
    assert d1.d1_countdown_score("<answer>1/100000</answer>", [1, 100000], 1e-5) == 1.0
    # a target that is not a number: d1's except gives the format score, never the full one
    assert d1.d1_countdown_score("<answer>1+2</answer>", [1, 2], "3") == 0.1
    assert d1.d1_countdown_score("<answer>1+2</answer>", [1, 2], 3) == 1.0


def test_sudoku_score_edges():
    grid, puzzle = "4321124334122134", "4320004330100004"
    assert d1.d1_sudoku_score("no block", puzzle, grid) == 0.0
    assert d1.d1_sudoku_score(f"<answer>{grid}</answer>", grid, grid) == 0.0  # no empty cell
    # a short grid is padded with "0" on the right: its first cells stay in place
    assert d1.d1_sudoku_score("<answer>4321</answer>", "0" * 16, grid) == 4 / 16
    assert d1.d1_sudoku_score(f"<answer>{grid[:8]}</answer>", puzzle, grid) == 3 / 8  # cells 3, 4, 5 of 8


def test_math_score_gold_is_the_solutions_box_else_the_answer():
    assert d1.d1_math_score("\\boxed{2}", "1", solution="work \\boxed{2}") == 2.0  # the solution's box wins
    assert d1.d1_math_score("\\boxed{1}", "1", solution="work \\boxed{2}") == 0.0
    assert d1.d1_math_score("\\boxed{2}", "2") == 2.0  # no solution: the answer
    assert d1.d1_math_score("\\boxed{2}", "2", solution="") == 2.0  # an empty solution: the answer
    assert d1.d1_math_score("\\boxed{2}", 2) == 0.0  # an answer that is not text: no gold
    # a completion whose last box never closes is compared whole; here d1's "\\boxed " rule makes a gold
    # that equals it ("\\boxed " runs to the next "$")
    assert d1.d1_math_score("so \\boxed{5", "x", solution="\\boxed so \\boxed{5$") == 2.0


def test_math_format_reads_the_first_answer_block_only():
    assert d1.d1_math_format_score("<answer>a</answer>\x08oxed") == 0.75  # after the block
    assert d1.d1_math_format_score("<answer>a</answer>\x08oxed</answer>") == 0.75  # after its first close
    assert d1.d1_math_format_score("<answer>a<answer>\x08oxed</answer>") == 0.75  # in the second block
    assert d1.d1_math_format_score("<answer>\x08oxed</answer> <answer>a</answer>") == 1.0


def test_completions_that_are_not_a_list_score_nothing():
    assert d1.d1_xml_count_reward([], "<reasoning>\n") == []  # a string is not a list of completions
    assert d1.d1_xml_count_reward([], None) == []


@pytest.mark.parametrize(
    ("reward", "breaks", "fields"),
    [
        ("d1_xml_count_reward", "d1_xml_count", {}),
        ("d1_soft_format_reward", "d1_soft_format_ok", {}),
        ("d1_strict_format_reward", "d1_strict_format_ok", {}),
        ("d1_int_reward", "d1_xml_answer", {}),
        ("d1_gsm8k_correctness_reward", "d1_hash_gold", {"answer": "#### 1"}),
        ("d1_countdown_reward", "d1_countdown_score", {"numbers": [1], "target": 1}),
        ("d1_sudoku_reward", "d1_sudoku_score", {"puzzle": "0" * 16, "solution": "1" * 16}),
        ("d1_math_correctness_reward", "d1_math_score", {"answer": "1"}),
        ("d1_math_format_reward", "d1_math_format_score", {}),
    ],
)
def test_a_failing_reward_scores_zero_and_names_itself(monkeypatch, caplog, reward, breaks, fields):
    def broken(*args, **kwargs):
        raise RuntimeError("a reader's bug")

    monkeypatch.setattr(d1, breaks, broken)
    with caplog.at_level("WARNING", logger=d1.__name__):
        assert _one(getattr(d1, reward), "<answer>1</answer>", **fields) == 0.0
    assert [r.args[0] for r in caplog.records if r.name == d1.__name__] == [reward]  # which reward failed
