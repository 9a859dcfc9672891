"""``UniformTrajectory`` (sampling/uniform_trajectory.py) on steps written by hand: what it keeps of a
step, each per-step value, their placement over the completion, the rows a dynamic-sampling filter keeps,
EGSPO-SA's one-step completions and the bytes it holds."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.sampling.uniform_trajectory import UniformTrajectory

B, C, H = 3, 2, 4  # rows, canvas length, hidden size of the self-conditioning signal


def _step(traj: UniformTrajectory, k: int, T: float, accepted: list[list[int]], tokens: list[list[int]],
          logps: list[list[float]], entropy: list[list[float]], greedy: list[list[int]], signal: bool = True) -> None:
    traj.on_step(k, T, torch.full((B, C), 10 * k + len(traj.canvas)),
                 torch.full((B, C, H), float(len(traj.canvas))) if signal else None,
                 torch.tensor(accepted, dtype=torch.bool), torch.tensor(tokens), torch.tensor(logps, dtype=torch.float64),
                 torch.tensor(entropy), torch.tensor(greedy))


def _three_steps(record_greedy: bool = True) -> UniformTrajectory:
    """Two canvases: steps 0 and 1 on canvas 0, step 2 on canvas 1; row 2 accepts nothing at step 0."""
    t = UniformTrajectory(record_greedy)
    _step(t, 0, 0.8, [[1, 0], [1, 1], [0, 0]], [[5, 6], [7, 8], [9, 9]], [[-0.5, -9.0], [-0.25, -1.0], [-3.0, -3.0]],
          [[0.2, 5.0], [0.1, 0.3], [7.0, 7.0]], [[5, 1], [7, 8], [2, 2]], signal=False)
    _step(t, 0, 0.6, [[0, 1], [0, 0], [1, 0]], [[1, 2], [3, 4], [6, 0]], [[-7.0, -0.125], [-1.0, -1.0], [-2.0, -4.0]],
          [[9.0, 0.4], [1.0, 1.0], [0.6, 3.0]], [[5, 2], [7, 3], [6, 1]])
    _step(t, 1, 0.4, [[1, 1], [0, 1], [0, 0]], [[3, 4], [5, 6], [7, 8]], [[-1.0, -2.0], [-8.0, -0.5], [-1.0, -1.0]],
          [[0.5, 1.5], [2.0, 0.2], [1.0, 1.0]], [[3, 4], [0, 6], [1, 1]])
    t.finish(torch.tensor([[5, 2, 3, 4], [7, 3, 0, 6], [6, 1, 1, 1]]))
    return t


def test_a_step_keeps_the_accepted_tokens_and_their_log_probs_only():
    t = _three_steps()
    assert t.num_steps == 3 and t.canvas_length == C and t.canvas_of == [0, 0, 1] and t.temperature == [0.8, 0.6, 0.4]
    assert t.tokens[0].tolist() == [[5, 0], [7, 8], [0, 0]]
    assert t.token_logps[0].dtype == torch.float32
    assert t.token_logps[0].tolist() == [[-0.5, 0.0], [-0.25, -1.0], [0.0, 0.0]]
    assert t.signal[0] is None and torch.equal(t.signal[1], torch.ones(B, C, H))
    assert t.logps.tolist() == [[-0.5, -0.125, -3.0], [-1.25, 0.0, -0.5], [0.0, -2.0, 0.0]]
    assert t.counts.dtype == torch.int16 and t.counts.tolist() == [[1, 1, 2], [2, 0, 1], [0, 1, 0]]
    # the mean entropy of the accepted positions, 0 where none
    torch.testing.assert_close(t.entropies, torch.tensor([[0.2, 0.4, 1.0], [0.2, 0.0, 0.2], [0.0, 0.6, 0.0]]))


def test_steps_are_placed_over_the_completion_at_their_canvas():
    t = _three_steps()
    pos = t.positions(4)
    assert pos.dtype == torch.bool and pos.shape == (B, 3, 4)
    assert pos[0].tolist() == [[True, False, False, False], [False, True, False, False], [False, False, True, True]]
    assert pos[2].tolist() == [[False] * 4, [True, False, False, False], [False] * 4]
    lp = t.position_logps(4)
    assert lp.dtype == torch.float32
    assert lp[1].tolist() == [[-0.25, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.5]]
    one = UniformTrajectory()  # a single step
    _step(one, 0, 0.8, [[1, 0]] * B, [[1, 1]] * B, [[-1.0, -1.0]] * B, [[0.1, 0.1]] * B, [[1, 1]] * B)
    assert one.positions(2).tolist() == [[[True, False]]] * B
    assert UniformTrajectory().positions(4).shape == (0, 0, 4)  # nothing recorded: no row, no step


def test_an_update_without_rows_of_its_own_finds_the_first_accepting_step():
    t = _three_steps()
    assert t.any_action() == (0, 0)
    t.accepted[0][0] = False  # row 0 now accepts first at step 1
    assert t.any_action() == (0, 1)
    for a in t.accepted:
        a[0] = False
    assert t.any_action() == (1, 0)
    for a in t.accepted:
        a.zero_()
    t.accepted[2][1, 0] = t.accepted[1][2, 1] = True  # row 1 at step 2, then row 2 at step 1
    assert t.any_action() == (1, 2)
    t.accepted[2][1, 0] = False  # one accepting position left
    assert t.any_action() == (2, 1)
    t.accepted[1][2, 1] = False
    with pytest.raises(RuntimeError, match="accepted no token"):
        t.any_action()


def test_the_one_step_completion_puts_the_steps_argmax_in_its_canvas():
    t = _three_steps()
    assert t.greedy_completion(0).tolist() == [[5, 1, 3, 4], [7, 8, 0, 6], [2, 2, 1, 1]]
    assert t.greedy_completion(2).tolist() == [[5, 2, 3, 4], [7, 3, 0, 6], [6, 1, 1, 1]]
    assert t.final.tolist() == [[5, 2, 3, 4], [7, 3, 0, 6], [6, 1, 1, 1]]  # untouched
    assert UniformTrajectory().record_greedy
    bare = _three_steps(record_greedy=False)
    assert bare.greedy == []
    with pytest.raises(RuntimeError, match="not recorded"):
        bare.greedy_completion(0)


def test_selected_rows_keep_every_step_in_their_new_order():
    t = _three_steps()
    s = t.select(torch.tensor([2, 0]))
    assert s.record_greedy and s.canvas_of == [0, 0, 1] and s.temperature == [0.8, 0.6, 0.4]
    assert s.logps.tolist() == [[0.0, -2.0, 0.0], [-0.5, -0.125, -3.0]]
    assert s.counts.tolist() == [[0, 1, 0], [1, 1, 2]]
    for name in ("canvas", "accepted", "tokens", "token_logps", "greedy"):
        for full, kept in zip(getattr(t, name), getattr(s, name)):
            assert torch.equal(kept, full[[2, 0]]), name
    assert s.signal[0] is None and torch.equal(s.signal[2], t.signal[2][[2, 0]])
    torch.testing.assert_close(s.entropies, t.entropies[[2, 0]])
    assert s.final.tolist() == [[6, 1, 1, 1], [5, 2, 3, 4]]
    assert s.greedy_completion(0).tolist() == [[2, 2, 1, 1], [5, 1, 3, 4]]
    assert UniformTrajectory(record_greedy=False).select(torch.tensor([0])).record_greedy is False
    assert UniformTrajectory().select(torch.tensor([0])).final is None


def test_the_bytes_held_count_every_recorded_tensor():
    t = _three_steps()
    # per step: canvas, accepted (bool), tokens, greedy (int64 except accepted), logps (float32),
    # entropies (B,) float32; signal (B, C, H) float32 at steps 1 and 2; the final (B, 4) int64
    per_step = B * C * (8 + 1 + 8 + 8 + 4) + B * 4
    assert t.nbytes() == 3 * per_step + 2 * B * C * H * 4 + B * 4 * 8
    assert _three_steps(record_greedy=False).nbytes() == t.nbytes() - 3 * B * C * 8
