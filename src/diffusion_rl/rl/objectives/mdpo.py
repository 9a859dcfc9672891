"""MDPO: every denoising step's one-step prediction is rewarded, and the steps whose advantage is
largest are trained (docs/methods.md §4.16).

At each step ``t`` the sampler's forward on the state ``x_t`` predicts every masked position at once:
``xtil_t``, the tokens it draws there (temperature ``tau``). The trajectory recorder keeps ``xtil_t``
and each filled token's probability ``c_ti = softmax(f(x_t)_i / tau)[xtil_ti]`` at no extra forward
(``sampling/trajectory.py``); ``x_t`` itself is rebuilt from the commit steps. The rollout rewards
every prediction with the final completions (``r_t = r(xtil_t)``, ``t = 0 .. T-1``; the last one is the
final completion) and ``advantage=mdpo`` (``rl/advantages.py``) turns them into

    a_t = (r_t - r_{t-1}) + 1 + mean_{u > t} r_u       (r_{-1} = 0; the last step's mean is r_{T-1})
    A_t = (a_t - mean_G(a_t)) / (std_G(a_t) + 1e-4)     per step over the prompt's group, unbiased std

Per sample the ``K`` steps of largest ``|A_t|`` are trained (highest first, ties to the earlier step).
A trained step scores the prediction on the positions ``M_t`` masked in ``x_t``:

    logp_ti  = log softmax(f_theta(x_t)_i / (tau + eps))[xtil_ti]        (eps: float32's machine epsilon)
    lambda_t = L / (|M_t| + 1e-4)                                      (L: the completion width)
    loss_t   = sum_{i in M_t} c_ti [ -rho_ti A_t lambda_t + beta (logp_ref,ti - logp_ti)^2 / 2 ] / (|M_t| + 1e-4)
    loss     = mean over samples of  sum over the sample's K trained steps of loss_t

with ``rho = exp(logp - sg(logp))``: 1 in value, the gradient of ``logp`` (no old log-probabilities).
``c`` is the rollout's (detached), the KL is k2 to the reference (the warm start) and is not scaled by
``lambda_t``. In the shared template (``rl/objectives/base.py``) the units are (sample, trained step,
position) ``(N, K, L)``: :func:`mdpo_loss` gets ``A_t c_ti`` as the advantage of each unit (exact:
``c >= 0``) and :meth:`MDPO.kl_term` the confidences as the KL's weights.

Source: Masked Diffusion Policy Optimization, autonomousvision/mdpo @ e6ae439:
``src/open_r1/mdpo/mdpo_trainer.py`` L785-787 (the rollout keeps every step's input, prediction and
confidence), L803-841 (every step's prediction decoded and rewarded), L843-858 (the advantages: adv-v3
plus adv-v4's mean of the later rewards, z-scored per step over the gathered group, + 1e-4), L917-949
(``split_into_micro_batches``: ``topk`` of ``|A|`` summed over the per-device batch, one micro-batch
per trained step), L1261-1308 (each step's loss a micro-batch of the accumulated gradient), L733-740
(``logits / (temperature + eps)``), L1487-1545 (``compute_loss``); ``src/mdlm_generation_utils.py``
L28-130 (``diffusion_generate``: ``x0`` drawn at every masked position, the confidence is
``softmax(logits / T)[x0]`` at every position, kept before the block cut); README (the paper run:
``--temperature 0.4 --beta 0.02 --learning_rate 7e-7 --sample_train_steps 8 --diffusion_steps 128
--max_completion_length 512 --block_length 512``); ``recipes/LLaDA-Instruct/mdpo/config_demo.yaml``
(one sample per device, ``num_generations`` = the number of GPUs).

Defaults: the paper run's ``K = 8``, ``beta = 0.02``, ``mu = 1``, ``advantage=mdpo``, ``optim=mdpo``
(AdamW (0.9, 0.999), lr 7e-7, no weight decay, total-norm clip 1.0: Hugging Face's defaults under the
README's lr). The paper's sampler setting (``sampler.temperature=0.4``, 128 steps, one block of 512) is
the sampler's to set; the loss uses whatever ``sampler.temperature`` the rollout ran at.

Deviations from the public code:

- The sampler is the project's (docs/methods.md §2): its Gumbel-max draw at ``tau`` has the public
  ``Categorical(softmax(logits / tau))``'s distribution, but it commits the most confident positions
  by their temperature-1 probability (LLaDA's rule), where the public ``conf_alg=llada`` ranks them by
  the temperature-``tau`` one. Outside the current block (several blocks) the sampler draws nothing,
  so the prediction there is the argmax (the public code samples it); so is a position whose draw is
  the mask token itself. The paper run has one block (``--mixture_data`` mixes in blocks of 128:
  not reproduced, nor RCR decoding or ``--incremental_training``'s filter of the training prompts).
  Its rollouts commit on MaskGIT's linear schedule (``src/mdlm_generation_utils.py`` calls
  ``get_num_transfer_tokens_maskgit``): ``sampler.schedule=maskgit`` gives that; the default is LLaDA's even
  split (``schedule=even``), which commits the same counts whenever the steps divide the masked
  positions (the Sudoku job's 16 cells in 8 steps) and otherwise gives the remainder to the first steps.
- Step choice and normalisation are per sample. The public ``topk`` sums ``|A|`` over the per-device
  batch and its token normaliser covers the micro-batch; its recipes put one sample on each device,
  which is what is done here for every sample. The z-score is per prompt's group: the public code
  subtracts the gathered groups' statistics from the local rows by broadcasting, which is the same
  only while one group is in flight (its recipes' ``num_generations`` = the number of GPUs).
- One rollout makes ``mu`` optimizer steps on the same ``K`` steps (default 1: the public one step per
  accumulated batch; its ``num_iterations > 1`` path reads old log-probabilities it never computes).
  With ``mu > 1`` the rollout is reused uncorrected: the loss has no ratio.
- ``eps``: the logits are fp32 here, so ``tau + 1.2e-7``; the public bf16 run divides by
  ``tau + 2^-7`` (0.4078 for 0.4).
- Trained positions: every completion position masked in ``x_t``, tokens after the prediction's EOS
  included, as the public loss; with ``task.loss_mask=reward`` only those the reward reads (``|M_t|``
  counts them, ``L`` stays the completion width). Ties in ``|A|`` go to the earlier step
  (``torch.topk`` leaves their order open). The reference policy is the warm start (the public reference is the initial model).
- Masked-diffusion models only: a block model's sampler computes no logits outside its current
  block, where most of the prediction lies (refused at start-up).
- ``ratio/*`` (``ratio_diagnostic``, default on) is a diagnostic the loss does not use: the
  temperature-``tau`` log-ratio of the policy against the rollout policy on the trained units, 0 at
  the first update after a rollout. ``rollout/mismatch_log_ratio`` compares ``log c`` with the rollout
  policy's replayed ``logp``: 0 up to float batching with the exact sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import token_logps
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.objectives.base import OBJECTIVES, LogpUnits, Objective, StepContext
from diffusion_rl.rl.objectives.config import ObjectiveConfig
from diffusion_rl.rl.objectives.losses import masked_mean, ratio_metrics
from diffusion_rl.rl.objectives.selectors import top_k_steps
from diffusion_rl.sampling.sampler import logits_at
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.sampling.uniform_trajectory import Trajectory

NORM_EPS = 1e-4  # the public code's + 1e-4 in lambda and in each step's normaliser


@dataclass
class MDPOConfig(ObjectiveConfig):
    name: str = "mdpo"
    # the paper run's KL weight (--beta 0.02): a k2 term per masked position, weighted by the rollout
    # confidence and not by lambda (the demo recipe sets 0)
    beta: float = 0.02
    K: int = 8  # steps trained per sample: --sample_train_steps 8 of --diffusion_steps 128 in the paper run
    # log ratio/* (the policy against the rollout policy on the trained units); the loss never reads it
    ratio_diagnostic: bool = True

    def validate(self) -> None:
        super().validate()
        if self.K < 1:
            raise ConfigError("objective.K", self.K, "must be >= 1")
        if self.behaviour_correction != "none":
            raise ConfigError("objective.behaviour_correction", self.behaviour_correction,
                              "objective=mdpo takes none: its loss is the public on-policy one (the mismatch is "
                              "logged as rollout/mismatch_log_ratio)")


def mdpo_loss(
    logp: torch.Tensor,  # (N, K, L) log-probs at temperature tau of each trained step's prediction, with grad
    old_logp: torch.Tensor | None,  # (N, K, L) the rollout policy's (ratio/* only) or None
    advantages: torch.Tensor,  # (N, K, L) the step's A times the rollout confidence of each position
    mask: torch.Tensor,  # (N, K, L) the positions masked in the step's state
    cfg: MDPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MDPO's policy term, a pure function of tensors (``group_size`` and ``surrogate`` unused; the KL
    term is :func:`mdpo_kl`): per step ``-sum_i rho_i A c_i lambda / (|M| + 1e-4)``, summed over a
    sample's steps, averaged over samples."""
    m = mask.bool()
    count = m.sum(-1).to(logp.dtype)  # (N, K) |M_t|
    lam = logp.shape[-1] / (count + NORM_EPS)  # (N, K)
    ratio = torch.exp(logp - logp.detach())  # 1; carries the gradient of logp
    per_token = torch.where(m, -ratio * advantages * lam[..., None], torch.zeros_like(logp))  # (N, K, L)
    per_step = per_token.sum(-1) / (count + NORM_EPS)  # (N, K)
    loss = per_step.sum(-1).mean()
    with torch.no_grad():
        steps = (count > 0).to(logp.dtype)  # (N, K) trained steps with a masked position
        metrics = {"mdpo/lambda_mean": masked_mean(lam, steps), "mdpo/masked_per_step": masked_mean(count, steps)}
        if old_logp is not None:
            metrics.update(ratio_metrics(torch.where(m, logp - old_logp, torch.zeros_like(logp)), m.float()))
    return loss, metrics


def mdpo_kl(logp: torch.Tensor, ref_logp: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The KL term before ``beta``: per step ``sum_i c_i (logp_ref,i - logp_i)^2 / 2 / (|M| + 1e-4)``, summed
    over a sample's steps, averaged over samples. All (N, K, L); ``weight`` the confidences ``c``."""
    m = mask.bool()
    d = ref_logp.detach() - logp
    k2 = torch.where(m, weight * d * d / 2, torch.zeros_like(logp))  # (N, K, L)
    return (k2.sum(-1) / (m.sum(-1).to(logp.dtype) + NORM_EPS)).sum(-1).mean()


@dataclass
class MDPOPlan:
    """What MDPO's inner updates of one rollout share: the trained steps and their model inputs."""

    steps: torch.Tensor  # (n, K) the trained denoising steps, -1 = an unused slot
    valid: torch.Tensor  # (n, K) the slots that hold a step
    adv: torch.Tensor  # (n, K) each trained step's advantage (0 where not valid)
    states: torch.Tensor  # (n*K, P+L) the canvas before each step
    attn: torch.Tensor | None  # (n*K, P+L) attention mask, None without padding
    pred: torch.Tensor  # (n*K, L) the sampler's one-step prediction at each step
    trained: torch.Tensor  # (n*K, L) the positions still masked at the step (those the reward reads)
    conf: torch.Tensor  # (n, K, L) the rollout's confidences at the trained positions, 0 elsewhere
    rows: torch.Tensor  # (r,) the (sample, step) rows with a trained position
    tau: float  # the sampler's temperature


@OBJECTIVES.register("mdpo")
class MDPO(Objective):
    config_class = MDPOConfig
    cfg: MDPOConfig
    policy_loss = staticmethod(mdpo_loss)
    advantage_estimators: ClassVar[tuple[str, ...]] = ("mdpo",)
    needs_trajectory = True
    needs_predictions = True

    def bind(self, bundle) -> None:
        if bundle.block_size:
            raise ConfigError("model.block_size", bundle.block_size,
                              "objective=mdpo needs a masked-diffusion model (block_size 0): a block model's sampler "
                              "computes no logits outside its current block, where MDPO's one-step prediction lies")

    def needs_old_logp(self) -> bool:
        return self.cfg.ratio_diagnostic

    def old_logp_iter(self, inner_iter: int) -> int:
        """Every inner update trains the same steps on the same rows: one old forward per rollout."""
        return 0

    # ---- rollout time -------------------------------------------------------------------
    def select_steps(self, trajectory: Trajectory, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, eos_id: int, rollout_id: int,
                     run_seed: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Every recorded step, in order: the rollout rewards each one's prediction and the advantages
        choose the ``K`` trained ones (:meth:`_plan`)."""
        assert isinstance(trajectory, TrajectoryRecorder), "MDPO reads masked positions (refused on uniform noise)"
        T = trajectory.num_steps
        if self.cfg.K > T and not trajectory.variable_steps:  # decode=threshold|factor: fewer slots may be left
            raise ConfigError("objective.K", self.cfg.K, f"must be <= the sampler's steps (sampler.steps={T})")
        if not trajectory.temperature > 0:
            raise ConfigError("sampler.temperature", trajectory.temperature,
                              "must be > 0 with objective=mdpo (its loss is log softmax(logits / temperature))")
        steps = torch.arange(T, device=completion_ids.device).repeat(completion_ids.shape[0], 1)  # (n, T)
        return steps, {"mdpo/steps": float(T)}

    # ---- per rollout --------------------------------------------------------------------
    def make_plan(self, ctx: StepContext) -> MDPOPlan:
        """The trained steps of every sample and the model inputs of their (sample, step) rows, once per
        rollout (every inner update trains the same ones)."""
        ro = ctx.rollout
        traj, candidates = ro.trajectory, ro.selected_steps
        assert isinstance(traj, TrajectoryRecorder) and candidates is not None, \
            "MDPO needs the rollout's (masking) trajectory and its steps"
        adv = ro.advantages  # (n, T) one per recorded step
        slot = top_k_steps(adv.abs(), self.cfg.K)  # (n, K) index into the recorded steps, -1 = unused
        valid = slot >= 0
        steps = torch.where(valid, candidates.gather(1, slot.clamp_min(0)), -1)  # (n, K)
        n, K = steps.shape
        L = ro.completion_ids.shape[1]
        P = ro.prompt_ids.shape[1]
        states, _ = traj.states_at(steps.clamp_min(0))  # (n*K, P+L)
        pred, conf = traj.predictions_at(steps.clamp_min(0))  # (n*K, P+L) each
        trained = (states[:, P:] == traj.mask_id) & valid.reshape(-1, 1)  # (n*K, L)
        if ro.loss_mask is not None:  # only the tokens the reward reads
            trained &= ro.loss_mask.bool().repeat_interleave(K, 0)
        rows = trained.any(-1).nonzero()[:, 0]  # (r,) only rows with a trained position go through the model
        if rows.numel() == 0:  # one row with nothing to train keeps the loss on the graph (zero gradient)
            rows = rows.new_zeros(1)
        attn = None
        if not bool(ro.prompt_mask.all()):  # as the sampler: an attention mask only with padding
            attn = torch.cat([ro.prompt_mask.long(), torch.ones_like(ro.completion_ids)], 1).repeat_interleave(K, 0)
        return MDPOPlan(steps, valid, torch.where(valid, adv.gather(1, slot.clamp_min(0)), 0.0), states, attn,
                        pred[:, P:], trained, torch.where(trained, conf[:, P:], 0.0).view(n, K, L), rows,
                        traj.temperature)

    def _logps(self, forward: Forward, plan: MDPOPlan) -> torch.Tensor:
        """``log softmax(f(x_t) / (tau + eps))[xtil_t]`` at every trained position, 0 elsewhere. -> (n, K, L)"""
        n, K = plan.steps.shape
        rows, trained = plan.rows, plan.trained
        L = trained.shape[1]
        states = plan.states[rows]  # (r, P+L)
        P = states.shape[1] - L
        attn = None if plan.attn is None else plan.attn[rows]
        logits = logits_at(forward, states, slice(P, P + L), attn=attn).float()  # (r, L, V)
        logp = token_logps(logits / (plan.tau + torch.finfo(logits.dtype).eps), plan.pred[rows])  # (r, L)
        logp = torch.where(trained[rows], logp, torch.zeros_like(logp))
        return logp.new_zeros(n * K, L).index_copy(0, rows, logp).view(n, K, L)

    # ---- per inner update ---------------------------------------------------------------
    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        """The units of every trained (sample, step, position); the KL's weights are the rollout
        confidences (:meth:`kl_term` reads them as ``kl_mask``)."""
        plan = self.plan(ctx)
        n, K = plan.steps.shape
        logp = self._logps(forward, plan)
        mask = plan.trained.view(n, K, -1).to(logp.dtype)
        return LogpUnits(logp, mask, kl_logp=logp, kl_mask=plan.conf)

    def kl_term(self, policy: LogpUnits, ref: LogpUnits, gather: Callable[[torch.Tensor], torch.Tensor],
                group_size: int) -> torch.Tensor:
        assert policy.kl_mask is not None
        return mdpo_kl(gather(policy.logp), gather(ref.logp), gather(policy.kl_mask), gather(policy.mask))

    def unit_advantages(self, ctx: StepContext) -> torch.Tensor:
        """``A_t c_ti`` per unit. (n, K, L)"""
        plan = self.plan(ctx)
        return plan.adv[..., None] * plan.conf

    def sampler_units(self, ctx: StepContext) -> torch.Tensor:
        """The sampler's own ``log c`` of each trained unit: its temperature-``tau`` log-probability of the
        predicted token, from the logits it drew it with. (n, K, L), 0 where not trained"""
        conf = self.plan(ctx).conf
        return torch.where(conf > 0, conf.clamp_min(torch.finfo(conf.dtype).tiny).log(), 0.0)

    def extra_metrics(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        plan = self.plan(ctx)
        n, K = plan.steps.shape
        valid = plan.valid.float()
        trained = plan.trained.view(n, K, -1).float()
        return {
            "mdpo/selected_step_mean": masked_mean(plan.steps.float(), valid),
            "mdpo/adv_abs_selected": masked_mean(plan.adv.abs(), valid),
            "mdpo/adv_abs_mean": ctx.rollout.advantages.abs().mean(),
            "mdpo/confidence_mean": masked_mean(plan.conf, trained),
            "cost/train_forwards_per_sample": torch.tensor(plan.rows.numel() / max(n, 1)),
        }
