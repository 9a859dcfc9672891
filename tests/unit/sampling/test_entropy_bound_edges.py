"""The EntropyBound rules at their edges (sampling/entropy_bound.py), against transformers' own rules
(``generation_diffusion_gemma.py``) or values worked out by hand from them: the bound's tie, the
stopping rule without a stability check, its first step, its history over several steps, and the mean
entropy over the free positions only."""

from __future__ import annotations

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    StableAndConfidentStoppingCriteria,
)

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sampling.entropy_bound import (
    EntropyBoundConfig,
    StableAndConfident,
    accept_mask,
    token_entropy,
)


def test_a_position_whose_sum_minus_the_largest_equals_the_bound_is_accepted():
    """transformers: ``cumsum - sorted <= bound``. Sorted 0, 0.25, 0.25, 1 give 0, 0, 0.25, 0.5 (exact in
    binary), so with bound 0.25 the third is accepted at equality and the fourth is not."""
    ent = torch.tensor([[0.25, 1.0, 0.0, 0.25], [1.0, 0.25, 0.25, 0.0]])
    assert accept_mask(ent, 0.25).tolist() == [[True, False, True, True], [False, True, True, True]]
    below = accept_mask(ent, 0.2499)  # just under: the zero and one of the two 0.25s (the sort's choice)
    assert below.sum(-1).tolist() == [2, 2] and below[0, 2] and below[1, 3] and not below[:, [1, 0]].diagonal().any()


@pytest.mark.parametrize(("field", "ok", "bad"), [
    ("steps", 1, 0),
    ("entropy_bound", 1e-9, 0.0),
    ("t_min", 0.0, -1e-9),
    ("stability_threshold", 0, -1),
    ("confidence_threshold", 1e-9, 0.0),
])
def test_each_setting_accepts_its_edge_and_refuses_one_step_past(field, ok, bad):
    EntropyBoundConfig(**{field: ok}).validate()
    with pytest.raises(ConfigError, match=rf"^sampler\.uniform\.{field}={bad} is invalid"):
        EntropyBoundConfig(**{field: bad}).validate()


def test_the_temperature_must_fall():
    EntropyBoundConfig(t_max=0.41, t_min=0.4).validate()
    with pytest.raises(ConfigError, match=r"^sampler\.uniform\.t_max=0\.4 is invalid"):
        EntropyBoundConfig(t_max=0.4, t_min=0.4).validate()
    with pytest.raises(ConfigError, match=r"^uniform\.steps=0 is invalid"):
        EntropyBoundConfig(steps=0).validate("uniform")


def _logits(rows: list[float], C: int = 5, V: int = 7) -> torch.Tensor:
    """(B, C, V) logits whose row b is a peak of height rows[b] at token 0: higher is more confident."""
    out = torch.zeros(len(rows), C, V)
    for b, h in enumerate(rows):
        out[b, :, 0] = h
    return out


def test_without_a_stability_check_a_row_stops_once_it_is_confident():
    """stability_threshold 0: every row is stable (transformers: ones over the batch); 3 rows, a canvas of 5."""
    logits = _logits([12.0, 0.0, 9.0])
    argmax = torch.zeros(3, 5, dtype=torch.long)
    ours = StableAndConfident(EntropyBoundConfig(stability_threshold=0, confidence_threshold=0.01))
    ref = StableAndConfidentStoppingCriteria(0, 0.01)
    got = ours(argmax, token_entropy(logits))
    # entropies per row: ~1e-4, log 7, ~2e-3: the first and the third are under 0.01, at the first step already
    assert got.tolist() == [True, False, True]
    assert torch.equal(got, ref(argmax, logits))


@pytest.mark.parametrize("token", [0, 1, 2])
def test_no_row_stops_at_its_first_step_whatever_its_tokens(token):
    """The history starts at -1, which no token is: a confident canvas of any id waits one step."""
    logits = _logits([20.0, 20.0])
    argmax = torch.full((2, 5), token, dtype=torch.long)
    ours = StableAndConfident(EntropyBoundConfig(stability_threshold=1, confidence_threshold=0.01))
    ref = StableAndConfidentStoppingCriteria(1, 0.01)
    for step, expected in enumerate([False, True, True]):
        got = ours(argmax, token_entropy(logits))
        assert got.tolist() == [expected, expected], step
        assert torch.equal(got, ref(argmax, logits))


def test_stability_over_three_steps_keeps_the_newest_three_canvases():
    """stability_threshold 3: a row stops once its argmax canvas equals each of the previous three. The
    sequence A A A B A A A A: stable at step 4 (three As before), not at 5-7 (the B is among the last
    three), stable again at 8. Dropping the wrong end of the history would stop the row at step 6 or 7."""
    A, B = torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5, dtype=torch.long)
    logits = _logits([20.0])
    ours = StableAndConfident(EntropyBoundConfig(stability_threshold=3, confidence_threshold=0.01))
    ref = StableAndConfidentStoppingCriteria(3, 0.01)
    seen = []
    for canvas in [A, A, A, A, B, A, A, A, A]:
        got = ours(canvas, token_entropy(logits))
        assert torch.equal(got, ref(canvas, logits))
        seen.append(bool(got))
    assert seen == [False, False, False, True, False, False, False, False, True]


def test_the_mean_entropy_covers_the_free_positions_only():
    """``free`` leaves pinned positions out of the mean (transformers' rule has no pins: every position).
    Threshold 0.25, no stability check:
    - row 0: free entropies 0.1, 0.2, 0.3 (the pinned 5.0 left out): mean 0.2 -> stops;
    - row 1: nothing free: mean 0 -> stops (nothing left to denoise);
    - row 2: one free position at 0.4: mean 0.4 -> goes on;
    - row 3: free 0.25 and 0.25: mean exactly 0.25, not below -> goes on;
    - row 4: free 0.1 and 0.3 (the pinned 9s left out): mean 0.2 -> stops."""
    entropy = torch.tensor([[0.1, 0.2, 5.0, 0.3], [9.0, 9.0, 9.0, 9.0], [0.4, 9.0, 9.0, 9.0],
                            [0.25, 0.25, 9.0, 9.0], [9.0, 0.1, 9.0, 0.3]])
    free = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    rule = StableAndConfident(EntropyBoundConfig(stability_threshold=0, confidence_threshold=0.25))
    argmax = torch.zeros(5, 4, dtype=torch.long)
    assert rule(argmax, entropy, free).tolist() == [True, True, False, False, True]
    # every position free is transformers' mean over the canvas
    assert rule(argmax, entropy, torch.ones_like(free)).tolist() == rule(argmax, entropy).tolist()
