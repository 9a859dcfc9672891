"""IGPO: inpainting-guided policy optimisation -- hinted samples for groups the policy gets all wrong.

At rollout time, for every group whose ``G`` samples are all wrong (``Task.correctness``), the
old policy samples the group again with **hints** -- chunks of the task's reference completion
(``Task.hint_reference``) fixed in the sampler's canvas -- and up to ``max_replacements`` rows of the
group (its first ones) are replaced by correct hinted samples; a hinted group stays all wrong when
none is correct. Row ``j`` of a group reveals a share ``f_j`` of the reference's chunks, the ``G``
shares drawn from U[hint_frac_low, hint_frac_high] and sorted; the last ``free_tail`` canvas
positions never hold a hint. The loss is GSPO's sequence ratio with PPO's clip, per token::

    rho_i = exp(mean over the L completion positions of (logp - logp_old))
    loss  = group token mean over the kept units of -min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps_high) A_i)
            + beta * (the same mean of k3(logp, logp_ref))

with ``A = r - mean_G(r)`` (``advantage=group``) and the one-step estimator (completion fully masked;
the public run keeps the prompt clear). The kept units are the completion's tokens except hint tokens: of a row's hint tokens
only the ``hint_entropy_keep`` share (at least one) where the old policy's predictive entropy
(completion masked) is highest count (:func:`entropy_filter`).

Source: Zhao et al. 2025, "Inpainting-Guided Policy Optimization for Diffusion Large Language
Models"; facebookresearch/igpo @ e85eaea. ``trainer_igpo.py``: loss ``compute_loss`` L593-686 (the
released run, ``run_igpo.sh``, sets ``use_gspo=true``: the sequence ratio, not the token-level one of
the other branch; ``epsilon_low = epsilon_high = 0.2``, ``beta = 0.01``, ``num_iterations = 4``,
``temperature = 1.2``, ``max_replacements = 4``, ``entropy_clipping_ratio_inpaint = 0.2``, hint shares
U[0.2, 0.6], chunks of 5-10 tokens; ``train.yaml``: ``p_mask_prompt = 0``); masking and entropy
L955-1155 (``d1_masking=true``: every iteration masks the whole completion); the all-wrong rescue and
row replacement L1415-1682; advantages ``rewards - mean`` L1904-1921; the entropy filter L1764-1827.
``utils/generate.py``: the hinted canvas ``create_spacing_scaled_inpainting_sequence`` L473-668 and
``scale_chunk_positions`` L671-725 (chunk gaps stretched by ``clamp(free / len, 1, 1.5)``, each gap
capped at ``max_spacing`` = 100, the last chunk always shown, the final 30 positions free).

Deviations from the public code:

- the all-wrong test is per group; the public code tests its whole per-device batch, which its run
  makes one group (8 rows per device, ``num_generations`` 8); correctness is the task's
  (``Task.correctness``: the correctness reward at full value; Sudoku: every empty cell right), where
  the public one reads its correctness reward at 3.0;
- the public code cannot run as released with one inner iteration (``num_iterations=1`` leaves the
  masked-position mask and the entropies undefined, L1813); here the entropies always come from the
  old policy at rollout time, and ``mu=1`` follows the same math (the ratio is then 1);
- units: the public mask counts every completion position the forward masked, past the first EOS
  too; here the completion up to its first EOS (``Rollout.scored_mask``, as every objective). The
  sequence ratio averages all ``L`` positions as in the public code, a task's pinned tokens
  (``Task.pinned_completion``, context the public code has none of) contributing log-ratio 0;
- hints are placed by the same rule from the project's own seeded generators (``mix_seed`` of the
  run seed, the rollout and the global row or group), not the global RNG; a task whose reference
  is one token per position (Sudoku) keeps each hint at its own position (no stretching);
- a hinted sample's hint positions exclude a task's pinned tokens (Sudoku's givens are pinned in
  every row already); the hinted samples' sampler log-probs and rewards replace the row's;
- regime left to the other config groups: the released run samples at temperature 1.2 and masks no
  prompt token (``train.yaml``: ``p_mask_prompt: 0``); here the sampler's temperature and the
  one-step estimator's ``p_mask_prompt`` (0.15, d1's) are their groups' settings, and
  ``sampler.temperature=1.2 likelihood.p_mask_prompt=0`` is the public regime. The entropies of the
  filter are always taken with the prompt clear, as the public code takes them;
- the KL is aggregated on its own (``Objective.kl_term``, the same units and mean: the same value).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.seeding import mix_seed
from diffusion_rl.likelihood.base import show_pinned
from diffusion_rl.models.policy import Forward
from diffusion_rl.rl.batch import Rollout
from diffusion_rl.rl.objectives.base import (
    OBJECTIVES,
    LogpUnits,
    Objective,
    RolloutTools,
    StepContext,
)
from diffusion_rl.rl.objectives.config import ObjectiveConfig, check_clip
from diffusion_rl.rl.objectives.losses import agg_loss, clipped_surrogate, ratio_metrics
from diffusion_rl.sampling.sampler import completion_mask

_FRAC_SALT, _CHUNK_SALT, _PICK_SALT = 0x1690, 0x1691, 0x1692


@dataclass
class IGPOConfig(ObjectiveConfig):
    name: str = "igpo"
    mu: int = 4  # num_iterations of the released run
    beta: float = 0.01
    eps: float = 0.2  # epsilon_low
    eps_high: float = 0.2  # epsilon_high
    # each hinted row reveals this share of the reference's chunks, drawn uniformly per row
    hint_frac_low: float = 0.2
    hint_frac_high: float = 0.6
    free_tail: int = 30  # final canvas positions that never hold a hint
    min_chunk: int = 5  # chunk sizes of the reference, in tokens
    max_chunk: int = 10
    max_spacing: int = 100  # cap of a stretched gap between two hint chunks
    max_replacements: int = 4  # rows of an all-wrong group a correct hinted sample may replace
    hint_entropy_keep: float = 0.2  # share of a row's hint tokens the loss keeps, highest entropy first

    def validate(self) -> None:
        super().validate()
        check_clip(self.eps, self.eps_high)
        if not 0 <= self.hint_frac_low <= self.hint_frac_high <= 1:
            raise ConfigError("objective.hint_frac_high", self.hint_frac_high,
                              f"needs 0 <= hint_frac_low ({self.hint_frac_low}) <= hint_frac_high <= 1")
        if self.free_tail < 0:
            raise ConfigError("objective.free_tail", self.free_tail, "must be >= 0")
        if not 1 <= self.min_chunk <= self.max_chunk:
            raise ConfigError("objective.max_chunk", self.max_chunk, f"needs 1 <= min_chunk ({self.min_chunk}) <= max_chunk")
        if self.max_spacing < 0:
            raise ConfigError("objective.max_spacing", self.max_spacing, "must be >= 0")
        if self.max_replacements < 0:
            raise ConfigError("objective.max_replacements", self.max_replacements, "must be >= 0")
        if not 0 < self.hint_entropy_keep <= 1:
            raise ConfigError("objective.hint_entropy_keep", self.hint_entropy_keep, "must be in (0, 1]")


# ---- the loss -------------------------------------------------------------------------------
def igpo_loss(
    logp: torch.Tensor,  # (B, L) every completion position, with grad
    old_logp: torch.Tensor,  # (B, L) no grad
    advantages: torch.Tensor,  # (B, 1)
    mask: torch.Tensor,  # (B, L) the kept units (entropy_filter)
    cfg: IGPOConfig,
    *,
    group_size: int,
    surrogate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The sequence-ratio clipped surrogate, a token mean over each group's kept units, then over groups;
    pure function of tensors (``surrogate`` is not used)."""
    seq_log_ratio = (logp - old_logp.detach()).mean(-1, keepdim=True)  # (B, 1) over all L positions
    log_ratio = seq_log_ratio.expand_as(logp)  # (B, L)
    per_unit, low, high = clipped_surrogate(log_ratio, advantages, cfg.eps, cfg.eps_high)  # (B, L) each
    return agg_loss(per_unit, mask, "group-token-mean", group_size), ratio_metrics(log_ratio, mask, low, high)


def entropy_filter(mask: torch.Tensor, hints: torch.Tensor | None, entropy: torch.Tensor | None,
                   keep: float) -> torch.Tensor:
    """``mask`` (B, L) without the hint tokens outside each row's ``keep`` share (at least one) of highest
    ``entropy`` among its counted hint tokens; the other tokens as they are. ``hints`` None: unchanged."""
    if hints is None:
        return mask
    assert entropy is not None
    out = mask.clone()
    candidates = mask.bool() & hints  # (B, L)
    for b in candidates.any(-1).nonzero()[:, 0].tolist():
        where = candidates[b].nonzero()[:, 0]  # (c,)
        top = torch.topk(entropy[b, where], max(1, int(where.numel() * keep))).indices
        dropped = torch.ones_like(where, dtype=torch.bool)
        dropped[top] = False
        out[b, where[dropped]] = 0
    return out


# ---- hints ----------------------------------------------------------------------------------
def hint_chunks(n_ref: int, length: int, frac: float, cfg: IGPOConfig, rng: random.Random,
                positional: bool) -> list[tuple[int, int, int]]:
    """``(reference start, canvas start, size)`` of each chunk a hinted row shows.

    The first ``min(n_ref, length - free_tail)`` reference tokens are cut into chunks of
    ``randint(min_chunk, max_chunk)`` (a shorter remainder is dropped); ``int(chunks * (1 - frac))`` of
    them, drawn at random, are hidden, the last one always shown. Shown chunks keep their order; their
    gaps stretch by ``clamp(free / n_ref, 1, 1.5)`` (each capped at ``max_spacing``) unless
    ``positional``, and a chunk past the free area is cut there."""
    free = max(0, length - cfg.free_tail)
    n = min(n_ref, free)
    if n == 0:
        return []
    chunks, i = [], 0
    while i < n:
        size = min(rng.randint(cfg.min_chunk, cfg.max_chunk), n - i)
        if size < cfg.min_chunk:
            break
        chunks.append((i, i + size))
        i += size
    hidden_n = int(len(chunks) * (1 - frac))
    hidden = set(rng.sample(chunks, min(hidden_n, len(chunks)))) if hidden_n > 0 else set()
    shown = [c for k, c in enumerate(chunks) if c not in hidden or k == len(chunks) - 1]
    scale = 1.0 if positional else min(1.5, max(1.0, free / n_ref))
    out: list[tuple[int, int, int]] = []
    for k, (s, e) in enumerate(shown):
        if positional:
            start = s
        elif k == 0:
            start = int(s * scale)
        else:
            start = out[-1][1] + out[-1][2] + min(int((s - shown[k - 1][1]) * scale), cfg.max_spacing)
        size = min(e - s, free - start)
        if size <= 0:
            break
        out.append((s, start, size))
    return out


def hint_canvas(reference: list[int], start: torch.Tensor, mask_id: int, frac: float, cfg: IGPOConfig,
                rng: random.Random, positional: bool) -> torch.Tensor:
    """``start`` (L,) (the task's canvas: pinned tokens, the mask id elsewhere) with a hinted row's
    reference chunks written into its masked positions (:func:`hint_chunks`)."""
    canvas = start.clone()
    for s, c, size in hint_chunks(len(reference), start.shape[0], frac, cfg, rng, positional):
        tokens = torch.tensor(reference[s:s + size], dtype=canvas.dtype)
        free = canvas[c:c + size] == mask_id
        canvas[c:c + size] = torch.where(free, tokens, canvas[c:c + size])
    return canvas


def replacement_plan(correct: torch.Tensor, max_replacements: int, gen: torch.Generator) -> list[int]:
    """The hinted rows that replace a group's rows ``0, 1, ...`` in order: its correct hinted rows
    (``correct`` (G,) bool), a random ``max_replacements`` of them when there are more."""
    rows = correct.nonzero()[:, 0]
    if rows.numel() > max_replacements:
        rows = rows[torch.randperm(rows.numel(), generator=gen)[:max_replacements]]
    return rows.tolist()


def masked_entropy(forward: Forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                   completion_ids: torch.Tensor, pinned: torch.Tensor | None, mask_id: int) -> torch.Tensor:
    """(B, L) ``-sum_v p log(p + 1e-8)`` of the policy's prediction at each completion position, the
    completion masked (pinned tokens shown) and the prompt clear: the one-step estimator's input."""
    P = prompt_ids.shape[1]
    noisy = show_pinned(torch.full_like(completion_ids, mask_id), completion_ids, pinned)  # (B, L)
    ids = torch.cat([prompt_ids, noisy], 1)
    attn = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1)
    probs = forward(ids, attn)[:, P:].float().softmax(-1)  # (B, L, V)
    return -(probs * torch.log(probs + 1e-8)).sum(-1)


def reference_ids(task: Any, item: dict[str, Any], tokenizer: Any) -> tuple[list[int], bool]:
    """The item's reference completion as token ids, and whether it is one token per position."""
    ref = task.hint_reference(item)
    if isinstance(ref, str):
        return list(tokenizer.encode(ref, add_special_tokens=False)), False
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in ref]
    for text, one in zip(ref, ids, strict=True):
        if len(one) != 1:
            raise ConfigError("task.hint_reference", text, f"a positional hint is one token; the tokenizer makes {len(one)}")
    return [int(one[0]) for one in ids], True


# ---- the objective --------------------------------------------------------------------------
@dataclass
class IGPOPlan:
    """What IGPO's inner updates of one rollout share."""

    hints: torch.Tensor | None  # (n, L) bool the hint tokens of the hinted rows (Rollout.extras); None: no row has any
    kept: torch.Tensor  # (n, L) the units the loss counts: the scored completion, hint tokens by entropy_filter


@OBJECTIVES.register("igpo")
class IGPO(Objective):
    config_class = IGPOConfig
    cfg: IGPOConfig
    policy_loss = staticmethod(igpo_loss)
    advantage_estimators: ClassVar[tuple[str, ...]] = ("group", "group_std", "loo")
    kl_agg = "group-token-mean"  # the public code adds beta * k3 per token before the token mean

    def __init__(self, cfg: IGPOConfig, likelihood):
        super().__init__(cfg, likelihood)
        if not likelihood.per_token:
            raise ConfigError("likelihood.name", type(likelihood).__name__,
                              "IGPO needs per-token log-probs (likelihood=one_step)")

    def revise_rollout(self, ro: Rollout, tools: RolloutTools) -> tuple[Rollout, dict[str, float]]:
        """Resample every all-wrong group with hints and replace up to ``max_replacements`` of its rows by
        correct hinted samples; attach the hint positions and the old policy's entropies (``Rollout.extras``:
        ``hints`` (n, L) bool, ``hint_entropy`` (n, L); none when no row was replaced)."""
        c, G, n, L = self.cfg, ro.group_size, ro.completion_ids.shape[0], ro.completion_ids.shape[1]
        if n % G or ro.shard.offset % G:
            raise ConfigError("task.group_size", G, f"IGPO needs each process's {n} rows in whole groups")
        correct = torch.tensor(tools.task.correctness(ro.texts, ro.items), dtype=torch.bool)  # (n,)
        wrong = (~correct.view(-1, G)).all(-1).nonzero()[:, 0].tolist()  # all-wrong groups
        metrics = {"igpo/all_wrong_frac": len(wrong) / (n // G), "igpo/hinted_correct_frac": 0.0,
                   "igpo/replaced_frac": 0.0, "igpo/rescued_frac": 0.0}
        if not wrong:
            return ro, metrics
        comp, texts = ro.completion_ids.clone(), list(ro.texts)
        rewards = ro.rewards.clone()
        components = {k: v.clone() for k, v in ro.reward_components.items()}
        sampler_logp = None if ro.sampler_logp is None else ro.sampler_logp.clone()
        hints = torch.zeros(n, L, dtype=torch.bool, device=comp.device)
        hinted_correct = replaced = rescued = 0
        for g in wrong:
            rows = range(g * G, (g + 1) * G)
            canvas, hinted = self._hinted_canvas(ro, tools, g, rows)  # (G, L) each
            h_comp, h_logp = tools.sample(g * G, canvas)
            h_texts = tools.decode(h_comp)
            items = [ro.items[r] for r in rows]
            h_rewards, h_components = tools.score(h_comp, h_texts, items)
            h_correct = torch.tensor(tools.task.correctness(h_texts, items), dtype=torch.bool)
            gen = torch.Generator().manual_seed(mix_seed(tools.run_seed, ro.rollout_id, _PICK_SALT, ro.shard.offset + g * G))
            plan = replacement_plan(h_correct, c.max_replacements, gen)
            hinted_correct += int(h_correct.sum())
            replaced += len(plan)
            rescued += bool(plan)
            for i, src in enumerate(plan):
                dst = g * G + i
                comp[dst] = h_comp[src].to(comp)
                texts[dst] = h_texts[src]
                rewards[dst] = h_rewards[src].to(rewards)
                for k in components:
                    components[k][dst] = h_components[k][src]
                if sampler_logp is not None:
                    sampler_logp[dst] = h_logp[src].to(sampler_logp)
                hints[dst] = hinted[src].to(hints.device)
        metrics.update({"igpo/hinted_correct_frac": hinted_correct / (len(wrong) * G),
                        "igpo/replaced_frac": replaced / n, "igpo/rescued_frac": rescued / (n // G)})
        if not replaced:
            return ro, metrics
        eos = completion_mask(comp, tools.eos_id)
        entropy = torch.zeros(n, L, device=comp.device)
        rows_hinted = hints.any(-1)
        pinned = None if ro.pinned is None else ro.pinned[rows_hinted]
        entropy[rows_hinted] = masked_entropy(tools.old_policy, ro.prompt_ids[rows_hinted], ro.prompt_mask[rows_hinted],
                                              comp[rows_hinted], pinned, tools.mask_id).to(entropy)
        return replace(ro, completion_ids=comp, completion_mask=eos, texts=texts, rewards=rewards, all_rewards=rewards,
                       advantages=rewards, reward_components=components, sampler_logp=sampler_logp,
                       extras={**ro.extras, "hints": hints, "hint_entropy": entropy}), metrics

    def _hinted_canvas(self, ro: Rollout, tools: RolloutTools, g: int, rows: range) -> tuple[torch.Tensor, torch.Tensor]:
        """The canvases of group ``g``'s hinted resample (G, L) and their hint positions (G, L) bool."""
        c, L = self.cfg, ro.completion_ids.shape[1]
        start = torch.full((L,), tools.mask_id, dtype=torch.long)
        gen = torch.Generator().manual_seed(mix_seed(tools.run_seed, ro.rollout_id, _FRAC_SALT, ro.shard.offset + g * len(rows)))
        fracs = (torch.rand(len(rows), generator=gen) * (c.hint_frac_high - c.hint_frac_low) + c.hint_frac_low).sort().values
        canvases = []
        for j, r in enumerate(rows):
            base = start if ro.pinned is None else torch.where(ro.pinned[r].cpu(), ro.completion_ids[r].cpu(), start)
            ref, positional = reference_ids(tools.task, ro.items[r], tools.tokenizer)
            rng = random.Random(mix_seed(tools.run_seed, ro.rollout_id, _CHUNK_SALT, ro.shard.offset + r))
            canvases.append(hint_canvas(ref, base, tools.mask_id, float(fracs[j]), c, rng, positional))
        canvas = torch.stack(canvases)  # (G, L)
        pinned = torch.zeros_like(canvas, dtype=torch.bool) if ro.pinned is None else ro.pinned[rows.start:rows.stop].cpu()
        return canvas, (canvas != tools.mask_id) & ~pinned

    def make_plan(self, ctx: StepContext) -> IGPOPlan:
        ro = ctx.rollout
        hints, entropy = ro.extras.get("hints"), ro.extras.get("hint_entropy")
        return IGPOPlan(hints, entropy_filter(ro.scored_mask, hints, entropy, self.cfg.hint_entropy_keep))

    def logp_units(self, ctx: StepContext, forward: Forward, role: str) -> LogpUnits:
        ro = ctx.rollout
        logp = self.likelihood(forward, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.scored_mask,
                               self.mask_seeds(ctx, role), pinned=ro.pinned)  # (n, L)
        if ro.pinned is not None:  # a pinned token is context: log-ratio 0 in the sequence mean
            logp = logp.masked_fill(ro.pinned, 0.0)
        return LogpUnits(logp, self.plan(ctx).kept)

    def extra_metrics(self, ctx: StepContext) -> dict[str, torch.Tensor]:
        plan: IGPOPlan = self.plan(ctx)
        if plan.hints is None:
            return {}
        hint = ctx.rollout.scored_mask.bool() & plan.hints
        kept = plan.kept.bool() & plan.hints
        return {"igpo/hint_keep_frac": kept.sum() / hint.sum().clamp_min(1)}

