"""Reward functions: hand cases, d1 agreement, hostile inputs, time bounds, and gold/perturbed
answers over every row of the benchmark files in tests/fixtures/.

Run: PYTHONPATH=src pytest tests/unit/rewards/test_rewards.py -q
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import json
import re
import signal
import threading
import time
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffusion_rl.rewards import (
    GSM8K_D1_REWARDS,
    GSM8K_PLAIN_REWARDS,
    MATH_REWARDS,
    countdown_numbers_used,
    countdown_reward,
    extract_gsm8k_prediction,
    gsm8k_correctness_reward,
    gsm8k_gold,
    gsm8k_string_correctness_reward,
    int_reward,
    last_boxed,
    math_correctness_reward,
    math_equal,
    math_format_reward,
    normalize_number,
    safe_eval_arith,
    soft_format_reward,
    solve_countdown,
    strict_format_reward,
    xml_count_reward,
)
from diffusion_rl.rewards import gsm8k as gsm8k_mod
from diffusion_rl.rewards import math500 as math_mod
from tests.conftest import FIXTURES

# per completion (docs/methods.md §5), generous so that a loaded 2-core machine cannot flake it: the
# property is that no input makes a reward run away (catastrophic backtracking takes minutes); speed
# is benchmarks' business
TIME_BOUND_S = 5.0
needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None,
    reason="math-verify not installed (pip install math-verify): equivalence falls back to strings",
)
D1_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", re.DOTALL)
D1_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
PERFECT = "<reasoning>\nstep one\nstep two\n</reasoning>\n<answer>\n72\n</answer>\n"


def _one(fn, completion, **fields):
    return fn(["prompt"], [completion], **{k: [v] for k, v in fields.items()})


@pytest.fixture(scope="module", autouse=True)
def _warm_and_freeze():
    """Load math-verify (lazy, ~2 s once), start the reward's worker pool, and freeze the heap before
    anything is timed.

    A full GC pass over this process's heap (torch, sympy, hypothesis) takes up to ~1 s on a loaded
    2-core machine whatever the input; ``gc.freeze`` keeps such pauses out of the per-call timings
    while objects created by the rewards are still collected normally.
    """
    math_equal("1", "\\frac{2}{2}")
    math_correctness_reward([""], ["<answer>\\boxed{0.5}</answer>"], answer=["\\frac12"])
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


# ---- countdown --------------------------------------------------------------------------------
NUMS, TARGET = [30, 100, 93], 23


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>30+93-100</answer>", 1.0),
        ("<reasoning>x</reasoning><answer> (93 - 100) + 30 </answer>", 1.0),
        ("<answer>30+93-100 = 23</answer>", 1.0),  # a trailing "= target" is stripped
        ("<answer>30+93-100 = 24</answer>", 0.1),
        ("<answer>30+93-100 = 23 = 23</answer>", 0.1),
        ("<answer>30+93-99</answer>", 0.1),  # wrong value, unused/foreign numbers
        ("<answer>30+93-100+30-30</answer>", 0.1),  # right value, 30 reused
        ("<answer>123-100</answer>", 0.1),  # right value, numbers missing
        ("<answer>(30+93-100)**1</answer>", 0.1),  # power operator
        ("<answer>(30+93-100)//1</answer>", 0.1),
        ("<answer>30.0+93-100</answer>", 0.1),
        ("<answer>٣0+93-100</answer>", 0.1),  # unicode digit is not a digit
        ("<answer>+30+93-100</answer>", 1.0),  # unary plus, like unary minus, reuses no number
        ("<answer>\n\\boxed{30 + 93 - 100}\n</answer>", 1.0),  # the box d1's evaluation prompt asks for
        ("<reasoning>r</reasoning>\\boxed{30 \\times 1 + 93 - 100}", 0.1),  # a box instead of tags; 1 is no given number
        ("<reasoning>r</reasoning>\\boxed{(100 - 30) \\div 1}", 0.1),
        ("<answer></answer>", 0.1),
        ("<answer>30+93-100", 1.0),  # unterminated final block runs to the end (extract_answer)
        ("30+93-100", 0.0),  # correct but no <answer> tag
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_countdown_hand_cases(completion, expected):
    assert _one(countdown_reward, completion, numbers=NUMS, target=TARGET) == [expected]


def test_countdown_field_forms_and_operators():
    # comma strings and string targets are accepted
    assert _one(
        countdown_reward, "<answer>30+93-100</answer>", numbers="30,100,93", target="23"
    ) == [1.0]
    assert _one(
        countdown_reward, "<answer>30+93-100</answer>", numbers="30, 100, 93", target=23
    ) == [1.0]
    # power would be right here (2**3*1 = 8) but is not an allowed operator
    assert _one(countdown_reward, "<answer>2**3*1</answer>", numbers=[2, 3, 1], target=8) == [0.1]
    assert _one(countdown_reward, "<answer>(2+1)*3-1</answer>", numbers=[2, 3, 1, 1], target=8) == [
        1.0
    ]
    # division by zero is wrong; the same numbers used validly are right
    assert _one(countdown_reward, "<answer>5+1/0</answer>", numbers=[1, 0, 5], target=5) == [0.1]
    assert _one(countdown_reward, "<answer>5+0*1</answer>", numbers=[1, 0, 5], target=5) == [1.0]
    # unary minus is allowed (documented choice); exact fractions: 1/3*3 == 1
    assert _one(countdown_reward, "<answer>-5+2*3</answer>", numbers=[5, 2, 3], target=1) == [1.0]
    assert _one(countdown_reward, "<answer>1/3*3</answer>", numbers=[1, 3, 3], target=1) == [1.0]
    # missing / malformed gold never raises
    assert _one(countdown_reward, "<answer>1+1</answer>", numbers=None, target=None) == [0.1]
    assert countdown_reward([], ["<answer>1</answer>", "x"], numbers=[[1]], target=[1]) == [
        1.0,
        0.0,
    ]


def test_safe_eval_arith():
    assert safe_eval_arith("1/3+1/3+1/3") == Fraction(1)
    assert safe_eval_arith("2*(3+4)") == 14
    assert safe_eval_arith("-(-3)") == 3
    assert safe_eval_arith("+3") == 3 and safe_eval_arith("+((43-92)+70)") == 21  # unary plus, as LLaDA writes it
    assert safe_eval_arith("((((1))))") == 1
    assert safe_eval_arith(" 7 /\n2 ") == Fraction(7, 2)
    for bad in [
        "1/0",
        "1/(2-2)",
        "2**3",
        "2//3",
        "2%3",
        "abs(1)",
        "1.5",
        "1e3",
        "",
        "()",
        "٣",
        "1_000",
        "01",
        "x",
        "__import__('os')",
        "9**9**9",
        "(" * 10**5,
        None,
        3,
    ]:
        assert safe_eval_arith(bad) is None, bad
    assert safe_eval_arith("1+" * 100 + "1") is None  # longer than max_len=200
    assert safe_eval_arith("1+" * 100 + "1", max_len=1000) == 101
    assert safe_eval_arith("-" * 150 + "1") == 1
    assert safe_eval_arith("-" * 300 + "1", max_len=1000) is None  # deeper than the walker allows


def test_countdown_numbers_used():
    assert countdown_numbers_used("30+93-100") == [30, 93, 100]
    assert countdown_numbers_used("(7*7)/7") == [7, 7, 7]
    assert countdown_numbers_used("٣+3") == [3]
    assert countdown_numbers_used("9" * 10**5) == []  # longer than max_len: not inspected


def test_solve_countdown():
    expr = solve_countdown([30, 100, 93], 23)
    assert expr is not None and safe_eval_arith(expr) == 23
    assert sorted(countdown_numbers_used(expr)) == [30, 93, 100]
    assert solve_countdown([1, 1, 1], 100) is None
    assert solve_countdown("4,6,24", "1") is not None  # 24/(4*6)


# ---- gsm8k ------------------------------------------------------------------------------------
def test_gsm8k_gold_and_normalize():
    assert gsm8k_gold("reasoning\n#### 1,234") == "1234"
    assert gsm8k_gold("a #### 1 #### -10 ") == "-10"
    assert gsm8k_gold("72") == "72"
    cases = {
        "1,234": "1234",
        "$1,234.00": "1234",
        "72.0": "72",
        "-5": "-5",
        "-0.50": "-0.5",
        ".5": "0.5",
        "007": "7",
        "-0": "0",
        "\\$18": "18",
        "18.": "18",
        "+3": "3",
    }
    for raw, want in cases.items():
        assert normalize_number(raw) == want, raw
    for bad in ["abc", "٣", "1/2", "", "-", ".", "1e3", "1 2", None, "9" * 1000]:
        assert normalize_number(bad) is None, bad


def test_gsm8k_prediction():
    assert extract_gsm8k_prediction("<answer>\\boxed{1,234}</answer>") == "1,234"
    assert extract_gsm8k_prediction("<answer>\\boxed{18 \\text{ dollars}}</answer>") == "18"
    assert extract_gsm8k_prediction("so 3 + 4 = 7.") is None  # no answer tag, no box: no answer
    assert extract_gsm8k_prediction("so 3 + 4 = \\boxed{7}.") == "7"  # a box instead of the tags
    assert extract_gsm8k_prediction("<answer>She pays $1,234.50 in total</answer>") == "1,234.50"
    assert extract_gsm8k_prediction("<answer>no number</answer>") is None


@pytest.mark.parametrize(
    ("completion", "numeric", "strict"),
    [
        ("<answer>1234</answer>", 2.0, 2.0),
        ("<answer>$1,234.00</answer>", 2.0, 0.0),
        ("<answer>\\boxed{1234}</answer>", 2.0, 0.0),
        ("<answer>The total is 1,234 dollars.</answer>", 2.0, 0.0),
        ("so the answer is 1234", 0.0, 0.0),  # no tag, no box: the reasoning's last number is no answer
        ("so the answer is \\boxed{1234}", 2.0, 0.0),  # a box instead of the tags
        ("<answer>1235</answer>", 0.0, 0.0),
        ("<answer>1234</answer> then <answer>5</answer>", 0.0, 0.0),  # the last block counts
        ("<answer>١٢٣٤</answer>", 0.0, 0.0),  # unicode digits are not normalised
        ("", 0.0, 0.0),
    ],
)
def test_gsm8k_correctness_hand_cases(completion, numeric, strict):
    for gold in ("#### 1,234", "1234"):
        assert _one(gsm8k_correctness_reward, completion, answer=gold) == [numeric]
        assert _one(gsm8k_correctness_reward, completion, answer=gold, strict_string=True) == [
            strict
        ]
        assert _one(gsm8k_string_correctness_reward, completion, answer=gold) == [strict]


def test_gsm8k_strict_string_parity():
    assert _one(gsm8k_correctness_reward, "<answer>72.0</answer>", answer="#### 72") == [2.0]
    assert _one(
        gsm8k_correctness_reward, "<answer>72.0</answer>", answer="#### 72", strict_string=True
    ) == [0.0]
    assert _one(
        gsm8k_correctness_reward, "<answer> 72 </answer>", answer="#### 72", strict_string=True
    ) == [2.0]


def test_gsm8k_format_terms():
    assert _one(xml_count_reward, PERFECT) == [0.5]
    assert _one(xml_count_reward, PERFECT + "abc") == [pytest.approx(0.497)]
    assert _one(xml_count_reward, PERFECT + "\n\n") == [0.5]  # trailing whitespace is free
    assert _one(xml_count_reward, PERFECT + "x" * 10_000) == [0.0]  # floored at 0
    assert _one(xml_count_reward, PERFECT + PERFECT) == [0.0]  # every tag twice
    assert _one(xml_count_reward, "<reasoning>\n") == [0.125]
    assert _one(strict_format_reward, PERFECT) == [0.5]
    assert _one(soft_format_reward, PERFECT) == [0.5]
    loose = "<reasoning>think</reasoning>  <answer>72</answer> trailing"
    assert _one(strict_format_reward, loose) == [0.0]
    assert _one(soft_format_reward, loose) == [0.5]
    assert _one(soft_format_reward, " " + loose) == [0.0]  # re.match anchors at the start
    assert _one(soft_format_reward, "<answer>72</answer>") == [0.0]
    assert _one(int_reward, "<answer>72</answer>") == [0.5]
    assert _one(int_reward, PERFECT) == [0.5]
    for not_int in [
        "<answer>72.5</answer>",
        "<answer>-5</answer>",
        "<answer>٣</answer>",
        "<answer>²</answer>",
        "",
    ]:
        assert _one(int_reward, not_int) == [0.0], not_int


def test_gsm8k_composites():
    total = sum(w * _one(fn, PERFECT, answer="#### 72")[0] for _, fn, w in GSM8K_D1_REWARDS)
    assert total == pytest.approx(4.0)
    assert [name for name, _, _ in GSM8K_PLAIN_REWARDS] == ["correct"]


_FRAGMENTS = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "x", "\n\n"]


_FORMAT_EDGES = [
    PERFECT,
    PERFECT + "\n",  # `$` also matches before one final newline
    PERFECT + "\n\n",
    "<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>\n",  # both bodies empty
    "<reasoning>\n</reasoning>\n<answer>\nx\n</answer>\n",  # head and middle share no newline
    "<reasoning>\nx\n</reasoning>\n<answer>\n</answer>\n",  # middle and tail share no newline
    "<reasoning>\na\n</reasoning>\n<answer>\nb\n</reasoning>\n<answer>\nc\n</answer>\n",
    "<reasoning>a</reasoning>x</reasoning>\n <answer>b</answer>",
    "<reasoning></reasoning><answer></answer>",
    "<reasoning></reasoning><answer>",
]


@pytest.mark.parametrize("text", _FORMAT_EDGES)
def test_format_edge_cases_agree_with_d1_regexes(text):
    assert gsm8k_mod.strict_format_ok(text) == bool(D1_STRICT.match(text))
    assert gsm8k_mod.soft_format_ok(text) == bool(D1_SOFT.match(text))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join))
def test_format_checks_agree_with_d1_regexes(text):
    assert gsm8k_mod.strict_format_ok(text) == bool(D1_STRICT.match(text))
    assert gsm8k_mod.soft_format_ok(text) == bool(D1_SOFT.match(text))


# ---- math500 ----------------------------------------------------------------------------------
def test_last_boxed():
    assert last_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\boxed{x}}") == "x"  # innermost of the last box (documented)
    assert last_boxed("\\boxed{a} then \\boxed{b}") == "b"
    assert last_boxed("\\boxed{a} then \\boxed{b") is None  # truncated last box
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"  # escaped braces do not count
    assert (
        last_boxed("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}")
        == "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
    )
    assert last_boxed("no box") is None
    assert last_boxed(None) is None


@needs_math_verify
def test_math_equal():
    assert math_equal("\\frac{1}{2}", "\\frac12")
    assert math_equal("0.5", "\\frac12")  # math-verify compares numerically
    assert math_equal("\\dfrac{1}{2}", "\\frac{1}{2}")
    assert math_equal("5.0", "5")
    assert not math_equal("\\frac{1}{3}", "\\frac12")
    assert not math_equal("", "")
    assert not math_equal("1" * 3000, "1" * 3000)  # over the length bound


@needs_math_verify
def test_math_rewards_hand_cases():
    right = "<answer>\\boxed{\\frac{1}{2}}</answer>"
    for gold in ("\\frac12", "0.5", "\\boxed{\\frac{1}{2}}"):
        assert _one(math_correctness_reward, right, answer=gold) == [2.0], gold
    assert _one(
        math_correctness_reward, "<answer>\\boxed{\\frac{1}{3}}</answer>", answer="\\frac12"
    ) == [0.0]
    # without a box the whole answer text is the prediction
    no_box = "<answer>The answer is $0.5$</answer>"
    assert _one(math_correctness_reward, no_box, answer="\\frac12") == [2.0]
    nested = "<answer>\\boxed{\\boxed{3}}</answer>"
    assert _one(math_correctness_reward, nested, answer="3") == [2.0]
    assert _one(math_format_reward, right) == [0.5]
    assert _one(math_format_reward, "\\boxed{1}") == [0.0]
    assert _one(math_format_reward, "<answer>1</answer>") == [0.0]
    total = sum(w * _one(fn, right, answer="\\frac12")[0] for _, fn, w in MATH_REWARDS)
    assert total == 2.5


@needs_math_verify
def test_math_equal_deadline_restores_signal_state():
    before = signal.getsignal(signal.SIGALRM)
    t = time.perf_counter()
    assert not math_equal("9^{9^{9}}", "3", timeout_s=0.05)
    assert time.perf_counter() - t < 5.0  # the deadline fired (evaluating 9^9^9 would not end)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before
    assert gc.isenabled()
    from sympy.core.parameters import global_parameters

    assert global_parameters.evaluate and global_parameters.distribute
    assert math_equal("\\frac{4}{8}", "0.5")  # still works afterwards


@needs_math_verify
def test_math_equal_off_main_thread_falls_back_to_strings():
    out = {}

    def work():
        out["numeric"] = math_equal("0.5", "\\frac12")
        out["string"] = math_equal("\\dfrac{1}{2}", "\\frac{1}{2}")

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert out == {"numeric": False, "string": True}


def test_math_equal_without_math_verify(monkeypatch):
    monkeypatch.setitem(math_mod._state, "mv", None)
    assert not math_equal("0.5", "\\frac12")
    assert math_equal(" \\frac{1}{2} ", "\\frac{1}{2}")


# ---- every reward function: any string, hostile inputs, time bound ----------------------------
# (name, fn, fields, allowed values or (lo, hi))
REWARDS = [
    ("countdown", countdown_reward, {"numbers": [30, 100, 93], "target": 23}, {0.0, 0.1, 1.0}),
    ("gsm8k_correct", gsm8k_correctness_reward, {"answer": "#### 72"}, {0.0, 2.0}),
    ("gsm8k_string", gsm8k_string_correctness_reward, {"answer": "#### 72"}, {0.0, 2.0}),
    ("xml_count", xml_count_reward, {}, (0.0, 0.5)),
    ("soft_format", soft_format_reward, {}, {0.0, 0.5}),
    ("strict_format", strict_format_reward, {}, {0.0, 0.5}),
    ("int", int_reward, {}, {0.0, 0.5}),
    # a short deadline: these cases test that the bound holds, not which answers are right
    ("math_correct", functools.partial(math_correctness_reward, timeout_s=0.5), {"answer": "3"}, {0.0, 2.0}),
    ("math_format", math_format_reward, {}, {0.0, 0.5}),
]
IDS = [r[0] for r in REWARDS]

_BASE_HOSTILE = [
    "9**9**9",
    "(" * 10**5,
    "1/0",
    "x" * 10**6,
    "٣",
    "\\boxed{\\boxed{3}}",
    "\\boxed{9^{9^{9}}}",
    "\\boxed{10^{10^{10}} - 10^{10^{10}} + 3}",
    "\\boxed{" + "+".join(f"x^{{{i}}}" for i in range(300)) + "}",
    "\\boxed{2^{100000000}}",
    "\\boxed{(10^{8})!}",
    "\\boxed{\\tan(10^{10^{5}})}",
    "\\boxed{e^{e^{e^{e^{10}}}}}",
    "\\boxed{\\sqrt{" + "9" * 1990 + "}}",
    "\\boxed{\\int_0^1 e^{x^2} dx}",
    "\\boxed{" * 10**5,
    "{" * 10**5 + "}" * 10**5,
    "<answer>" * 10**5,
    "<reasoning>\n" * 10**5,
    "\\" * 10**5,
    "1," * 10**5,
    "9" * 10**5,
    "-" * 10**5 + "1",
    "\\frac{1}{0}",
    "nan",
    "\x00\ud800",
]
HOSTILE = (
    _BASE_HOSTILE
    + [f"<answer>{h}</answer>" for h in _BASE_HOSTILE]
    + [
        None,
        123,
        b"<answer>3</answer>",
        ["<answer>3</answer>"],
        {"content": "<answer>3</answer>"},
    ]
)


def _check(fn, fields, allowed, completion):
    t = time.perf_counter()
    out = _one(fn, completion, **fields)
    elapsed = time.perf_counter() - t
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], float)
    if isinstance(allowed, set):
        assert out[0] in allowed
    else:
        assert allowed[0] <= out[0] <= allowed[1]
    assert elapsed < TIME_BOUND_S, f"{elapsed:.3f}s on {str(completion)[:60]!r}"
    return out[0]


@pytest.mark.parametrize(("name", "fn", "fields", "allowed"), REWARDS, ids=IDS)
@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_inputs(name, fn, fields, allowed, completion):
    _check(fn, fields, allowed, completion)


@pytest.mark.parametrize(("name", "fn", "fields", "allowed"), REWARDS, ids=IDS)
def test_hostile_gold_fields(name, fn, fields, allowed):
    for bad in [None, "", "9" * 10**5, "(" * 10**5, "\\boxed{" * 10**4, 3.5, ["x"], "٣"]:
        bad_fields = {k: bad for k in fields}
        _check(fn, bad_fields, allowed, "<answer>\\boxed{3}</answer>")


def test_conversational_completions():
    msg = [{"role": "assistant", "content": "<answer>72</answer>"}]
    assert _one(gsm8k_correctness_reward, msg, answer="#### 72") == [2.0]
    assert _one(
        countdown_reward, [{"content": "<answer>30+93-100</answer>"}], numbers=NUMS, target=23
    ) == [1.0]


_taggy = st.lists(
    st.one_of(
        st.sampled_from(_FRAGMENTS + ["\\boxed{", "}", "{", "=", "23", "72", "3", "+", "**"]),
        st.text(max_size=4),
    ),
    max_size=30,
).map("".join)


@pytest.mark.parametrize(("name", "fn", "fields", "allowed"), REWARDS, ids=IDS)
@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.text(), _taggy))
def test_any_text(name, fn, fields, allowed, text):
    _check(fn, fields, allowed, text)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(),
    gold=st.text(max_size=50),
    nums=st.one_of(st.text(max_size=20), st.lists(st.integers())),
)
def test_any_gold(text, gold, nums):
    assert countdown_reward([""], [text], numbers=[nums], target=[gold])[0] in {0.0, 0.1, 1.0}
    assert gsm8k_correctness_reward([""], [text], answer=[gold])[0] in {0.0, 2.0}
    assert math_correctness_reward([""], [text], answer=[gold])[0] in {0.0, 2.0}


# ---- every row of the benchmark files (tests/fixtures) ----------------------------------------------
def _rows(name: str) -> list[dict]:
    with (FIXTURES / name).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def test_gsm8k_gold_scores_full_and_perturbed_zero():
    rows = _rows("gsm8k/gsm8k_test.jsonl")
    assert len(rows) == 1319
    for row in rows:
        gold = gsm8k_gold(row["answer"])
        right = f"<reasoning>\nwork\n</reasoning>\n<answer>\n{gold}\n</answer>\n"
        dollars = f"<answer>The answer is ${Decimal(gold):,}.00</answer>"
        wrong = f"<answer>\n{Decimal(gold) + 1}\n</answer>"
        answers = [row["answer"]] * 3
        assert gsm8k_correctness_reward([""] * 3, [right, dollars, wrong], answer=answers) == [
            2.0,
            2.0,
            0.0,
        ]
        assert gsm8k_string_correctness_reward(
            [""] * 3, [right, dollars, wrong], answer=answers
        ) == [2.0, 0.0, 0.0]
        expected_int = 0.5 if gold.isdigit() else 0.0
        total = sum(
            w * fn([""], [right], answer=[row["answer"]])[0] for _, fn, w in GSM8K_D1_REWARDS
        )
        assert total == pytest.approx(3.5 + expected_int), gold


@needs_math_verify
def test_math500_gold_scores_full_and_perturbed_zero():
    rows = _rows("math500/math500_test.jsonl")
    assert len(rows) == 500
    integer_rows = 0
    for row in rows:
        gold = row["answer"]
        right = f"<answer>\\boxed{{{gold}}}</answer>"
        wrong_text = str(int(gold) + 1) if re.fullmatch(r"-?[0-9]+", gold) else f"{gold}+1"
        wrong = f"<answer>\\boxed{{{wrong_text}}}</answer>"
        assert math_correctness_reward([""] * 2, [right, wrong], answer=[gold] * 2) == [2.0, 0.0], (
            gold
        )
        assert math_format_reward([""], [right]) == [0.5]
        if re.fullmatch(r"-?[0-9]+", gold):  # a positive that must go through math-verify
            integer_rows += 1
            assert _one(
                math_correctness_reward, f"<answer>\\boxed{{{gold}.0}}</answer>", answer=gold
            ) == [2.0]
    assert integer_rows > 250


def test_countdown_every_row_solvable_and_scored():
    rows = _rows("countdown/countdown_cd3_test.jsonl")
    assert len(rows) == 256
    for row in rows:
        numbers = [int(x) for x in row["input"].split(",")]
        target = int(row["output"])
        expr = solve_countdown(numbers, target)
        assert expr is not None, row
        comps = [f"<answer>{expr}</answer>", f"<answer>{expr} = {target}</answer>"]
        assert countdown_reward(
            [""] * 2, comps, numbers=[numbers, row["input"]], target=[target, row["output"]]
        ) == [1.0, 1.0]
        assert countdown_reward([""], comps[:1], numbers=[row["input"]], target=[target + 1]) == [
            0.1
        ]
