"""JustGRPO: plain GRPO on a masked diffusion model that decodes like an autoregressive one.

The rollouts decode strictly left to right, one token per forward, at temperature 1
(:meth:`JustGRPO.rollout_sampler`: ``sampler.block_length = 1``, ``steps = gen_length``), so token
``x_t`` of a sample was drawn from ``pi(x_t | prompt, x_<t)``, the model's distribution at position
``t`` of ``[prompt | x_<t | MASK ...]``. The loss scores exactly that log-probability, one input per
position (``likelihood/left_to_right.py``). With ``A_i = (r_i - mean_G r) / (std_G r + 1e-4)``
(``advantage=group_std``, the unbiased std), no old policy and one update per rollout, it is
on-policy REINFORCE. The groups of the batch are taken ``k = norm_groups`` at a time; chunk ``c``,
with ``V_c`` samples whose advantage is not 0 and ``k_c`` groups (``k``, fewer in a last short
chunk), is divided by ``L`` (the completion width) times its mean count per group::

    rho_it = exp(lp_it - sg(lp_it)) = 1        lp_it = log pi(x_it | prompt_i, x_i,<t)
    loss   = sum_c  sum_{i in c} sum_t  -A_i rho_it  /  (k_c L (V_c / k_c + 1e-5))
    grad   = sum_c  sum_{i in c} sum_t  -A_i grad lp_it / (L (V_c + k_c 1e-5))

Samples with ``A = 0`` (a group whose rewards agree) contribute nothing and do not count in ``V_c``,
so they do not dilute the others. Metrics: ``justgrpo/nonzero_adv_frac`` (share of samples with
``A != 0``), ``justgrpo/tokens_per_sample`` (positions scored, each one forward) and, with
``ratio_diagnostic=true``, ``ratio/*``: the per-token log-ratio of the policy against the sampler's
own recorded log-probability of each token (``Rollout.sampler_logp``: the rollout policy's exact
value, no forward spent), below 1e-5 at the first update of a rollout (float batching only) and the
drift of a reused rollout after it.

Source: Ni et al. 2026, "The Flexibility Trap: Why Arbitrary Order Limits Reasoning Potential in
Diffusion Language Models" (arXiv:2601.15165); LeapLabTHU/JustGRPO @ eebe50e: ``grpo.py`` L7-22
(``sample``: ``block_length=1``, temperature 1), L25-55 (``logprob_loss``), L58-61
(``compute_group_advantages``); ``train.py`` L13-31 (lr 5e-6, weight decay 0, clip 1.0, G = 8 x 2 =
16, 256 tokens in 256 steps), L152-219 (the step: ``valid_samples``, 8 accumulation steps summed,
``nan_to_num``, AdamW (0.9, 0.999)); README: 8 processes x 8 accumulation steps = 64 prompts per
step, one prompt per process and accumulation step. The loss is transcribed in
``tests/unit/rl/test_justgrpo.py``.

Deviations from the public code:

- the rollout batch is one loss. The public step sums 8 accumulation steps, each normalised over
  the groups the 8 processes hold at that step (the mean over processes of their counts, then the
  processes' gradients averaged); here ``norm_groups`` consecutive groups of the batch (default 8, the
  public processes) play one accumulation step, whatever the number of processes of this run, and a
  last short chunk normalises over its own groups. ``task.prompts_per_batch = 64`` with ``G = 16``
  is the public batch; the task's own defaults stay otherwise;
- the public clip (``min(rho A, clip(rho, 0.8, 1.2) A)``) never acts: ``rho`` is 1 at every token, both
  branches carry ``grad rho`` and ``torch.min`` splits a tie's gradient evenly. It is left out; value
  and gradient are the same (the transcription in the tests keeps it);
- tokens: ``tokens=all`` (default) scores every completion position, those after the first EOS too,
  as the public code scores its EOS padding (which the sampler drew); ``tokens=scored`` the rollout's
  ``scored_mask`` (up to the first EOS; with ``task.loss_mask=reward`` what the reward reads). Pinned
  tokens (Sudoku's givens) are context in every input and never scored, since the sampler never draws
  them; ``L`` stays the completion width either way, as the public ``gen_length``;
  ``sampler.stop_after_eos`` (EOS filled in without a draw) is refused with ``tokens=all``;
- rewards are the task's; the public ones are +1 / -1 for correct / wrong. The std-scaled advantage
  of a two-valued reward does not depend on its two values (up to the 1e-4);
- rollouts: the configured sampler with one-token blocks, ``steps = gen_length``, temperature 1,
  ``decode=fixed``, ``kv_cache=none``, no guidance (:meth:`rollout_sampler`; the public ``generate``
  call). Evaluation keeps the configured sampler (the public ``eval.py`` decodes blocks of 32);
- non-finite values: the public step zeroes NaN / inf gradient entries and steps; here a non-finite
  loss or gradient skips the update (the module's rule);
- ``mu > 1`` reuses a rollout uncorrected (the ratio stays 1: there is no old policy); the public code
  and the default run one update per rollout;
- ``beta`` (0, the public code's) > 0 adds the shared k3 KL to the reference on the same exact
  per-token log-probabilities, one more pass over the rows without gradients;
- precision: the public forward runs under bf16 autocast with an fp32 log-softmax; here the model's
  dtype (fp32 on the CPU job) with an fp32 log-softmax;
- block models (SDAR, TraDo, LLaDA2) are refused: their sampler decodes each block by confidence, so
  no left-to-right rollout exists for them here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.left_to_right import left_to_right_logps
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig
from diffusion_rl.rl.objectives.losses import check_per_sample, ratio_metrics
from diffusion_rl.sampling.sampler import SamplerConfig

TOKENS = ("all", "scored")
VALID_EPS = 1e-5  # added to the mean count of samples with A != 0 (the public `valid_samples + 1e-5`)


@dataclass
class JustGRPOConfig(ObjectiveConfig):
    name: str = "justgrpo"
    beta: float = 0.0  # no KL in the public code
    # groups normalised together: the public accumulation step holds one group on each of 8 processes
    norm_groups: int = 8
    tokens: str = "all"  # all (every unpinned completion position: the public code) | scored (Rollout.scored_mask)
    # rows (one per scored position) per forward; 0 = every row of the batch in one call. With a value, each
    # chunk is checkpointed: a backward holds one chunk's activations (set it for long completions on big models)
    rows_per_forward: int = 0
    # log the per-token log-ratio of the policy against the sampler's recorded log-probs (no extra forward;
    # with old_policy=copy the module keeps its frozen copy of the policy for the rollouts)
    ratio_diagnostic: bool = True

    def validate(self) -> None:
        super().validate()
        if self.norm_groups < 1:
            raise ConfigError("objective.norm_groups", self.norm_groups, "must be >= 1")
        check_choice("objective.tokens", self.tokens, TOKENS)
        if self.rows_per_forward < 0:
            raise ConfigError("objective.rows_per_forward", self.rows_per_forward, "must be >= 0 (0 = all rows at once)")
        if self.behaviour_correction != "none":
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              "objective=justgrpo takes none: its rollouts come from the exact sampler it scores")


def justgrpo_loss(
    logp: torch.Tensor,  # (B, L) exact per-token log-probs with grad, 0 outside mask; B = groups * G, prompt-major
    old_logp: torch.Tensor | None,  # (B, L) the sampler's recorded log-probs (diagnostic only), or None
    advantages: torch.Tensor,  # (B, 1) one per sample
    mask: torch.Tensor,  # (B, L) the positions scored
    cfg: JustGRPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """JustGRPO's on-policy REINFORCE loss and its metrics; a pure function of tensors (``surrogate`` unused)."""
    check_per_sample(advantages, "justgrpo")
    B, L = logp.shape
    if B % group_size:
        raise ValueError(f"justgrpo needs rows in whole groups, got {B} rows, group {group_size}")
    m = mask.bool()
    a = advantages.reshape(-1).float()  # (B,)
    groups = B // group_size
    chunk_of_group = torch.arange(groups, device=logp.device) // cfg.norm_groups  # (B/G,)
    chunk = chunk_of_group.repeat_interleave(group_size)  # (B,)
    C = (groups + cfg.norm_groups - 1) // cfg.norm_groups
    valid = (a != 0).float()  # (B,)
    V = torch.zeros(C, device=logp.device).index_add(0, chunk, valid)  # (C,) samples with A != 0 per chunk
    k = torch.zeros(C, device=logp.device).index_add(0, chunk_of_group, torch.ones(groups, device=logp.device))
    scale = 1.0 / (L * k * (V / k + VALID_EPS))  # (C,)
    lp = torch.where(m, logp.float(), torch.zeros_like(logp, dtype=torch.float))  # (B, L)
    ratio = torch.exp(lp - lp.detach())  # (B, L) 1 in value, grad lp in gradient
    per_row = torch.where(m, -a[:, None] * ratio, torch.zeros_like(ratio)).sum(-1)  # (B,)
    loss = (per_row * scale[chunk]).sum()
    with torch.no_grad():
        metrics = {"justgrpo/nonzero_adv_frac": valid.mean(),
                   "justgrpo/tokens_per_sample": m.float().sum(-1).mean()}
        if old_logp is not None:
            metrics.update(ratio_metrics(lp - old_logp.float(), m))  # a diagnostic: nothing is clipped
    return loss, metrics


@OBJECTIVES.register("justgrpo")
class JustGRPO(Objective):
    config_class = JustGRPOConfig
    cfg: JustGRPOConfig
    policy_loss = staticmethod(justgrpo_loss)

    needs_likelihood = LikelihoodNeed("objective=justgrpo scores each token given the tokens before it "
                                      "(likelihood/left_to_right.py); leave likelihood at one_step", one_step=True)

    def bind(self, bundle) -> None:
        if bundle.block_size:
            raise ConfigError("model.block_size", bundle.block_size,
                              "objective=justgrpo needs a masked diffusion model (block size 0): a block model's "
                              "sampler decodes each block by confidence, not left to right")

    def rollout_sampler(self, sampler: SamplerConfig) -> SamplerConfig:
        """The public ``sample``'s decoding: one token per block and per step, left to right, at
        temperature 1, with the exact sampler's options (no cache, no guidance)."""
        if sampler.stop_after_eos and self.cfg.tokens == "all":
            raise ConfigError("sampler.stop_after_eos", True,
                              "objective=justgrpo with objective.tokens=all scores every position, and the EOS "
                              "filled in after the first one were not drawn: set objective.tokens=scored")
        return replace(sampler, block_length=1, steps=sampler.gen_length, temperature=1.0, decode="fixed",
                       kv_cache="none", cfg_scale=0.0, remasking="low_confidence")

    def needs_old_logp(self) -> bool:
        return self.cfg.ratio_diagnostic

    def old_logp_like_policy(self) -> bool:
        return False  # the old log-probs are the sampler's own log-probs, not a second scoring

    def tokens(self, ctx: StepContext) -> torch.Tensor:
        """(n, L) float: the positions scored."""
        ro = ctx.rollout
        return ro.scored_mask if self.cfg.tokens == "scored" else ro.unpinned_mask

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        ro = ctx.rollout
        mask = self.tokens(ctx)
        logp = left_to_right_logps(forward, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, mask.bool(),
                                   self.likelihood.mask_id, ro.pinned, self.cfg.rows_per_forward)
        return LogpUnits(logp, mask)

    def compute_old_logp(self, ctx: StepContext) -> torch.Tensor:
        """The rollout policy's log-prob of each scored token: the sampler's own, recorded as it drew the
        token from the same input the loss scores (no forward); a rollout without them is scored."""
        ro = ctx.rollout
        if ro.sampler_logp is None:
            return super().compute_old_logp(ctx)
        return ro.sampler_logp * self.tokens(ctx).to(ro.sampler_logp.dtype)

    def sampler_units(self, ctx: StepContext) -> torch.Tensor | None:
        return None  # the old log-probs are the sampler's: no mismatch to measure
