"""``TrajectoryRecorder``: what the step-level objectives (EGSPO, TraceRL, MDPO) need from every
denoising step, recorded at no extra forward.

Plugged into :func:`~diffusion_rl.sampling.generate` as its ``recorder``; ``on_step`` reads the
logits of the forward pass the sampler already makes (docs/methods.md §2). Per rollout sample it
keeps:

- ``commit_step`` (B, P+L) int16: the step at which each position was committed; ``-1`` for positions
  never masked (the prompt), ``NEVER`` for positions still masked at the end, ``FILLED`` for
  positions the sampler set to EOS without a step (``sampler.stop_after_eos``: masked in every
  recorded state, part of none of the committed sets). With the final sequence this gives every
  intermediate state: the state before step ``s`` is the final sequence with every position
  committed at a step ``>= s`` masked (:meth:`state_before`). No per-step copy of the sequence is kept.
- ``final`` (B, P+L): the sequence after the last step (equals the sampler's output).
- per step ``s`` (B, T) each (``T`` = the steps the sampler took; with ``sampler.decode=threshold|factor``
  a row that finished its block early commits nothing at the batch's remaining steps of that block:
  ``counts`` 0, and EGSPO selects none of those steps): ``logps`` (float32) the old policy's log-probability of the committed
  tokens, ``sum_{i in U_s} log softmax(logits_i)[x_i]``; ``entropies`` (float32) the step entropy
  ``H_s``, the mean over ``U_s`` of the full-vocabulary entropy of ``softmax(logits_i)``; ``counts``
  (int16) ``|U_s|``. A position where the sampler drew the mask token itself stays masked and is
  committed later, so it is not part of ``U_s`` at that step.
- the greedy one-step completion ``xhat_s`` (optional, EGSPO-SA): the state before ``s`` with every
  still-masked position filled by ``argmax logits`` (the mask token excluded). Positions committed before ``s`` hold their final
  token in ``xhat_s``, so only the argmax at the positions still masked before ``s`` is stored: one
  flat tensor per step in row-major order of ``state_before(s) == mask`` (int16 when the vocabulary
  fits, else int32). :meth:`greedy_completion` rebuilds ``xhat_s``.
- the sampler's one-step prediction ``xtil_s`` and its confidences (optional, MDPO): the state before
  ``s`` with every still-masked position filled by the token the sampler drew there (inside the
  current block: its Gumbel-max draw at temperature ``tau``, the candidate it commits from; outside
  it, where nothing is drawn, or where the draw is the mask token itself: the argmax over the other
  tokens), and each filled token's probability ``softmax(logits_i / tau)[xtil_i]`` (``tau = 0``: of
  ``softmax(logits_i)``). Stored as the greedy argmaxes are, plus one float32 per entry.
  :meth:`prediction` and :meth:`prediction_confidence` rebuild them.

Temperature: log-probs and entropies use the **temperature-1** log-softmax of the logits the sampler
saw, not ``logits / tau``. That is the policy's distribution as the stepwise likelihood recomputes it
(``likelihood/stepwise.py``), so at ``theta = theta_old`` the two agree; the Gumbel temperature and
the choice of positions are not part of ``log pi(step s)`` (as in the EGSPO code). With classifier-free
guidance (``cfg_scale > 0``) the recorded values are those of the guided logits, which the stepwise
recomputation (an unguided forward) does not reproduce.

Memory per sample, ``T = 128`` steps, ``L = 256`` completion tokens, LLaDA's vocabulary (126,464 ids,
so int32 greedy tokens), blocks of 32 with 16 steps each (2 tokens per step), prompt of ``P`` tokens:
commit steps ``2 (P + L)`` B, final sequence ``8 (P + L)`` B (int64 ids), per-step values
``T * (4 + 4 + 2) = 1,280`` B, greedy argmaxes ``4 * sum_s |masked before s| = 4 * sum_{s<128}
(256 - 2 s) = 4 * 16,512 = 66,048`` B. For ``P = 0`` that is ``512 + 2,048 + 1,280 + 66,048 = 69,888``
B (~68 KiB; +10 B per prompt token), against ~512 KiB for a dense (T, L) int64 state and a dense
(T, L) int64 ``xhat`` per step. Without greedy completions (plain EGSPO) it is ~3.8 KiB. MDPO's
predictions at MDPO's paper setting (``T = 128``, ``L = 512`` in one block, 4 tokens per step, int32
tokens and float32 confidences): ``8 * sum_{s<128} (512 - 4 s) = 8 * 33,024 = 264,192`` B (~258 KiB)
on top of the rest (6,400 B for ``P = 0``, without greedy completions). :meth:`nbytes` reports the actual
figure.
"""

from __future__ import annotations

import torch

NEVER = torch.iinfo(torch.int16).max  # commit step of a position still masked after the last step
FILLED = NEVER - 1  # commit step of a position filled with EOS without a step (stop_after_eos)


class TrajectoryRecorder:
    """A :class:`~diffusion_rl.sampling.StepRecorder` keeping a compact per-step trajectory."""

    def __init__(self, mask_id: int, record_greedy: bool = True, variable_steps: bool = False,
                 record_prediction: bool = False, temperature: float = 1.0):
        self.mask_id = mask_id
        self.record_greedy = record_greedy
        self.variable_steps = variable_steps  # the sampler chose its number of steps (decode=threshold|factor)
        self.record_prediction = record_prediction
        self.temperature = temperature  # the sampler's tau: the predictions' confidences are softmax(logits / tau)
        self.num_steps = 0
        self.commit_step: torch.Tensor | None = None  # (B, P+L) int16
        self.final: torch.Tensor | None = None  # (B, P+L)
        self._logps: list[torch.Tensor] = []  # T x (B,)
        self._entropies: list[torch.Tensor] = []  # T x (B,)
        self._counts: list[torch.Tensor] = []  # T x (B,)
        self._greedy: list[torch.Tensor] = []  # T x (n_s,) argmax at the positions masked before s
        self._prediction: list[torch.Tensor] = []  # T x (n_s,) the sampler's draw there (MDPO)
        self._confidence: list[torch.Tensor] = []  # T x (n_s,) float32 its probability at temperature tau

    # ---- recording ----------------------------------------------------------------------
    @torch.no_grad()
    def on_step(self, step: int, x_before: torch.Tensor, logits: torch.Tensor, candidates: torch.Tensor,
                committed: torch.Tensor) -> None:
        if step != self.num_steps:
            raise RuntimeError(f"TrajectoryRecorder expects steps in order; got {step} after {self.num_steps} steps")
        if step >= FILLED:
            raise RuntimeError(f"TrajectoryRecorder stores step indices as int16; step {step} is too large")
        B = x_before.shape[0]
        masked = x_before == self.mask_id  # (B, T)
        # A drawn mask token leaves its position masked (the sampler redraws it later): not a commit.
        committed = committed & (candidates != self.mask_id)
        if step == 0:
            self.final = x_before.clone()
            self.commit_step = torch.where(masked, NEVER, -1).to(torch.int16)  # (B, T)
        assert self.final is not None and self.commit_step is not None
        rows = committed.nonzero()[:, 0]  # (n,) sample of each committed position
        logp = logits[committed].float().log_softmax(-1)  # (n, V) temperature 1
        ent = -(logp.exp() * logp).sum(-1)  # (n,)
        tok_logp = logp.gather(-1, candidates[committed][:, None]).squeeze(-1)  # (n,)
        count = torch.zeros(B, device=x_before.device).index_add_(0, rows, torch.ones_like(ent))  # (B,)
        self._logps.append(torch.zeros(B, device=x_before.device).index_add_(0, rows, tok_logp))
        self._entropies.append(torch.zeros(B, device=x_before.device).index_add_(0, rows, ent) / count.clamp_min(1))
        self._counts.append(count.to(torch.int16))
        if self.record_greedy or self.record_prediction:
            dtype = torch.int16 if logits.shape[-1] <= torch.iinfo(torch.int16).max + 1 else torch.int32
            still = logits[masked].float()  # (n_s, V) a copy, row-major over `masked`
            has_mask = self.mask_id < still.shape[-1]
            if has_mask:
                mask_logit = still[:, self.mask_id].clone()  # (n_s,)
                still[:, self.mask_id] = float("-inf")  # a completion has no masks left
            greedy = still.argmax(-1)  # (n_s,)
            if has_mask:
                still[:, self.mask_id] = mask_logit  # the confidences below are over the whole vocabulary
            if self.record_greedy:
                self._greedy.append(greedy.to(dtype))
            if self.record_prediction:
                drawn = candidates[masked]  # (n_s,) the draws in the current block; the mask id elsewhere
                pred = torch.where(drawn != self.mask_id, drawn, greedy)  # (n_s,)
                tempered = still / self.temperature if self.temperature > 0 else still
                conf = (tempered.gather(-1, pred[:, None]).squeeze(-1) - tempered.logsumexp(-1)).exp()  # (n_s,)
                self._prediction.append(pred.to(dtype))
                self._confidence.append(conf)
        self.final = torch.where(committed, candidates, self.final)
        self.commit_step = torch.where(committed, torch.tensor(step, dtype=torch.int16, device=committed.device),
                                       self.commit_step)
        self.num_steps += 1

    @torch.no_grad()
    def on_fill(self, filled: torch.Tensor, token: int) -> None:
        """``filled`` (B, P+L) positions set to ``token`` after the last step, without a forward."""
        assert self.final is not None and self.commit_step is not None, "a fill follows the recorded steps"
        self.final = self.final.masked_fill(filled, token)
        self.commit_step = self.commit_step.masked_fill(filled, FILLED)

    # ---- per-step values ----------------------------------------------------------------
    @property
    def logps(self) -> torch.Tensor:
        """(B, T) old policy's log-prob of each step's committed tokens (sum over ``U_s``)."""
        return torch.stack(self._logps, 1)

    @property
    def entropies(self) -> torch.Tensor:
        """(B, T) step entropy ``H_s`` (0 for a step that committed nothing)."""
        return torch.stack(self._entropies, 1)

    @property
    def counts(self) -> torch.Tensor:
        """(B, T) int16 number of tokens committed at each step."""
        return torch.stack(self._counts, 1)

    def select(self, rows: torch.Tensor) -> TrajectoryRecorder:
        """A recorder holding only the samples ``rows`` (B',) long, in that order (dynamic sampling)."""
        assert self.final is not None and self.commit_step is not None
        out = TrajectoryRecorder(self.mask_id, self.record_greedy, self.variable_steps, self.record_prediction,
                                 self.temperature)
        out.num_steps, out.final, out.commit_step = self.num_steps, self.final[rows], self.commit_step[rows]
        out._logps = [v[rows] for v in self._logps]
        out._entropies = [v[rows] for v in self._entropies]
        out._counts = [v[rows] for v in self._counts]
        out._greedy = self._select_flat(self._greedy, rows)
        out._prediction = self._select_flat(self._prediction, rows)
        out._confidence = self._select_flat(self._confidence, rows)
        return out

    def _select_flat(self, per_step: list[torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor]:
        """Per-step flat values over the positions masked before each step (row-major), of ``rows`` only."""
        out = []
        for s, flat in enumerate(per_step):
            per_row = (self.state_before(s) == self.mask_id).sum(-1).tolist()
            parts = flat.split(per_row)
            out.append(torch.cat([parts[r] for r in rows.tolist()]) if rows.numel() else flat[:0])
        return out

    # ---- reconstruction -----------------------------------------------------------------
    def _check(self, s: int, upper: int) -> None:
        if self.commit_step is None:
            raise RuntimeError("nothing recorded yet")
        if not 0 <= s <= upper:
            raise IndexError(f"step {s} outside [0, {upper}]")

    def state_before(self, s: int) -> torch.Tensor:
        """(B, P+L) the sequence the model saw at step ``s``; ``s = T`` gives the final sequence."""
        self._check(s, self.num_steps)
        assert self.final is not None and self.commit_step is not None
        if s == self.num_steps:
            return self.final.clone()  # still-masked positions are masked in it, filled ones hold EOS
        return self.final.masked_fill(self.commit_step >= s, self.mask_id)

    def greedy_completion(self, s: int) -> torch.Tensor:
        """(B, P+L) ``xhat_s``: ``state_before(s)`` with every masked position set to its argmax."""
        self._check(s, self.num_steps - 1)
        if not self.record_greedy:
            raise RuntimeError("greedy completions were not recorded (record_greedy=False)")
        x = self.state_before(s)
        still = x == self.mask_id  # same set and order as the `masked` of on_step
        x[still] = self._greedy[s].to(x.dtype)
        return x

    def prediction(self, s: int) -> torch.Tensor:
        """(B, P+L) the sampler's one-step prediction at step ``s``: ``state_before(s)`` with every masked
        position set to the token drawn there (MDPO; see the module docstring)."""
        self._check(s, self.num_steps - 1)
        if not self.record_prediction:
            raise RuntimeError("predictions were not recorded (record_prediction=False)")
        x = self.state_before(s)
        still = x == self.mask_id
        x[still] = self._prediction[s].to(x.dtype)
        return x

    def prediction_confidence(self, s: int) -> torch.Tensor:
        """(B, P+L) float32: the probability at temperature ``tau`` of each token :meth:`prediction` filled
        in at step ``s``; 0 at the positions not masked before ``s``."""
        self._check(s, self.num_steps - 1)
        if not self.record_prediction:
            raise RuntimeError("predictions were not recorded (record_prediction=False)")
        still = self.state_before(s) == self.mask_id
        conf = torch.zeros(still.shape, dtype=torch.float32, device=still.device)
        conf[still] = self._confidence[s].to(conf.device)
        return conf

    def predictions_at(self, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`prediction` and :meth:`prediction_confidence` at per-sample steps, one row per
        (sample, slot), in the order of :meth:`states_at`. steps (B, K) in ``[0, T)`` -> (B*K, P+L) each"""
        assert self.final is not None
        B, K = steps.shape
        flat = steps.reshape(-1).cpu()  # (B*K,)
        rows = torch.arange(B).repeat_interleave(K)  # (B*K,) the sample of each row
        tokens = self.final.new_empty(B * K, self.final.shape[1])
        conf = torch.empty(B * K, self.final.shape[1], dtype=torch.float32, device=self.final.device)
        for s in flat.unique().tolist():  # one reconstruction per distinct step
            hit = (flat == s).nonzero()[:, 0]
            tokens[hit.to(tokens.device)] = self.prediction(s)[rows[hit].to(tokens.device)]
            conf[hit.to(conf.device)] = self.prediction_confidence(s)[rows[hit].to(conf.device)]
        return tokens, conf

    def states_at(self, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """States before, and positions committed at, per-sample steps; one row per (sample, slot).

        steps: (B, K) long in ``[0, T)`` -> states (B*K, P+L), committed (B*K, P+L) bool
        """
        B, K = steps.shape
        rows = torch.arange(B, device=steps.device).repeat_interleave(K)  # (B*K,)
        return self.transitions(rows, steps.reshape(-1))

    def transitions(self, rows: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The state before, and the positions committed at, step ``steps[m]`` of sample ``rows[m]``.

        rows, steps: (M,) long, steps in ``[0, T)`` -> states (M, P+L), committed (M, P+L) bool
        """
        assert self.final is not None and self.commit_step is not None
        cs = self.commit_step.long()[rows]  # (M, P+L)
        s = steps[:, None]  # (M, 1)
        return self.final[rows].masked_fill(cs >= s, self.mask_id), cs == s

    def last_step_where(self, positions: torch.Tensor) -> torch.Tensor:
        """(B,) last step that committed any of ``positions`` ((B, P+L) bool); -1 where none did."""
        assert self.commit_step is not None
        cs = self.commit_step.long()
        cs = cs.masked_fill(~positions | (cs >= FILLED), -1)
        return cs.max(-1).values

    def nbytes(self) -> int:
        """Bytes held by the recorded trajectory (all samples)."""
        held = [self.commit_step, self.final, *self._logps, *self._entropies, *self._counts, *self._greedy,
                *self._prediction, *self._confidence]
        return sum(t.numel() * t.element_size() for t in held if t is not None)
