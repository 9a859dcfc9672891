"""MATH500's reward (rewards/math500.py) piece by piece: the box reader and the normaliser on hand
cases, the deadline around math-verify (signals, GC, sympy's flags) on functions that overrun it, the
import and warm-up of math-verify through a stand-in module that records its calls, and the reward's
routing of predictions between the quick verdict and the pool.

The stand-in (``FakeMathVerify``) parses ``$x$`` into ``("parsed", x)`` and verifies two parses as
equal when their texts are: what the module does with math-verify, not what math-verify decides
(tests/unit/rewards/test_rewards.py runs the real one).

Run: pytest tests/unit/rewards/test_math500.py -q
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
import types

import pytest

from diffusion_rl.rewards import math500, verify_pool
from diffusion_rl.rewards.math500 import (
    MAX_MATH_CHARS,
    _gold_answer,
    _quick_verdict,
    _signals_usable,
    _verify_pairs,
    last_boxed,
    math_correctness_reward,
    math_equal,
    math_format_reward,
    math_format_score,
    math_prediction,
    normalise_answer,
    parse_gold_cached,
    verify_parsed,
)


# ---- the box, the prediction, the gold -------------------------------------------------------------
def test_last_boxed_reads_escaped_braces_as_text():
    assert last_boxed("\\boxed{a \\} b}") == "a \\} b"  # "\}" does not close the box
    assert last_boxed("\\boxed{\\}}") == "\\}"  # the escape is the backslash and one character
    assert last_boxed("\\boxed{x}") == "x"  # a box at the very start of the text


def test_last_boxed_scans_at_most_max_boxed_chars_after_the_box():
    body = "1" * (math500.MAX_BOXED_CHARS - 1)
    assert last_boxed("\\boxed{" + body + "}") == body  # its "}" is the last character scanned
    assert last_boxed("\\boxed{" + body + "1}") is None  # one character more: not found


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (" \\left( 1, 2 \\right) ", "(1,2)"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("$5$.", "5"),  # a final full stop is dropped
        ("XX.", "XX"),  # only full stops: a Roman numeral keeps its X
        ("5..", "5"),
        (".5", ".5"),  # a leading one is kept
        ("\\!1\\,000\\;0\\:0", "100000"),
        ("\\displaystyle\n\t1", "1"),
    ],
)
def test_normalise_answer(raw, normal):
    assert normalise_answer(raw) == normal


def test_normalise_answer_of_a_non_string_is_empty():
    assert normalise_answer(None) == "" and normalise_answer(3) == ""  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gold", "text"),
    [
        ("\\boxed{3}", "3"),  # a solution's box
        ("so \\boxed{a} then \\boxed{\\frac{1}{2}} ", "\\frac{1}{2}"),  # its last box
        (" 3 ", "3"),  # no box: the gold itself, stripped
        ("\\boxed{3", "\\boxed{3"),  # an unclosed box: the text as it is
        (3, "3"),
        (2.5, "2.5"),
        (True, ""),  # a bool is not a number here
        (None, ""),
        (["3"], ""),
    ],
)
def test_gold_answer(gold, text):
    assert _gold_answer(gold) == text


@pytest.mark.parametrize(
    ("completion", "prediction"),
    [
        ("<answer>\\boxed{5}</answer>", "5"),  # the block's last box
        ("<answer>\\boxed{1} and \\boxed{5}</answer>", "5"),
        ("<answer> 5 </answer>", "5"),  # no box in the block: its text
        ("<answer>\\boxed{5</answer>", "\\boxed{5"),  # an unclosed box: the block's text
        ("<answer>\\boxed{}</answer>", "\\boxed{}"),  # an empty box: the block's text
        ("\\boxed{5} <answer></answer>", "5"),  # an empty block: a box anywhere
        ("so \\boxed{5}", "5"),  # no tag: a box anywhere
        ("so the answer is 5", ""),  # neither: no prediction
        ([{"role": "assistant", "content": "<answer>5</answer>"}], "5"),
        (None, ""),
    ],
)
def test_math_prediction(completion, prediction):
    assert math_prediction(completion) == prediction


# ---- the quick verdict -------------------------------------------------------------------------------
def test_quick_verdict_decides_what_needs_no_parsing():
    assert _quick_verdict("\\dfrac{1}{2}", " \\frac{1}{2}.") is True  # normalised strings equal
    assert _quick_verdict("0.5", "\\frac{1}{2}") is None  # undecided: math-verify's
    assert _quick_verdict("", "1") is False and _quick_verdict("1", "$ $") is False  # nothing to compare
    assert _quick_verdict(None, "1") is False and _quick_verdict("1", None) is False
    assert _quick_verdict(1, 1) is False  # type: ignore[arg-type]


def test_quick_verdict_parses_up_to_max_math_chars():
    at, over = "1" * MAX_MATH_CHARS, "1" * (MAX_MATH_CHARS + 1)
    assert _quick_verdict(at, at) is True  # at the bound: compared
    assert _quick_verdict(over, "1") is False and _quick_verdict("1", over) is False  # over it, either side
    assert _quick_verdict(over, over) is False


# ---- the deadline ------------------------------------------------------------------------------------
def _busy(seconds: float, swallow: int = 0):
    """A function that computes for ``seconds`` (pure Python, so a signal can stop it), swallowing the
    first ``swallow`` deadlines raised into it (as a library's broad ``except BaseException`` would)."""

    def run():
        end, left = time.monotonic() + seconds, swallow
        while True:
            try:
                while time.monotonic() < end:
                    pass
                return "done"
            except math500._Deadline:
                if left == 0:
                    raise
                left -= 1

    return run


@pytest.fixture
def own_alarm_handler():
    """A SIGALRM handler of the caller's own, which the deadline must give back."""

    def handler(signum, frame):  # pragma: no cover - never fires
        raise AssertionError("the caller's handler fired")

    before = signal.signal(signal.SIGALRM, handler)
    yield handler
    signal.signal(signal.SIGALRM, before)


def _untouched(handler) -> None:
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no timer left behind
    assert signal.getsignal(signal.SIGALRM) is handler  # the caller's handler back
    assert gc.isenabled()
    math500._on_alarm(signal.SIGALRM, None)  # disarmed: a stray alarm raises nothing


def test_deadline_returns_what_fn_returns_and_leaves_no_trace(own_alarm_handler):
    seen = {}

    def fn():
        seen["gc"] = gc.isenabled()
        _busy(0.05)()  # longer than a re-fire interval, well within the deadline
        return 42

    assert math500._run_with_deadline(fn, 2.0) == 42
    assert seen == {"gc": False}  # the cyclic GC is paused while fn runs
    _untouched(own_alarm_handler)


def test_deadline_stops_fn_and_refires_when_swallowed(own_alarm_handler):
    t = time.monotonic()
    with pytest.raises(math500._Deadline):
        math500._run_with_deadline(_busy(3.0), 0.05)
    with pytest.raises(math500._Deadline):  # a swallowed alarm fires again until fn gives up
        math500._run_with_deadline(_busy(3.0, swallow=3), 0.05)
    assert time.monotonic() - t < 2.0  # neither ran its 3 s
    _untouched(own_alarm_handler)


def test_deadline_keeps_the_gc_off_when_it_was_off(own_alarm_handler):
    gc.disable()
    try:
        math500._run_with_deadline(lambda: None, 1.0)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_signals_are_usable_in_the_main_thread_without_a_timer():
    assert _signals_usable()
    out = []
    th = threading.Thread(target=lambda: out.append(_signals_usable()))
    th.start()
    th.join()
    assert out == [False]  # signals only reach the main thread
    before = signal.signal(signal.SIGALRM, lambda s, f: None)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert not _signals_usable()  # someone else's timer is running
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


# ---- math-verify through a stand-in ------------------------------------------------------------------
class FakeMathVerify(types.ModuleType):
    """``math_verify`` as far as math500.py uses it, recording every call. ``verdict`` None compares
    the parsed texts; ``parse_fails_on`` makes parsing a text holding it raise, ``verify_fails`` every
    verification; ``on_parse`` runs before each parse; ``*_time`` computes that long first."""

    def __init__(self):
        super().__init__("math_verify")
        self.parses: list[tuple[str, dict]] = []
        self.verifies: list[tuple[tuple, tuple, dict]] = []
        self.timer_left: list[float] = []  # the ITIMER_REAL time left at each verification
        self.parse_time = self.verify_time = 0.0
        self.parse_fails_on: str | None = None
        self.verify_fails = False
        self.verdict: bool | None = None
        self.on_parse = lambda: None

    def parse(self, s, **kw):
        self.parses.append((s, kw))
        self.on_parse()
        if self.parse_fails_on is not None and self.parse_fails_on in s:
            raise ValueError("unparsable")
        _busy(self.parse_time)()
        return ("parsed", s)

    def verify(self, gold, pred, **kw):
        self.verifies.append((gold, pred, kw))
        self.timer_left.append(signal.getitimer(signal.ITIMER_REAL)[0])
        if self.verify_fails:
            raise ValueError("cannot compare")
        _busy(self.verify_time)()
        if self.verdict is not None:
            return self.verdict
        return gold is not None and pred is not None and gold[1] == pred[1]


@pytest.fixture
def fake_mv(monkeypatch):
    """A fresh process's state with the stand-in installed as math_verify (imported on first use)."""
    fake = FakeMathVerify()
    monkeypatch.setitem(sys.modules, "math_verify", fake)
    monkeypatch.setattr(math500, "_state", {})
    for name in ("math_verify.parser", "math_verify.grader"):
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    math500._parse_gold.cache_clear()
    yield fake
    math500._parse_gold.cache_clear()


def _timeout_record(logger: str) -> logging.LogRecord:
    # the words math-verify logs when its own timeouts are off (math_verify/parser.py, grader.py)
    msg = "Timeout is disabled as parsing_timeout is None or <= 0, you must provide your own timeout"
    return logging.LogRecord(logger, logging.WARNING, __file__, 1, msg, None, None)


def test_math_verify_is_loaded_once_warmed_up_outside_any_deadline(fake_mv):
    from sympy.core.parameters import global_parameters

    assert math500._math_verify() == (fake_mv.parse, fake_mv.verify)
    # the warm-up: a gold parsed, then each shape parsed and verified against it, math-verify's own
    # timeouts off (parsing_timeout=None, timeout_seconds=None): the deadline is ours
    shapes = [f"${p}$" for p in math500._WARMUP_PREDICTIONS]
    assert [s for s, _ in fake_mv.parses][1:] == shapes
    assert all(kw == {"parsing_timeout": None} for _, kw in fake_mv.parses)
    gold = ("parsed", fake_mv.parses[0][0])
    assert fake_mv.verifies == [(gold, ("parsed", s), {"timeout_seconds": None}) for s in shapes]
    assert math500._state["sympy_globals"] == dict(vars(global_parameters))
    # math-verify's warning that its timeouts are off is dropped, and only that one
    for name in ("math_verify.parser", "math_verify.grader"):
        assert not logging.getLogger(name).filter(_timeout_record(name))
        other = logging.LogRecord(name, logging.WARNING, __file__, 1, "something else", None, None)
        assert logging.getLogger(name).filter(other)
    n = len(fake_mv.parses)
    assert math500._math_verify() == (fake_mv.parse, fake_mv.verify)  # the second call loads nothing
    assert len(fake_mv.parses) == n


def test_without_math_verify_answers_are_strings(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails
    monkeypatch.setattr(math500, "_state", {})
    with caplog.at_level(logging.WARNING, logger=math500.__name__):
        assert math500._math_verify() is None
        assert not math_equal("0.5", "\\frac12")
        assert math_equal(" \\dfrac{1}{2} ", "\\frac{1}{2}")
        assert not verify_parsed("0.5", "\\frac12", 1.0)
        assert parse_gold_cached("\\frac12", 1.0)  # nothing to parse
    assert len([r for r in caplog.records if r.name == math500.__name__]) == 1  # warned once


def test_warn_once_logs_each_key_once(monkeypatch, caplog):
    monkeypatch.setattr(math500, "_state", {})  # a fresh process: nothing warned yet
    with caplog.at_level(logging.WARNING, logger=math500.__name__):
        for key in ("a", "b", "a", "b", "a"):
            math500._warn_once(key, f"about {key}")
    assert [r.getMessage() for r in caplog.records if r.name == math500.__name__] == ["about a", "about b"]


def test_restore_sympy_globals_undoes_a_flip(fake_mv, monkeypatch):
    from sympy.core.parameters import global_parameters

    math500._math_verify()
    monkeypatch.setattr(global_parameters, "evaluate", False)  # an interrupted `with evaluate(False):`
    monkeypatch.setattr(global_parameters, "distribute", False)
    math500._restore_sympy_globals()
    assert global_parameters.evaluate is True and global_parameters.distribute is True


def test_parse_gold_cached_parses_within_the_deadline(fake_mv):
    math500._math_verify()
    n = len(fake_mv.parses)
    assert parse_gold_cached("\\frac{7}{9}", 1.0)
    assert fake_mv.parses[n:] == [("$\\frac{7}{9}$", {"parsing_timeout": None})]
    assert parse_gold_cached("\\frac{7}{9}", 1.0) and len(fake_mv.parses) == n + 1  # cached
    at, over = "2" * MAX_MATH_CHARS, "3" * (MAX_MATH_CHARS + 1)
    assert parse_gold_cached(at, 1.0) and fake_mv.parses[-1][0] == f"${at}$"  # at the bound: parsed
    assert parse_gold_cached(over, 1.0) and fake_mv.parses[-1][0] == f"${at}$"  # over it: not parsed
    fake_mv.parse_fails_on = "\\sqrt"
    assert parse_gold_cached("\\sqrt{", 1.0)  # an unparsable gold: predictions will not match it


def test_parse_gold_cached_is_false_on_a_deadline_and_restores_sympy(fake_mv):
    from sympy.core.parameters import global_parameters

    math500._math_verify()
    fake_mv.parse_time = 3.0
    fake_mv.on_parse = lambda: setattr(global_parameters, "evaluate", False)  # left flipped by the interrupt
    try:
        t = time.monotonic()
        assert not parse_gold_cached("\\frac{1}{9}", 0.05)
        assert time.monotonic() - t < 2.0
        assert global_parameters.evaluate is True
    finally:
        global_parameters.evaluate = True


def test_verify_parsed(fake_mv):
    math500._math_verify()
    n = len(fake_mv.verifies)
    assert verify_parsed("\\frac{1}{2}", "\\frac{1}{2}", 0.4)
    assert fake_mv.verifies[n:] == [(("parsed", "$\\frac{1}{2}$"), ("parsed", "$\\frac{1}{2}$"),
                                     {"timeout_seconds": None})]
    assert 0.0 < fake_mv.timer_left[-1] <= 0.4  # under our deadline of timeout_s
    assert not verify_parsed("\\frac{1}{3}", "\\frac{1}{2}", 0.4)
    fake_mv.verify_fails = True
    assert not verify_parsed("\\frac{1}{2}", "\\frac{1}{2}", 0.4)  # an error is not "equal"
    fake_mv.verify_fails, fake_mv.verify_time = False, 3.0
    t = time.monotonic()
    assert not verify_parsed("\\frac{1}{2}", "\\frac{1}{2}", 0.05)  # a deadline is not "equal"
    assert time.monotonic() - t < 2.0


def test_math_equal_checks_undecided_pairs_with_math_verify_under_a_1s_deadline(fake_mv):
    math500._math_verify()
    n = len(fake_mv.verifies)
    assert math_equal("\\frac{1}{2}", "\\dfrac{1}{2}")  # quick: equal strings, nothing parsed
    assert not math_equal("", "")  # quick: nothing to compare
    assert len(fake_mv.verifies) == n
    assert math_equal("\\frac{2}{4}", "\\frac{2}{4} ") and len(fake_mv.verifies) == n
    assert not math_equal("0.5", "\\frac{1}{2}")  # the stand-in compares texts
    assert fake_mv.verifies[n:] == [(("parsed", "$\\frac{1}{2}$"), ("parsed", "$0.5$"), {"timeout_seconds": None})]
    assert 0.5 < fake_mv.timer_left[-1] <= 1.0  # the default deadline: 1 s
    fake_mv.verdict = True
    assert math_equal("0.5", "\\frac{1}{2}", timeout_s=0.3)
    assert 0.0 < fake_mv.timer_left[-1] <= 0.3


def test_math_equal_off_the_main_thread_is_string_equality(fake_mv):
    math500._math_verify()
    fake_mv.verdict = True  # math-verify would say equal, but cannot be given a deadline there
    out = []

    def work():
        out.append(math_equal("0.5", "\\frac12"))
        out.append(math_equal("\\dfrac{1}{2}", "\\frac{1}{2}"))

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert out == [False, True]


# ---- the reward: quick verdicts here, the rest to the pool -------------------------------------------
@pytest.fixture
def pairs_sent(monkeypatch):
    """``_verify_pairs`` replaced: records each call and answers True for pairs whose texts differ
    only by "=": a stand-in pool."""
    calls = []

    def fake(pairs, timeout_s, workers):
        calls.append((list(pairs), timeout_s, workers))
        return [p.replace("=", "") == g for p, g in pairs]

    monkeypatch.setattr(math500, "_verify_pairs", fake)
    return calls


def test_reward_sends_only_undecided_pairs_to_the_pool(pairs_sent):
    comps = ["<answer>\\boxed{=7}</answer>", "<answer>\\boxed{5}</answer>", "no answer", "\\boxed{=8}",
             "<answer>\\boxed{9}</answer>"]
    golds = ["7", "\\boxed{5}", "3", "9", "1"]
    assert math_correctness_reward([""] * 5, comps, answer=golds) == [2.0, 2.0, 0.0, 0.0, 0.0]
    assert pairs_sent == [([("=7", "7"), ("=8", "9"), ("9", "1")], verify_pool.DEFAULT_TIMEOUT_S, 0)]
    pairs_sent.clear()
    assert math_correctness_reward([""], ["\\boxed{=1}"], answer=[1], timeout_s=3.0, workers=2) == [2.0]
    assert pairs_sent == [([("=1", "1")], 3.0, 2)]


def test_reward_without_undecided_pairs_calls_no_pool(pairs_sent):
    assert math_correctness_reward([""] * 2, ["<answer>5</answer>", ""], answer=["5", "5"]) == [2.0, 0.0]
    assert math_correctness_reward([""], None, answer=["5"]) == []  # type: ignore[arg-type]
    assert math_correctness_reward([""], ["<answer>5</answer>"], answer=None) == [0.0]  # no gold
    assert pairs_sent == []


def test_reward_scores_a_failing_completion_zero_in_its_place(pairs_sent, monkeypatch):
    real = math500.math_prediction

    def failing(completion):
        if completion == "boom":
            raise RuntimeError("a reader's bug")
        return real(completion)

    monkeypatch.setattr(math500, "math_prediction", failing)
    comps = ["\\boxed{=2}", "boom", "\\boxed{=3}"]
    assert math_correctness_reward([""] * 3, comps, answer=["2", "2", "3"]) == [2.0, 0.0, 2.0]
    assert pairs_sent[0][0] == [("=2", "2"), ("=3", "3")]


@pytest.fixture
def fake_pool(monkeypatch):
    calls = []

    class Pool:
        def verify(self, pairs, timeout_s):
            calls.append(("verify", list(pairs), timeout_s))
            return [p == g for p, g in pairs]

    def get_pool(workers=0):
        calls.append(("get_pool", workers))
        return Pool()

    monkeypatch.setattr(verify_pool, "get_pool", get_pool)
    return calls


def test_verify_pairs_asks_the_pool(fake_pool):
    assert _verify_pairs([("1", "1"), ("1", "2")], 4.0, 3) == [True, False]
    assert fake_pool == [("get_pool", 3), ("verify", [("1", "1"), ("1", "2")], 4.0)]


def test_verify_pairs_scores_zero_without_math_verify_or_a_pool(fake_pool, monkeypatch):
    def broken(workers=0):
        raise OSError("cannot spawn")

    monkeypatch.setattr(verify_pool, "get_pool", broken)
    assert _verify_pairs([("1", "1"), ("2", "2")], 4.0, 0) == [False, False]
    monkeypatch.setattr(math500.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(verify_pool, "get_pool", lambda workers=0: pytest.fail("no pool without math-verify"))
    assert _verify_pairs([("1", "1"), ("2", "2")], 4.0, 0) == [False, False]


# ---- the format term ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<answer>\\boxed{1}</answer>", 0.5),
        ("<answer>so \\boxed{1}", 0.5),  # an unclosed block runs to the end
        ("<answer>\\boxed{1}</answer> <answer>1</answer>", 0.0),  # the last block has no box
        ("\\boxed{1}", 0.0),  # no tag
        ("<answer>1</answer>", 0.0),
        ([{"content": "<answer>\\boxed{1}</answer>"}], 0.5),
        (None, 0.0),
    ],
)
def test_math_format_score(completion, score):
    assert math_format_score(completion) == score


def test_math_format_reward_is_the_score_of_each_completion():
    comps = ["<answer>\\boxed{1}</answer>", "\\boxed{1}"]
    assert math_format_reward([""] * 2, comps) == [0.5, 0.0]
    assert math_format_reward([""], None) == []  # type: ignore[arg-type]
