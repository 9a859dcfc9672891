"""The likelihood of a recorded sampler trajectory: each step's action replayed from the state the
sampler saw (docs/methods.md §3 "Trajectory likelihood").

    log pi(trajectory) = sum_s log pi(step s),   log pi(step s) = sum_{i in U_s} log p_s(x_i | state_s)

A masking sampler's step (``TrajectoryRecorder``): the state is the partly masked sequence, ``U_s`` the
positions committed, ``p_s`` the temperature-1 softmax (``likelihood/stepwise.py``). A uniform-noise
sampler's step (``UniformTrajectory``, DiffusionGemma): the state is the canvas before the step with
its self-conditioning signal, after the prompt and the earlier canvases as context; ``U_s`` the
positions the entropy bound accepted, ``x_i`` the tokens drawn there, ``p_s = softmax(logits / T_s)``
at the step's temperature, the distribution the tokens were drawn from. Which positions were accepted
(a deterministic function of the logits) and the re-noising tokens (independent of the policy) are not
part of it; the recorded self-conditioning signal is part of the state, so its own dependence on the
weights (through the previous step) is not differentiated. At the behaviour policy's weights the
replay reproduces the sampler's recorded log-probabilities (tests/unit/likelihood/test_trajectory.py).

:func:`replay_logps` scores given (sample, step) rows, as the step-level objectives (TraceRL, CJ-GRPO,
EGSPO) choose them; ``likelihood=trajectory`` (:class:`TrajectoryEstimator`) sums every step of a
sample into one sequence unit, the trajectory's log-likelihood (GRPO, or any objective with sequence
ratios, on the trajectory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.likelihood.base import LIKELIHOODS, LikelihoodConfig, LikelihoodEstimator
from diffusion_rl.likelihood.stepwise import stepwise_logps
from diffusion_rl.sampling.uniform_trajectory import Trajectory, UniformTrajectory


def step_positions(traj: Trajectory, L: int) -> torch.Tensor:
    """(n, T, L) bool: the completion positions each recorded step committed (masking) or accepted
    (uniform noise)."""
    if isinstance(traj, UniformTrajectory):
        return traj.positions(L)
    assert traj.commit_step is not None, "nothing recorded"
    cs = traj.commit_step[:, -L:].long()  # (n, L)
    return cs[:, None, :] == torch.arange(traj.num_steps, device=cs.device)[None, :, None]


def replay_logps(forward, traj: Trajectory, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 completion_ids: torch.Tensor, sample: torch.Tensor, step: torch.Tensor,
                 select: torch.Tensor | None = None) -> torch.Tensor:
    """log pi of each (sample, step) row's action token by token: (M, L) over the completion, 0 outside
    the step's positions and ``select`` (M, L) bool. ``sample`` / ``step`` (M,) long."""
    L = completion_ids.shape[1]
    positions = step_positions(traj, L)[sample, step]  # (M, L)
    sel = positions if select is None else positions & select.bool()
    if isinstance(traj, UniformTrajectory):
        return _uniform_replay(forward, traj, prompt_ids, prompt_mask, completion_ids, sample, step, sel)
    P = traj.final.shape[1] - L  # type: ignore[union-attr]
    states, _ = traj.transitions(sample.to(traj.final.device), step.to(traj.final.device))  # type: ignore[union-attr]
    committed = torch.zeros_like(states, dtype=torch.bool)
    committed[:, P:] = sel
    attn = None if bool(prompt_mask.all()) else torch.cat([prompt_mask.long(), torch.ones_like(completion_ids)], 1)[sample]
    return stepwise_logps(forward, states, attn, committed, traj.final[sample], reduce="token")[:, P:]  # type: ignore[index]


def _uniform_replay(forward, traj: UniformTrajectory, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                    completion_ids: torch.Tensor, sample: torch.Tensor, step: torch.Tensor,
                    sel: torch.Tensor) -> torch.Tensor:
    """:func:`replay_logps` of a uniform-noise trajectory: one forward per canvas index, its rows batched."""
    C, L = traj.canvas_length, completion_ids.shape[1]
    out = torch.zeros(sample.shape[0], L, dtype=torch.float32, device=completion_ids.device)
    canvas_of = torch.tensor(traj.canvas_of, dtype=torch.long)[step.cpu()]  # (M,)
    for k in canvas_of.unique().tolist():
        idx = (canvas_of == k).nonzero()[:, 0].to(sample.device)
        b, s = sample[idx].tolist(), step[idx].tolist()
        span = slice(k * C, (k + 1) * C)
        ctx = torch.cat([prompt_ids[sample[idx]], completion_ids[sample[idx], :k * C]], 1)
        mask = torch.cat([prompt_mask[sample[idx]], torch.ones_like(completion_ids[sample[idx], :k * C])], 1)
        canvas = torch.stack([traj.canvas[j][i] for i, j in zip(b, s)])
        tokens = torch.stack([traj.tokens[j][i] for i, j in zip(b, s)])
        signal = _signals(traj, b, s)
        temperature = torch.tensor([traj.temperature[j] for j in s], dtype=torch.float32)
        lp = forward.run(input_ids=ctx, attention_mask=mask, canvas=canvas, self_conditioning=signal,
                         targets=tokens, select=sel[idx, span], temperature=temperature).token_logps  # (m, C)
        out[idx, span] = lp.float()
    return out


def _signals(traj: UniformTrajectory, rows: list[int], steps: list[int]) -> torch.Tensor | None:
    """The recorded self-conditioning inputs of (row, step) pairs, (m, C, H); zeros where a step had none
    (a canvas's first: the decoder then adds zeros itself); None when no step had one."""
    known = [traj.signal[j] for j in steps if traj.signal[j] is not None]
    if not known:
        return None
    zero = torch.zeros_like(known[0][0])  # type: ignore[index]
    return torch.stack([zero if traj.signal[j] is None else traj.signal[j][i] for i, j in zip(rows, steps)])  # type: ignore[index]


@dataclass
class TrajectoryLikelihoodConfig(LikelihoodConfig):
    name: str = "trajectory"
    p_mask_prompt: float = 0.0  # not used: the states are the sampler's own


@LIKELIHOODS.register("trajectory")
class TrajectoryEstimator(LikelihoodEstimator):
    """``log pi(trajectory)`` of each sample: every recorded step's action on the scored positions
    (``completion_mask``), one sequence unit. The rollout records the trajectory for it
    (``needs_trajectory``)."""

    config_class = TrajectoryLikelihoodConfig
    per_token = False
    needs_trajectory = True

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None,
                 trajectory: Trajectory | None = None) -> torch.Tensor:
        if trajectory is None:
            raise ValueError("likelihood=trajectory scores the rollout's recorded trajectory: none was given")
        L = completion_ids.shape[1]
        hit = step_positions(trajectory, L).to(completion_mask.device) & completion_mask.bool()[:, None, :]  # (n, T, L)
        sample, step = hit.any(-1).nonzero(as_tuple=True)  # (M,) each
        total = torch.zeros(completion_ids.shape[0], dtype=torch.float32, device=completion_ids.device)
        if sample.numel() == 0:
            return total
        logp = replay_logps(forward, trajectory, prompt_ids, prompt_mask, completion_ids, sample, step,
                            completion_mask.bool()[sample])  # (M, L)
        return total.index_add(0, sample, logp.sum(-1))

    def sampler_units(self, token_logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """A sampler's per-token log-probabilities summed over the scored tokens (a masking sampler commits
        each token once, so that is its trajectory log-probability at temperature 1). -> (B,)"""
        return (token_logp * completion_mask).sum(-1)
