"""``UniformTrajectory``: what the step-level objectives need from every denoising step of a
uniform-noise sampler (DiffusionGemma's EntropyBound, ``uniform_sampler.py``), recorded at no extra forward.

Under uniform noise a step's input cannot be rebuilt from the final sequence (as
:class:`~diffusion_rl.sampling.trajectory.TrajectoryRecorder` does for masking): re-noised positions hold
random tokens and an accepted position may be drawn again later. So every step is kept whole. Steps are
numbered over the whole rollout, canvas after canvas (all rows run a canvas's steps together); for step
``s`` of canvas ``k`` and row ``b``:

- ``canvas[s]`` (B, C): the canvas the decoder saw; its context is the prompt followed by the final
  tokens of canvases ``0 .. k-1`` (the rollout's completion), which the replay re-encodes;
- ``signal[s]`` (B, C, H) or None: the self-conditioning input (the previous step's expected embedding
  at its temperature, in the embedding dtype; None at a canvas's first step: zeros);
- ``accepted[s]`` (B, C) bool: the positions the entropy bound accepted (pinned tokens and rows that
  had stopped or ended are never accepted); ``tokens[s]`` (B, C): the tokens drawn there;
- ``token_logps[s]`` (B, C) float32: the behaviour policy's ``log softmax(logits / T_s)[token]`` at the
  accepted positions, 0 elsewhere, with ``temperature[s] = T_s``;
- ``greedy[s]`` (B, C): the argmax canvas after the step (what the sampler would write were it to stop
  there: EGSPO-SA's one-step completion).

``log pi(step s) = sum_{i in accepted} token_logps`` (``logps``, (B, T)); which positions were
accepted and the random tokens of re-noising are not part of it (the first is a deterministic
function of the logits, the second does not depend on the policy). ``entropies`` (B, T) is the mean
entropy of the accepted positions at ``T_s``, ``counts`` (B, T) their number.

Memory per sample and step at the released sizes (C = 256, H = 2816, bf16 signal): the signal is
1.44 MB, everything else ~4 KB; 48 steps of one canvas hold ~69 MB a sample (:meth:`nbytes`).
"""

from __future__ import annotations

import torch

from diffusion_rl.sampling.trajectory import TrajectoryRecorder


class UniformTrajectory:
    """A uniform-noise sampler's recorded steps (see the module docstring)."""

    variable_steps = True  # rows stop a canvas early: a step may hold nothing of a row

    def __init__(self, record_greedy: bool = True):
        self.record_greedy = record_greedy
        self.canvas_of: list[int] = []  # T: the canvas index of each step
        self.temperature: list[float] = []  # T: T_s
        self.canvas: list[torch.Tensor] = []  # T x (B, C)
        self.signal: list[torch.Tensor | None] = []  # T x (B, C, H) | None
        self.accepted: list[torch.Tensor] = []  # T x (B, C) bool
        self.tokens: list[torch.Tensor] = []  # T x (B, C)
        self.token_logps: list[torch.Tensor] = []  # T x (B, C) float32
        self._entropies: list[torch.Tensor] = []  # T x (B,)
        self.greedy: list[torch.Tensor] = []  # T x (B, C)
        self.final: torch.Tensor | None = None  # (B, L) the completion

    # ---- recording ----------------------------------------------------------------------
    @torch.no_grad()
    def on_step(self, canvas_index: int, temperature: float, canvas: torch.Tensor, signal: torch.Tensor | None,
                accepted: torch.Tensor, tokens: torch.Tensor, token_logps: torch.Tensor, entropy: torch.Tensor,
                greedy: torch.Tensor) -> None:
        """One denoising step: ``entropy`` (B, C) of ``softmax(logits / T)``; the rest as stored."""
        self.canvas_of.append(canvas_index)
        self.temperature.append(float(temperature))
        self.canvas.append(canvas.clone())
        self.signal.append(None if signal is None else signal.detach())
        self.accepted.append(accepted.clone())
        self.tokens.append(torch.where(accepted, tokens, torch.zeros_like(tokens)))
        self.token_logps.append(torch.where(accepted, token_logps.float(), torch.zeros_like(token_logps, dtype=torch.float32)))
        count = accepted.sum(-1)  # (B,)
        self._entropies.append((entropy.float() * accepted).sum(-1) / count.clamp_min(1))
        if self.record_greedy:
            self.greedy.append(greedy.clone())

    def finish(self, completion: torch.Tensor) -> None:
        self.final = completion.clone()

    # ---- per-step values ----------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return len(self.canvas)

    @property
    def canvas_length(self) -> int:
        return int(self.canvas[0].shape[1]) if self.canvas else 0

    @property
    def logps(self) -> torch.Tensor:
        """(B, T) the behaviour policy's log-probability of each step's accepted tokens."""
        return torch.stack([lp.sum(-1) for lp in self.token_logps], 1)

    @property
    def entropies(self) -> torch.Tensor:
        """(B, T) mean entropy of each step's accepted positions (0 where none)."""
        return torch.stack(self._entropies, 1)

    @property
    def counts(self) -> torch.Tensor:
        """(B, T) int16 positions accepted at each step."""
        return torch.stack([a.sum(-1) for a in self.accepted], 1).to(torch.int16)

    def positions(self, L: int) -> torch.Tensor:
        """(B, T, L) bool: the completion positions each step accepted (canvas ``k`` covers ``k C .. k C + C``)."""
        return self._over_completion(self.accepted, L, torch.bool)

    def position_logps(self, L: int) -> torch.Tensor:
        """(B, T, L) float32: :attr:`token_logps` placed over the completion as :meth:`positions`."""
        return self._over_completion(self.token_logps, L, torch.float32)

    def _over_completion(self, per_step: list[torch.Tensor], L: int, dtype: torch.dtype) -> torch.Tensor:
        """(B, T, L): each step's (B, C) values at its canvas's completion positions, zeros elsewhere."""
        B = self.accepted[0].shape[0] if self.accepted else 0
        out = torch.zeros(B, self.num_steps, L, dtype=dtype, device=self.accepted[0].device if self.accepted else None)
        C = self.canvas_length
        for s, (k, values) in enumerate(zip(self.canvas_of, per_step)):
            out[:, s, k * C:(k + 1) * C] = values
        return out

    def any_action(self) -> tuple[int, int]:
        """A (row, step) that accepted a token: what an update with no row of its own runs, so that its
        (zero) loss still reaches the model's weights."""
        counts = self.counts
        hit = (counts > 0).nonzero()
        if hit.numel() == 0:
            raise RuntimeError("the uniform-noise sampler accepted no token in this rollout")
        return int(hit[0, 0]), int(hit[0, 1])

    def greedy_completion(self, s: int) -> torch.Tensor:
        """(B, L) the completion had the sampler stopped after step ``s``: the finished canvases, the
        argmax canvas after ``s``, the later canvases as the final completion holds them (EGSPO-SA)."""
        if not self.record_greedy:
            raise RuntimeError("greedy completions were not recorded (record_greedy=False)")
        assert self.final is not None, "the trajectory is finished by the sampler"
        out = self.final.clone()
        k, C = self.canvas_of[s], self.canvas_length
        out[:, k * C:(k + 1) * C] = self.greedy[s].to(out.dtype)
        return out

    def select(self, rows: torch.Tensor) -> UniformTrajectory:
        """A trajectory holding only the samples ``rows`` (B',) long, in that order (dynamic sampling)."""
        out = UniformTrajectory(self.record_greedy)
        out.canvas_of, out.temperature = list(self.canvas_of), list(self.temperature)
        pick = lambda xs: [x[rows] for x in xs]  # noqa: E731
        out.canvas, out.accepted, out.tokens = pick(self.canvas), pick(self.accepted), pick(self.tokens)
        out.token_logps, out._entropies, out.greedy = pick(self.token_logps), pick(self._entropies), pick(self.greedy)
        out.signal = [None if x is None else x[rows] for x in self.signal]
        out.final = None if self.final is None else self.final[rows]
        return out

    def nbytes(self) -> int:
        """Bytes held by the recorded trajectory (all samples)."""
        held = [self.final, *self.canvas, *self.signal, *self.accepted, *self.tokens, *self.token_logps,
                *self._entropies, *self.greedy]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


Trajectory = TrajectoryRecorder | UniformTrajectory  # what a rollout records: a masking or a uniform-noise sampler's steps
