"""``eval.protocol=d1`` (rewards/d1/scoring.py): one hand case per quirk of d1's parsers, one per
deliberate difference of our protocol (the table in docs/scoring.md), and d1's released LLaDA generations
re-scored to the papers' row, item for item.

Run: pytest tests/unit/rewards/test_d1_eval.py -q
"""

from __future__ import annotations

import pytest

from diffusion_rl.app.evaluate import rescore_generations
from diffusion_rl.rewards.d1.scoring import (
    D1_PROTOCOLS,
    d1_countdown_expression,
    d1_gsm8k_gold,
    d1_gsm8k_prediction,
    d1_math_prediction,
    d1_score,
    d1_sudoku_solution,
)
from tests.unit.tasks.test_text_tasks import compose_eval, make_task

GRID = "4321124334122134"
PUZZLE = "4320004330100004"  # 8 empty cells


def _d1(task: str, completion: str, item: dict) -> tuple[str, float, int]:
    return D1_PROTOCOLS[task].score(completion, item)


# ---- GSM8K ---------------------------------------------------------------------------------------
def test_gsm8k_gold_is_the_first_unsigned_number_after_hashes():
    assert d1_gsm8k_gold("work\n#### $1,234.50") == 1234.5
    assert d1_gsm8k_gold("#### -3") is None  # no sign in d1's pattern: such items are always wrong
    assert _d1("gsm8k", "<answer>\\boxed{-3}</answer>", {"answer": "#### -3"})[1] == 0.0


@pytest.mark.parametrize(
    ("text", "pred"),
    [
        ("\\boxed{5} then \\boxed{6}", 5.0),  # the first box
        ("\\boxed{\\frac{1}{2}}", 1.0),  # content up to the first "}", then its first number
        ("\\boxed{5^2}", 5.0),
        ("\\boxed{2,500}", 2.0),
        ("\\boxed{...} \\boxed{} \\boxed{7}", 7.0),  # empty and dotted boxes are skipped
        ("\\boxed{1_000}", 1000.0),  # whatever Python's float reads
        ("\\boxed{١٨}", 18.0),
        ("<answer>\\boxed{803\n}</answer>", 803.0),  # a box over two lines is no box: the answer block's number
        ("<answer>3</answer> <answer>4</answer>", 3.0),  # the first answer block
        ("<answer>1,234</answer>", 234.0),  # not a float: the block's last number
        ("<answer>18", None),  # an unclosed block is no block
        ("\\boxed{36>", None),
        ("the answer is 7", None),
    ],
)
def test_gsm8k_prediction(text, pred):
    assert d1_gsm8k_prediction(text) == pred


def test_gsm8k_compares_floats():
    assert _d1("gsm8k", "\\boxed{14.0}", {"answer": "#### 14"})[1:] == (1.0, 1)


# ---- MATH500 -------------------------------------------------------------------------------------
def test_math_without_a_box_compares_the_whole_completion():
    text = "<answer>\n5\n</answer>"
    assert d1_math_prediction(text) == text
    assert _d1("math500", text, {"answer": "5"})[1] == 0.0


def test_math_empty_or_unclosed_box_falls_back_to_the_first_answer_block():
    assert d1_math_prediction("\\boxed{} <answer> 5 </answer>") == "5"
    assert d1_math_prediction("<answer> 5 </answer> \\boxed{5") == "5"
    assert d1_math_prediction("\\boxed{5") is None


def test_math_equivalence_is_string_normalisation():
    assert _d1("math500", "\\boxed{0.5}", {"answer": "\\frac12"})[1] == 1.0
    assert _d1("math500", "\\boxed{k = 7}", {"answer": "7"})[1] == 1.0
    assert _d1("math500", "\\boxed{0.25}", {"answer": "\\frac14"})[1] == 0.0  # equal numbers, different strings


# ---- Countdown -----------------------------------------------------------------------------------
CD = {"numbers": [49, 55, 53], "target": 51}


def test_countdown_reads_the_last_box_else_the_whole_completion():
    assert d1_countdown_expression("x \\boxed{1} \\boxed{49 + 55 - 53}") == "49 + 55 - 53"
    assert _d1("countdown", "<answer>\n\\boxed{49 + 55 - 53}\n</answer>", CD)[1] == 1.0
    # without a box the whole completion is the expression: tags make it invalid...
    assert _d1("countdown", "<answer>49 + 55 - 53</answer>", CD)[1] == 0.0
    # ...but the first "expr = number" anywhere is kept
    assert _d1("countdown", "I try 49 + 55 - 53 = 51. Done", CD)[1] == 1.0
    # only an unclosed last box falls back to the first answer block
    assert d1_countdown_expression("<answer> 49+55-53 </answer> \\boxed{x") == "49+55-53"


def test_countdown_latex_operators_and_pythons_arithmetic():
    assert _d1("countdown", "\\boxed{55 \\div 55 \\times 53 - 2}", {"numbers": [55, 55, 53, 2], "target": 51})[1] == 1.0
    assert _d1("countdown", "\\boxed{2**3*1}", {"numbers": [2, 3, 1], "target": 8})[1] == 1.0  # power accepted
    assert _d1("countdown", "\\boxed{7//2}", {"numbers": [7, 2], "target": 3})[1] == 1.0
    assert _d1("countdown", "\\boxed{9**9**9}", {"numbers": [9, 9, 9], "target": 1})[1] == 0.0  # bounded


# ---- Sudoku --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "grid"),
    [
        ("<answer>\n```\n4321 1243\n3412 2134\n```\n</answer>", "4321124334122134"),  # a fence first
        ("<answer>\n[4321124334122134]\n</answer>", "[4321124334122134]"),  # non-digits are cells
        ("<answer>\n4321\n1243<|eot_id|>3412", "43211243"),  # an end token closes the answer
        ("</reasoning>\n</answer>\n4321124334122134<|eot_id|>", "4321124334122134"),  # text after </answer>
        ("the grid 4321124334122134 is it", "4321124334122134"),  # a standalone 16-digit run
        ("no grid 1234", ""),
    ],
)
def test_sudoku_solution(text, grid):
    assert d1_sudoku_solution(text) == grid


def test_sudoku_cells_are_pooled_over_puzzles():
    items = [{"puzzle": PUZZLE, "solution": GRID}, {"puzzle": "0" * 16, "solution": GRID}]
    scored, metric = d1_score("sudoku", [f"<answer>{GRID}</answer>", "<answer>0000</answer>"], items)
    assert [s[1:] for s in scored] == [(8.0, 8), (0.0, 16)]
    assert metric == {"cell_accuracy": 8 / 24}  # pooled; the mean of per-puzzle accuracies is 0.5
    shifted = _d1("sudoku", f"<answer>[{GRID}]</answer>", {"puzzle": PUZZLE, "solution": GRID})
    assert shifted[0] == "[" + GRID[:15] and shifted[1] < 8


# ---- our protocol's deliberate differences (the table in docs/scoring.md) ------------------------
DIFFERENCES = [
    # task, completion (after the "<reasoning>" prefill), item, d1 right, ours right
    ("gsm8k", "<answer>\n\\boxed{-3}\n</answer>", {"question": "q", "answer": "#### -3"}, False, True),
    ("gsm8k", "<answer>\n\\boxed{43,500}\n</answer>", {"question": "q", "answer": "#### 43500"}, False, True),
    ("gsm8k", "</reasoning>\n<answer>\n\\boxed{36>", {"question": "q", "answer": "#### 36"}, False, True),
    ("gsm8k", "<answer>\n\\boxed{803\n}", {"question": "q", "answer": "#### 803"}, False, True),
    ("gsm8k", "makes \\boxed{0} dollars.\n</answer>\n\\boxed{120}", {"question": "q", "answer": "#### 120"}, False, True),
    ("gsm8k", "is \\boxed{162000}\n</reasoning>\n<answer>\n\\boxed{16200}\n</answer>",
     {"question": "q", "answer": "#### 162000"}, True, False),
    ("gsm8k", "<answer>\n\\boxed{2:00 pm}\n</answer>", {"question": "q", "answer": "#### 2"}, True, False),
    ("gsm8k", "is \\boxed{360\\text{ hours} hours.\n</answer>", {"question": "q", "answer": "#### 360"}, True, False),
    ("gsm8k", "<answer>\n\\boxed{5^2}\n</answer>", {"question": "q", "answer": "#### 5"}, True, False),
    ("gsm8k", "so 3 + 4 = 7.\n</reasoning>", {"question": "q", "answer": "#### 7"}, False, False),
    ("math500", "<answer>\n\\boxed{0.25}\n</answer>", {"problem": "p", "answer": "\\frac14"}, False, True),
    ("math500", "<answer>\n\\frac{1}{4}\n</answer>", {"problem": "p", "answer": "\\frac{1}{4}"}, False, True),
    ("countdown", "<answer>\n96 - 48  + 26\n</answer>", {"numbers": [96, 48, 26], "target": 74}, False, True),
    ("countdown", "so 48 + 29 + 16 = 93.\n<answer>\n\\boxed{48 + 29 + 16>", {"numbers": [48, 29, 16], "target": 93},
     True, False),
    ("countdown", "<answer>\n\\boxed{2**3*1}\n</answer>", {"numbers": [2, 3, 1], "target": 8}, True, False),
    ("countdown", "<answer>\n\\boxed{49 + 55 - 53}\n</answer>", CD, True, True),  # the issue: ours read nothing
    ("countdown", "<answer>\n\\boxed{+((43-92)+70)}\n</answer>", {"numbers": [43, 92, 70], "target": 21}, True, True),
    ("sudoku", f"</reasoning>\n</answer>\n{GRID}", {"puzzle": PUZZLE, "solution": GRID}, True, False),
    ("sudoku", f"<answer>\n[{GRID}]\n</answer>", {"puzzle": PUZZLE, "solution": GRID}, False, True),
]


@pytest.mark.parametrize(("task_name", "completion", "item", "d1_right", "ours_right"), DIFFERENCES)
def test_our_protocol_differs_where_documented(tmp_path, task_name, completion, item, d1_right, ours_right):
    extra = ["task.prompt_style=chat"] if task_name == "countdown" else []
    task = make_task(tmp_path, task_name, *extra)
    _, points, out_of = _d1(task_name, completion, item)
    assert (points == out_of) is d1_right
    response = "<reasoning>" + completion
    if task_name == "sudoku":
        ours = task.metrics([response], [item])["cell_accuracy"] == 1.0
    else:
        ours = task.correctness([response], [item])[0]
    assert ours is ours_right


# ---- d1's released generations: the papers' LLaDA row -------------------------------------------
PAPERS = {  # the LLaDA-8B-Instruct row of d1 and its successors: (right, of) per length
    "gsm8k": ("accuracy", {128: (783, 1130), 256: (863, 1130), 512: (883, 1130)}),  # 69.29 / 76.37 / 78.14
    "math500": ("accuracy", {128: (130, 500), 256: (162, 500), 512: (181, 500)}),  # 26.00 / 32.40 / 36.20
    "countdown": ("accuracy", {128: (53, 256), 256: (50, 256), 512: (41, 256)}),  # 20.70 / 19.53 / 16.02
    "sudoku": ("cell_accuracy", {128: (240, 2048), 256: (137, 2048), 512: (112, 2048)}),  # 11.72 / 6.69 / 5.47
}


@pytest.mark.parametrize("task_name", list(PAPERS))
def test_released_generations_give_the_papers_row(tmp_path, task_name, d1_generations):
    metric, expected = PAPERS[task_name]
    # the reward column is not checked here: keep math-verify out of it (slow on 2 cores)
    rewards = ["task.rewards={format: 1.0}"] if task_name == "math500" else []
    if task_name == "sudoku":  # d1 scores the whole grid the model wrote, givens included
        rewards.append("task.pin_givens=false")
    cfg = compose_eval([f"task={task_name}", "mode=score", "eval.protocol=d1", f"generations={d1_generations}", *rewards],
                       tmp_path)
    summary = rescore_generations(cfg, tmp_path / "run")
    assert summary["protocol"] == "d1"
    got = {int(k): v[metric] for k, v in summary["by_length"].items()}
    assert got == {length: right / of for length, (right, of) in expected.items()}
    assert {int(k): v["num_items"] for k, v in summary["by_length"].items()} == {
        length: of // (8 if task_name == "sudoku" else 1) for length, (_, of) in expected.items()}


# ---- the linear scans equal the regular expressions they stand for ------------------------------
def test_scans_equal_d1s_regexes():
    import random
    import re

    from diffusion_rl.rewards.d1 import scoring as d1_eval

    oracles = {  # d1's patterns, each with the scan that replaces it (the regexes backtrack quadratically)
        "box": (lambda s: re.findall(r"\\boxed{(.*?)}", s), d1_eval._box_contents),
        "answer": (lambda s: (m.group(1) if (m := re.search(r"<answer>(.*?)</answer>", s, re.DOTALL)) else None),
                   d1_eval.first_answer_block),
        "equals": (lambda s: (m.group(1).strip() if (m := re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", s)) else s),
                   d1_eval._left_of_equals),
        "fence": (lambda s: (m.group(1).strip() if (m := re.search(r"<answer>.*?```\s*([\d\s]+)```", s, re.DOTALL))
                             else ""), d1_eval._fenced_digits),
        "after answer": (lambda s: (m.group(1).strip() if (m := re.search(
            r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)", s, re.DOTALL)) else ""), d1_eval._after_answer),
        "after close": (lambda s: (m.group(1).strip() if (m := re.search(
            r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)", s, re.DOTALL)) else ""), d1_eval._after_close),
    }
    pieces = ["<answer>", "</answer>", "\\boxed{", "}", "```", "<|eot_id|>", "<|endoftext|>", "\n", " ", "1", "23",
              "=", "+", ".", "x", "(", "٣"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        for name, (regex, scan) in oracles.items():
            assert scan(text) == regex(text), (name, text)
