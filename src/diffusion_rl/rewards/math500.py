"""MATH500 rewards (docs/methods.md §5): math-verify equivalence on the last ``\\boxed{}``, plus a
format term.

* ``math_correctness_reward``: 2.0 when the prediction is equivalent to the gold ``answer``.
  The prediction is read where the prompt asks for it (``rewards/prompted.py``): the last
  ``\\boxed{...}`` of the last ``<answer>`` block, else that block's text; without an ``<answer>``
  tag (or with an empty block) the last non-empty ``\\boxed{...}`` anywhere; otherwise there is no
  prediction. (d1 compares the whole completion when it has no box, and math-verify, given a whole
  reasoning, would find a number in it.)
* ``math_format_reward``: 0.5 when an ``<answer>`` tag is present and its last block contains
  ``\\boxed{`` (d1's ``boxed_and_answer_tags_format_reward``, which scores 0.5 for the same thing).

Decisions:

* **Nested boxes**: :func:`last_boxed` returns the content of the last ``\\boxed{`` *opening*,
  i.e. the innermost box of the last group: ``\\boxed{\\boxed{x}}`` -> ``x``. An unterminated last
  box (a truncated completion) gives None rather than an earlier box.
* **Time bound**: the reward runs math-verify in a pool of worker processes (``verify_pool.py``):
  each gold parsed once per worker and cached, every parse and check bounded by ``timeout_s``
  (default 5 s, chosen by measuring every MATH-500 gold cold under load: ``benchmarks/rewards.py``),
  a worker that overruns killed and replaced, verdicts cached. A prediction whose normalised string
  equals the gold's is right without parsing. Inside a process (the workers, :func:`math_equal`),
  math-verify's own timeouts (``signal.alarm``, whole seconds) are off and the whole parse+verify
  is bounded with ``signal.setitimer``, raising a ``BaseException`` subclass so no library
  ``except Exception`` swallows it, and re-firing every 5 ms until we leave (the cyclic GC is
  paused meanwhile, so the exception never lands in a GC callback). Signals only work in the main
  thread: :func:`math_equal` elsewhere, or under another ``ITIMER_REAL``, falls back to normalised
  string equality. Inputs longer than 2000 characters are wrong without parsing.
* math-verify is imported on first use (it pulls in sympy, ~0.5 s) and warmed up outside any
  deadline on a few answer shapes that make sympy import more of itself; the first call in a
  process is therefore slow once (~2 s). If it is not installed, comparison
  is normalised string equality and a warning is logged once.
* **Unicode digits** are not normalised: ``\\boxed{٣}`` is not 3.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from diffusion_rl.rewards import verify_pool
from diffusion_rl.rewards.answer import column, completion_text, extract_answer
from diffusion_rl.rewards.prompted import answer_block

log = logging.getLogger(__name__)

CORRECT_REWARD = 2.0
FORMAT_REWARD = 0.5
MAX_MATH_CHARS = 2000  # longer predictions or golds are never parsed
MAX_BOXED_CHARS = 10_000  # brace matching stops this far after the last \boxed{ (bounded work from the tag)
_REFIRE_S = 0.005

T = TypeVar("T")


# ---- extraction -------------------------------------------------------------------------------
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (innermost when nested), braces matched; else None.

    Linear: one ``rfind`` over the whole text and a forward scan of at most ``MAX_BOXED_CHARS``
    characters from the box, wherever it is. A backslash escapes the next character, so ``\\{`` and
    ``\\}`` do not count as braces.
    """
    if not isinstance(text, str):
        return None
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    begin = start + len("\\boxed{")
    end = min(len(text), begin + MAX_BOXED_CHARS)
    depth, j = 1, begin
    while j < end:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[begin:j].strip()
        j += 1
    return None


_DROP = ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "$", " ", "\n", "\t")


def normalise_answer(s: str) -> str:
    """Cheap string normalisation used for the fast path and the fallbacks."""
    if not isinstance(s, str):
        return ""
    s = s.strip()
    for tok in _DROP:
        s = s.replace(tok, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.rstrip(".")


# ---- math-verify with a sub-second deadline ---------------------------------------------------
class _Deadline(BaseException):
    """Raised by our SIGALRM handler; a BaseException so ``except Exception`` cannot swallow it."""


_armed = False
_state: dict[str, Any] = {}  # "mv": (parse, verify) or None once loaded; "warned": set of keys


def _warn_once(key: str, msg: str) -> None:
    warned = _state.setdefault("warned", set())
    if key not in warned:
        warned.add(key)
        log.warning(msg)


def _on_alarm(signum: int, frame: Any) -> None:
    if _armed:
        raise _Deadline


def _signals_usable() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # never clobber someone's timer
    )


def _run_with_deadline(fn: Callable[[], T], seconds: float) -> T:
    """``fn()``, or raise ``_Deadline`` after ``seconds`` (main thread only).

    The cyclic GC is paused meanwhile: a signal handler runs in whatever Python code is current,
    and an exception raised inside a GC callback is swallowed as "unraisable" instead of stopping
    ``fn`` (the re-fire would still stop it, but with noise on stderr).
    """
    global _armed
    gc_was_enabled = gc.isenabled()
    gc.disable()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        _armed = True
        # The interval re-fires the alarm until we disarm, in case code under fn swallows one.
        signal.setitimer(signal.ITIMER_REAL, seconds, _REFIRE_S)
        try:
            return fn()
        finally:
            _armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if gc_was_enabled:
            gc.enable()


class _DropTimeoutDisabled(logging.Filter):
    """math-verify warns that its timeouts are off; we provide our own, so the warning misleads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


# sympy imports whole subpackages (numpy, sympy.physics, ...) the first time some paths run; an
# import cut by the deadline is left half-done, and C-level import work cannot be interrupted.
_WARMUP_PREDICTIONS = (
    "\\frac{6}{2}",
    "\\sum_{n=1}^{\\infty} \\frac{1}{n^2}",
    "\\int_0^1 e^{x^2} dx",
    "\\prod_{k=1}^{3} k",
    "x \\in [-2,7]",
    "(1, 2)",
    "\\{1, 2\\}",
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    "x = 3",
    "\\log_2 8",
    "\\sin x",
    "\\tan(10^{5})",
    "\\binom{3}{1}",
)


def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """``(parse, verify)`` from math-verify, imported and warmed up once; None if unavailable."""
    if "mv" not in _state:
        try:
            from math_verify import parse, verify

            for name in ("math_verify.parser", "math_verify.grader"):
                logging.getLogger(name).addFilter(_DropTimeoutDisabled())
            gold = _parse_latex(parse, "3")
            for pred in _WARMUP_PREDICTIONS:  # pulls in sympy's lazy imports outside any deadline
                verify(gold, _parse_latex(parse, pred), timeout_seconds=None)
            from sympy.core.parameters import global_parameters

            _state["sympy_globals"] = dict(vars(global_parameters))
            _state["mv"] = (parse, verify)
        except Exception as err:  # noqa: BLE001 - ImportError or a broken install
            _warn_once(
                "import",
                f"math-verify unavailable ({err!r}); MATH answers compared as normalised strings",
            )
            _state["mv"] = None
    return _state["mv"]


def _restore_sympy_globals() -> None:
    """An interrupt inside ``with evaluate(False):``'s exit could leave sympy's flags flipped."""
    try:
        from sympy.core.parameters import global_parameters
    except Exception:  # noqa: BLE001 - sympy missing or reorganised: nothing to restore
        return
    for name, value in _state.get("sympy_globals", {}).items():
        setattr(global_parameters, name, value)


def _parse_latex(parse: Callable[..., Any], s: str) -> Any:
    return parse(f"${s}$", parsing_timeout=None)


@functools.lru_cache(maxsize=verify_pool.GOLD_CACHE_SIZE)
def _parse_gold(gold: str) -> Any:
    mv = _math_verify()
    assert mv is not None
    return _parse_latex(mv[0], gold)  # an interrupted parse raises, so nothing partial is cached


def warm_up() -> None:
    """Import math-verify and warm sympy up now (a pool worker does this before taking work)."""
    _math_verify()


def parse_gold_cached(gold: str, timeout_s: float) -> bool:
    """Parse ``gold`` into the cache within ``timeout_s``; False if it overran (main thread only)."""
    if _math_verify() is None or len(gold) > MAX_MATH_CHARS:
        return True  # nothing to parse: predictions fall back to string equality
    try:
        _run_with_deadline(lambda: _parse_gold(gold), timeout_s)
        return True
    except _Deadline:
        _restore_sympy_globals()
        return False
    except Exception:  # noqa: BLE001 - an unparsable gold: predictions will simply not match it
        return True


def verify_parsed(pred: str, gold: str, timeout_s: float) -> bool:
    """math-verify's ``verify(parse(gold), parse(pred))`` within ``timeout_s`` (main thread only);
    any error or timeout is False. The cheap checks of :func:`math_equal` are the caller's."""
    mv = _math_verify()
    if mv is None:
        return False
    parse, verify = mv

    def check() -> bool:
        return bool(verify(_parse_gold(gold), _parse_latex(parse, pred), timeout_seconds=None))

    try:
        return _run_with_deadline(check, timeout_s)
    except _Deadline:
        _restore_sympy_globals()
        return False
    except Exception:  # noqa: BLE001 - any parser/sympy failure means "not shown equal"
        return False


def _quick_verdict(pred: Any, gold: Any) -> bool | None:
    """True / False when no parsing is needed (types, lengths, normalised strings), else None."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    if len(pred) > MAX_MATH_CHARS or len(gold) > MAX_MATH_CHARS:
        return False
    p, g = normalise_answer(pred), normalise_answer(gold)
    if not p or not g:
        return False
    return True if p == g else None


def math_equal(pred: str, gold: str, timeout_s: float = 1.0) -> bool:
    """Whether ``pred`` and ``gold`` (bare LaTeX answers) are mathematically equivalent.

    Normalised string equality first; then math-verify's ``verify(parse(gold), parse(pred))``
    under a ``timeout_s`` deadline. Any error or timeout is False; see the module docstring for
    the fallbacks (no math-verify, not the main thread).
    """
    quick = _quick_verdict(pred, gold)
    if quick is not None:
        return quick
    if _math_verify() is None:
        return False
    if not _signals_usable():
        _warn_once(
            "thread",
            "math_equal outside the main thread (or under a running ITIMER_REAL): "
            "no deadline possible, using normalised string equality",
        )
        return False
    return verify_parsed(pred, gold, timeout_s)


# ---- reward functions -------------------------------------------------------------------------


def _gold_answer(gold: Any) -> str:
    if not isinstance(gold, str):
        return str(gold) if isinstance(gold, int | float) and not isinstance(gold, bool) else ""
    boxed = last_boxed(gold) if "\\boxed{" in gold else None
    return boxed if boxed is not None else gold.strip()


def math_prediction(completion: Any) -> str:
    """The answer the prompt asks for (module docstring); "" when the completion has none."""
    text = completion_text(completion)
    block = answer_block(text)
    if block:
        return last_boxed(block) or block  # an empty or unclosed box: the block's text
    return last_boxed(text) or ""


def math_correctness_reward(
    prompts: list[str],
    completions: list[str],
    answer: list[Any],
    timeout_s: float = verify_pool.DEFAULT_TIMEOUT_S,
    workers: int = 0,
    **_: Any,
) -> list[float]:
    """2.0 when the prediction is equivalent to the gold ``answer`` (math-verify), else 0.0.

    Predictions that need parsing go to the math-verify pool (``workers`` processes, 0: the CPU
    count; ``timeout_s`` per parse and per check).
    """
    comps = list(completions) if isinstance(completions, Sequence) else []
    verdicts: list[bool | None] = []
    pairs: list[tuple[str, str]] = []
    for comp, gold in zip(comps, column(answer, len(comps))):
        try:
            pred, gold_str = math_prediction(comp), _gold_answer(gold)
            verdicts.append(_quick_verdict(pred, gold_str))
            if verdicts[-1] is None:
                pairs.append((pred, gold_str))
        except Exception as err:  # noqa: BLE001 - defence in depth: a reward must not kill a run
            _warn_once("reward", f"math_correctness_reward failed ({err!r}); scoring 0.0")
            verdicts.append(False)
    if pairs:
        checked = iter(_verify_pairs(pairs, timeout_s, workers))
        verdicts = [next(checked) if v is None else v for v in verdicts]
    return [CORRECT_REWARD if v else 0.0 for v in verdicts]


def _verify_pairs(pairs: list[tuple[str, str]], timeout_s: float, workers: int) -> list[bool]:
    if importlib.util.find_spec("math_verify") is None:
        _warn_once("import", "math-verify unavailable; MATH answers compared as normalised strings")
        return [False] * len(pairs)
    try:
        return verify_pool.get_pool(workers).verify(pairs, timeout_s)
    except Exception as err:  # noqa: BLE001 - the pool failed (cannot spawn): score wrong, loudly once
        _warn_once("pool", f"math-verify pool failed ({err!r}); unparsed answers score 0.0")
        return [False] * len(pairs)


def math_format_score(completion: Any) -> float:
    text = completion_text(completion)
    if "<answer>" not in text:
        return 0.0
    return FORMAT_REWARD if "\\boxed{" in extract_answer(text) else 0.0


def math_format_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """0.5 when an ``<answer>`` tag is present and its last block contains ``\\boxed{``."""
    comps = list(completions) if isinstance(completions, Sequence) else []
    return [math_format_score(c) for c in comps]


MATH_REWARDS = [
    ("format", math_format_reward, 1.0),
    ("correct", math_correctness_reward, 1.0),
]
