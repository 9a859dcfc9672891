"""MDPO: parity with a transcription of the public code (autonomousvision/mdpo @ e6ae439) on random
tensors and on the tiny model's own rollouts (values and gradients, fp32); the recorded predictions and
confidences; the step choice; the advantages' and the loss's invariants; the config errors.

The reference below is written for this test from the public files, in the same tensor operations and
order, and imports nothing of ``rl/objectives/mdpo.py`` or ``advantages.mdpo_step_gains``:
``src/open_r1/mdpo/mdpo_trainer.py`` L843-858 (advantages), L917-949 (``split_into_micro_batches``),
L733-740 (``_get_per_token_logps``), L1487-1545 (``compute_loss``, without its Dream branch: our
Dream forward undoes the logit shift itself); ``src/mdlm_generation_utils.py`` L56-102 (what the
sampler keeps per step). The public trainer backpropagates each trained step as one micro-batch of
an accumulated gradient (L1261-1308) over batches of one sample per device: the total below is the
mean over samples of the sum over each sample's steps.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import diffusion_rl.rl.rollout as rollout_mod
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, decode_completions, logits_fn
from diffusion_rl.rl.advantages import AdvantageConfig, MDPOAdvantage, MDPOAdvantageConfig
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.mdpo import MDPO, MDPOConfig, mdpo_kl, mdpo_loss
from diffusion_rl.rl.objectives.selectors import top_k_steps
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.trajectory import TrajectoryRecorder


# ======================================================================= the public code, transcribed
def ref_advantages(all_step_rewards, num_generations, diffusion_steps):
    """mdpo_trainer.py L843-858 on one process (``gather`` is the identity) holding one group."""
    all_step_advantages = torch.cat([all_step_rewards[:, 0:1], all_step_rewards[:, 1:] - all_step_rewards[:, :-1]], dim=-1) + 1
    all_step_advantages += torch.cat([(all_step_rewards[:, 1:].flip(dims=(-1,)).cumsum(dim=-1) / torch.arange(1, diffusion_steps, device=all_step_rewards.device).unsqueeze(0)).flip(dims=(-1,)), all_step_rewards[:, -1:]], dim=-1)
    gathered_all_advantages = all_step_advantages.detach().cpu()
    gathered_all_advantages = gathered_all_advantages.view(-1, num_generations, diffusion_steps)
    mean_grouped_advantages = gathered_all_advantages.mean(dim=1)
    std_grouped_advantages = gathered_all_advantages.std(dim=1)
    return (all_step_advantages.detach().cpu() - mean_grouped_advantages) / (std_grouped_advantages + 1e-4)


def ref_steps(advantages, sample_train_steps):
    """split_into_micro_batches' choice of steps on a per-device batch ``advantages`` (b, T)."""
    return [step.item() for step in torch.topk(torch.abs(advantages).sum(dim=0), k=sample_train_steps, dim=-1).indices]


def ref_per_token_logps(net, input_ids, target_ids, attention_mask, max_completion_length, temperature):
    """_get_per_token_logps with TRL's selective_log_softmax (fp32: gather - logsumexp)."""
    logits = net(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    target_ids = target_ids[:, -max_completion_length:]
    logits = logits[:, -max_completion_length:]
    logits = logits / (temperature + torch.finfo(logits.dtype).eps)
    selected = torch.gather(logits, dim=-1, index=target_ids.unsqueeze(-1)).squeeze(-1)
    return selected - torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])


def ref_compute_loss(per_token_logps, ref_per_token_logps, confidence, advantages, input_ids, mask_token_id,
                     max_completion_length, beta, epsilon=0.2, lambda_on_kl=False, confidence_on_kl=True):
    """compute_loss (num_iterations = 1). ``lambda_on_kl`` / ``confidence_on_kl=False`` are one-line
    changes of it that the parity tests must see."""
    if beta != 0.0:
        logr = ref_per_token_logps - per_token_logps
        per_token_kl = logr ** 2 / 2
    completion_mask = input_ids == mask_token_id
    completion_mask = completion_mask[:, -max_completion_length:]
    lambda_t = max_completion_length / (completion_mask.sum(dim=-1, keepdim=True) + 1e-4)
    old_per_token_logps = per_token_logps.detach()
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2) * lambda_t
    if beta != 0.0:
        kl = beta * per_token_kl
        if lambda_on_kl:
            kl = kl * lambda_t
        if not confidence_on_kl:
            kl = kl / confidence
        per_token_loss = per_token_loss + kl
    if confidence is None:
        confidence = torch.ones_like(per_token_loss)
    return (per_token_loss * completion_mask * confidence).sum() / (completion_mask.sum() + 1e-4)


def ref_total(step_losses_per_sample):
    """The accumulated gradient's loss: each step's micro-batch loss summed, averaged over the samples."""
    return sum(sum(steps) for steps in step_losses_per_sample) / len(step_losses_per_sample)


# ======================================================================= 1. parity, random tensors
def random_case(seed, groups=2, G=4, T=6, L=7, mask_id=9):
    """Per-step rewards, states (mask_id = masked), temperature-tau log-probs of every step's prediction
    under the policy and the reference, and confidences; every position's value is defined."""
    g = torch.Generator().manual_seed(seed)
    N = groups * G
    rewards = torch.randint(0, 4, (N, T), generator=g).float() / 3  # partial rewards, ties within a step
    masked = torch.rand(N, T, L, generator=g) < torch.linspace(0.9, 0.1, T)[None, :, None]  # fewer masks later
    masked[0, 2] = False  # a state with nothing masked
    states = torch.where(masked, mask_id, torch.randint(0, mask_id, (N, T, L), generator=g))
    logp = (-torch.rand(N, T, L, generator=g) * 3).requires_grad_(True)
    ref = -torch.rand(N, T, L, generator=g) * 3
    conf = torch.rand(N, T, L, generator=g) * 0.9 + 0.05
    return rewards, states, logp, ref, conf


@pytest.mark.parametrize("beta", [0.0, 0.02, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantages_steps_loss_and_gradient_equal_the_public_code_on_random_tensors(seed, beta):
    G, K, mask_id = 4, 3, 9
    rewards, states, logp, ref, conf = random_case(seed, G=G, mask_id=mask_id)
    N, T, L = states.shape

    # the public pipeline, one group per "process set", one sample per device, one micro-batch per step
    adv_ref = torch.cat([ref_advantages(rewards[g:g + G], G, T) for g in range(0, N, G)])  # (N, T)
    steps_ref = [ref_steps(adv_ref[j:j + 1], K) for j in range(N)]
    per_sample = []
    for j in range(N):
        per_sample.append([ref_compute_loss(logp[j:j + 1, s], ref[j:j + 1, s], conf[j:j + 1, s],
                                            adv_ref[j:j + 1, s:s + 1].expand(1, L), states[j:j + 1, s], mask_id, L, beta)
                           for s in steps_ref[j]])
    total_ref = ref_total(per_sample)
    (g_ref,) = torch.autograd.grad(total_ref, logp)

    # ours: the estimator, the step choice, the pure loss and KL on the chosen units
    adv, _ = MDPOAdvantage(MDPOAdvantageConfig())(rewards[:, -1], G, rewards)
    torch.testing.assert_close(adv, adv_ref, atol=1e-6, rtol=1e-6)
    steps = top_k_steps(adv.abs(), K)  # (N, K)
    assert steps.tolist() == steps_ref  # no ties in |A| at these seeds: the same steps, in the same order
    rows = torch.arange(N)[:, None]
    mask = (states[rows, steps] == mask_id).float()  # (N, K, L)
    cfg = MDPOConfig(beta=beta, K=K)
    units = logp[rows, steps]
    loss, metrics = mdpo_loss(units, None, adv[rows, steps][..., None] * conf[rows, steps], mask, cfg, group_size=G)
    if beta:
        loss = loss + beta * mdpo_kl(units, ref[rows, steps], conf[rows, steps], mask)
    (g_ours,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(total_ref.item(), abs=1e-6, rel=1e-6)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-7, rtol=1e-6)
    assert "ratio/log_mean" not in metrics  # no old log-probs: no ratio diagnostic


@pytest.mark.parametrize("change", ["lambda_on_kl", "no_confidence_on_kl"])
def test_a_one_line_change_of_the_public_loss_is_seen(change):
    """The parity above can fail: the transcription with lambda also on the KL, or the KL left
    unweighted by the confidence, differs from ours by far more than its tolerance."""
    G, K, mask_id, beta = 4, 3, 9, 0.7
    rewards, states, logp, ref, conf = random_case(0, G=G, mask_id=mask_id)
    N, T, L = states.shape
    adv = torch.cat([ref_advantages(rewards[g:g + G], G, T) for g in range(0, N, G)])
    kw = {"lambda_on_kl": True} if change == "lambda_on_kl" else {"confidence_on_kl": False}
    totals = []
    for extra in ({}, kw):
        totals.append(ref_total([[ref_compute_loss(logp[j:j + 1, s], ref[j:j + 1, s], conf[j:j + 1, s],
                                                   adv[j:j + 1, s:s + 1].expand(1, L), states[j:j + 1, s], mask_id, L,
                                                   beta, **extra)
                                  for s in ref_steps(adv[j:j + 1], K)] for j in range(N)]).item())
    steps = top_k_steps(adv.abs(), K)
    rows = torch.arange(N)[:, None]
    mask = (states[rows, steps] == mask_id).float()
    units = logp[rows, steps]
    ours = (mdpo_loss(units, None, adv[rows, steps][..., None] * conf[rows, steps], mask, MDPOConfig(beta=beta, K=K),
                      group_size=G)[0] + beta * mdpo_kl(units, ref[rows, steps], conf[rows, steps], mask)).item()
    assert ours == pytest.approx(totals[0], abs=1e-6, rel=1e-6)
    assert abs(ours - totals[1]) > 1e-2


# ======================================================================= 2. parity, real rollouts
class TextTask:
    """A reward of the decoded text, so different predictions get different rewards."""

    def __init__(self, G):
        self.cfg = SimpleNamespace(group_size=G, loss_mask="all")

    def prompt(self, item):
        return item["prompt"]

    def score(self, completions, items):
        r = torch.tensor([(sum(map(ord, c)) % 7) / 7 for c in completions])
        return r, {"text": r}

    def canvas(self, items, tokenizer, length, mask_id):
        return None  # pins nothing (Task.canvas)

    def reward_metrics(self, completions, items):
        return {}


class SpyRecorder(TrajectoryRecorder):
    """Keeps what the sampler hands its recorder at every step: the raw material of the public code."""

    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def on_step(self, step, x_before, logits, candidates, committed):
        SpyRecorder.seen.append((x_before.clone(), logits.clone(), candidates.clone()))
        super().on_step(step, x_before, logits, candidates, committed)


ITEMS = [{"prompt": "1203="}, {"prompt": "4021="}]  # one length: the public forward gets no padding


def mdpo_rollout(bundle, monkeypatch, *, G=4, steps=4, K=2, temperature=0.7, seed=6, block_length=8):
    SpyRecorder.seen = []
    monkeypatch.setattr(rollout_mod, "TrajectoryRecorder", SpyRecorder)
    obj = MDPO(MDPOConfig(K=K), OneStepEstimator(LikelihoodConfig(), bundle.mask_token_id))
    obj.bind(bundle)
    sampler = SamplerConfig(gen_length=8, block_length=block_length, steps=steps, temperature=temperature)
    engine = RolloutEngine(bundle, TextTask(G), obj, MDPOAdvantage(MDPOAdvantageConfig()), sampler, seed=seed)
    return obj, engine(ITEMS, bundle.net.eval(), rollout_id=0)


def ref_sampler_records(seen, mask_id, L, temperature):
    """What diffusion_generate keeps per step (L56-102), from the sampler's state, logits and draw:
    the input, x0 = the draw at every masked position, its confidence softmax(logits / T)[x0]."""
    inputs, results, confidence = [], [], []
    for x, logits, draw in seen:
        mask_index = x == mask_id
        inputs.append(x.clone()[:, -L:])
        p = F.softmax(logits / temperature, dim=-1)
        x0 = torch.where(mask_index, draw, x)  # the sampler's draw stands for Categorical(p).sample()
        confidence.append(torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)[:, -L:])
        results.append(x0.clone()[:, -L:])
    return inputs, results, confidence


def perturbed(net, seed=5, scale=0.05):
    new = copy.deepcopy(net)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return new


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_loss_and_gradient_equal_the_public_code_on_a_recorded_rollout(tiny_bundle, monkeypatch, beta):
    bundle, G, K, T, tau = tiny_bundle, 4, 2, 4, 0.7
    obj, ro = mdpo_rollout(bundle, monkeypatch, G=G, K=K, steps=T, temperature=tau)
    obj.cfg.beta = beta
    m = bundle.mask_token_id
    assert len(SpyRecorder.seen) == T
    assert not any(((x == m) & (d == m)).any() for x, _, d in SpyRecorder.seen)  # no mask token drawn at this seed
    ref_net, new_net = bundle.net.eval(), perturbed(bundle.net).eval()
    ctx = StepContext(ro, 0, 0, logits_fn(new_net), logits_fn(bundle.net), logits_fn(ref_net))
    ours, metrics = obj.loss(ctx)
    params = list(new_net.parameters())
    g_ours = torch.autograd.grad(ours, params)

    # the public pipeline from the sampler's raw records
    L, P, N = ro.completion_ids.shape[1], ro.prompt_ids.shape[1], ro.completion_ids.shape[0]
    inputs, results, confidence = ref_sampler_records(SpyRecorder.seen, m, L, tau)
    assert torch.equal(results[-1], ro.completion_ids)  # the last step's prediction is the completion
    step_rewards = torch.stack([TextTask(G).score(decode_completions(bundle.tokenizer, r, bundle.eos_token_id), [])[0]
                                for r in results], 1)  # (N, T)
    adv = torch.cat([ref_advantages(step_rewards[g:g + G], G, T) for g in range(0, N, G)])  # (N, T)
    torch.testing.assert_close(ro.advantages, adv, atol=1e-6, rtol=1e-6)
    per_sample = []
    for j in range(N):
        chosen = ref_steps(adv[j:j + 1], K)
        top = adv[j].abs().sort(descending=True).values
        assert top[K - 1] > top[K]  # no tie at the cut: the chosen set is defined
        losses = []
        for s in chosen:
            input_ids = torch.cat([ro.prompt_ids[j:j + 1], inputs[s][j:j + 1]], -1)
            target_ids = torch.cat([ro.prompt_ids[j:j + 1], results[s][j:j + 1]], -1)
            # the LLaDA forward ignores the attention mask, all ones here (no padding): None
            lp = ref_per_token_logps(new_net, input_ids, target_ids, None, L, tau)
            with torch.no_grad():
                ref_lp = ref_per_token_logps(ref_net, input_ids, target_ids, None, L, tau) if beta else None
            losses.append(ref_compute_loss(lp, ref_lp, confidence[s][j:j + 1], adv[j:j + 1, s:s + 1].expand(1, L),
                                           input_ids, m, L, beta))
        per_sample.append(losses)
    total = ref_total(per_sample)
    g_ref = torch.autograd.grad(total, params)
    assert ours.item() == pytest.approx(total.item(), abs=1e-6, rel=1e-6)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert metrics["ratio/log_max"].item() != 0  # the diagnostic sees the perturbed policy against the rollout's
    assert abs(metrics["rollout/mismatch_log_ratio"].item()) < 1e-5  # log c against the rollout policy's replay
    assert P > 0 and ("train/kl" in metrics) == (beta > 0)


def test_values_are_the_rewards_of_every_steps_prediction_and_the_steps_chosen_by_abs_advantage(tiny_bundle, monkeypatch):
    obj, ro = mdpo_rollout(tiny_bundle, monkeypatch, steps=4, K=3)
    traj, L = ro.trajectory, ro.completion_ids.shape[1]
    assert ro.selected_steps.tolist() == [[0, 1, 2, 3]] * 8  # every step is valued, in order
    V = torch.stack([TextTask(4).score(decode_completions(tiny_bundle.tokenizer, traj.prediction(s)[:, -L:],
                                                          tiny_bundle.eos_token_id), [])[0] for s in range(4)], 1)
    want, _ = MDPOAdvantage(MDPOAdvantageConfig())(ro.rewards, 4, V)
    torch.testing.assert_close(ro.advantages, want)
    assert "mdpo/best_minus_final" in ro.metrics and "mdpo/value_mean" in ro.metrics
    f = logits_fn(tiny_bundle.net)
    ctx = StepContext(ro, 0, 0, f, f, None)
    plan = obj.plan(ctx)
    for j in range(8):  # the K trained steps are those of largest |A|, largest first
        order = sorted(range(4), key=lambda s: (-abs(float(ro.advantages[j, s])), s))
        assert plan.steps[j].tolist() == order[:3]
    loss, metrics = obj.loss(ctx)
    assert torch.isfinite(loss) and metrics["ratio/log_max"].item() == 0  # theta = theta_old
    assert metrics["mdpo/adv_abs_selected"].item() >= metrics["mdpo/adv_abs_mean"].item()
    obj.cfg.ratio_diagnostic = False  # no old policy values at all: the same loss
    assert not obj.needs_old_logp()
    plain, plain_metrics = obj.loss(StepContext(ro, 0, 0, f, None, None))
    assert plain.item() == loss.item() and "ratio/log_max" not in plain_metrics


# ======================================================================= 3. the recorded predictions
def test_prediction_is_the_samplers_draw_in_the_block_and_the_argmax_elsewhere():
    """Two blocks and a model that often draws the mask token: inside the current block the prediction
    is the draw (the argmax over the other tokens where the draw is the mask token), outside it the
    argmax; the confidence is its probability at temperature tau; select() keeps both."""
    V, m, tau = 6, 5, 0.8
    W = torch.randn(V, V, generator=torch.Generator().manual_seed(0))

    def fwd(ids, attn):
        logits = W[ids] + torch.arange(ids.shape[1])[None, :, None] * 0.1
        logits[..., m] += 1.5  # the mask token is likely
        return logits

    ids = torch.tensor([[1, 2], [3, 4], [0, 1]])
    SpyRecorder.seen = []
    rec = SpyRecorder(m, record_greedy=False, record_prediction=True, temperature=tau)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=tau)
    out = generate(fwd, ids, None, cfg, m, RowNoise.rows(3, 0, ids.shape[0]), rec)
    drawn_masks = 0
    for s, (x, logits, draw) in enumerate(SpyRecorder.seen):
        masked = x == m
        block = torch.zeros_like(masked)
        block[:, 2 + 4 * (s // 2): 2 + 4 * (s // 2 + 1)] = True  # 2 steps per block of 4, after 2 prompt tokens
        no_mask = logits.clone()
        no_mask[..., m] = float("-inf")
        use_draw = masked & block & (draw != m)
        drawn_masks += int((masked & block & (draw == m)).sum())
        want = torch.where(use_draw, draw, torch.where(masked, no_mask.argmax(-1), x))
        assert torch.equal(rec.prediction(s), want), s
        p = (logits / tau).softmax(-1).gather(-1, want[..., None]).squeeze(-1)
        torch.testing.assert_close(rec.prediction_confidence(s), torch.where(masked, p, 0.0))
        tokens, conf = rec.predictions_at(torch.full((3, 1), s))
        assert torch.equal(tokens, want) and torch.equal(conf, rec.prediction_confidence(s))
    assert drawn_masks > 0  # the case is exercised
    sub = rec.select(torch.tensor([2, 0]))
    for s in range(4):
        assert torch.equal(sub.prediction(s), rec.prediction(s)[[2, 0]])
        assert torch.equal(sub.prediction_confidence(s), rec.prediction_confidence(s)[[2, 0]])
    masked_before = sum(int((rec.state_before(s) == m).sum()) for s in range(4))
    plain = TrajectoryRecorder(m, record_greedy=False)
    generate(fwd, ids, None, cfg, m, RowNoise.rows(3, 0, ids.shape[0]), plain)
    assert rec.nbytes() - plain.nbytes() == masked_before * (2 + 4)  # int16 tokens and float32 confidences
    assert torch.equal(plain.final, out.sequences)
    with pytest.raises(RuntimeError):
        plain.prediction(0)


def test_memory_figure_in_the_recorders_docstring():
    """MDPO's paper setting, T = 128 steps of one 512-token block: the arithmetic of the docstring."""
    V, mask_id = 50, 49
    g = torch.Generator().manual_seed(0)

    def fwd(ids, attn):
        logits = torch.randn(ids.shape[0], ids.shape[1], V, generator=g)
        logits[..., mask_id] = float("-inf")
        return logits

    cfg = SamplerConfig(gen_length=512, block_length=512, steps=128, temperature=0.4, gumbel_dtype="float32")
    sizes = []
    for record in (False, True):
        rec = TrajectoryRecorder(mask_id, record_greedy=False, record_prediction=record, temperature=0.4)
        generate(fwd, torch.zeros(1, 0, dtype=torch.long), None, cfg, mask_id, RowNoise.rows(0, 0, 1), rec)
        sizes.append(rec.nbytes())
    entries = sum(512 - 4 * s for s in range(128))  # positions still masked before each step
    assert sizes[0] == 2 * 512 + 8 * 512 + 128 * (4 + 4 + 2) == 6400
    # V fits int16 here (2 bytes per token); LLaDA's 126,464 ids need int32 (4 bytes): 264,192 B
    assert sizes[1] - sizes[0] == (2 + 4) * entries and (4 + 4) * entries == 264192


# ======================================================================= 4. invariants
def test_advantages_hand_computed_and_invariant_to_a_constant():
    values = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    adv, metrics = MDPOAdvantage(MDPOAdvantageConfig())(values[:, -1], 2, values)
    a = torch.tensor([[0 + 1 + 1.0, 1 + 1 + 1.0, 0 + 1 + 1.0], [0 + 1 + 0.5, 0 + 1 + 1.0, 1 + 1 + 1.0]])
    d = a[0] - a[1]  # with G = 2: A = +-(d / 2) / (|d| / sqrt(2) + 1e-4)
    want = torch.stack([d / 2, -d / 2]) / (d.abs() / math.sqrt(2) + 1e-4)
    torch.testing.assert_close(adv, want)
    assert metrics["mdpo/best_minus_final"] == 0.0
    r = torch.rand(12, 5, generator=torch.Generator().manual_seed(0))
    base, _ = MDPOAdvantage(MDPOAdvantageConfig())(r[:, -1], 4, r)
    shifted, _ = MDPOAdvantage(MDPOAdvantageConfig())(r[:, -1] + 3, 4, r + 3)
    torch.testing.assert_close(base, shifted, atol=1e-5, rtol=0)  # the + 1 and any constant cancel
    torch.testing.assert_close(base.view(3, 4, 5).mean(1), torch.zeros(3, 5), atol=1e-6, rtol=0)  # centred per step
    with pytest.raises(ValueError, match="every recorded step"):
        MDPOAdvantage(MDPOAdvantageConfig())(r[:, -1], 4, r, torch.zeros_like(r, dtype=torch.bool))


def test_top_k_steps_takes_the_largest_scores_with_ties_to_the_earlier_step():
    score = torch.tensor([[0.5, 2.0, 2.0, 0.1], [3.0, 0.0, 1.0, 1.0]])
    assert top_k_steps(score, 2).tolist() == [[1, 2], [0, 2]]
    assert top_k_steps(score, 6).tolist() == [[1, 2, 0, 3, -1, -1], [0, 2, 3, 1, -1, -1]]


def test_gradient_equals_the_formula_and_ratio_is_one():
    """d loss / d logp_i = [ -A c lambda + beta c (logp - ref) ] / ((|M| + 1e-4) N) on the masked units."""
    g = torch.Generator().manual_seed(3)
    N, K, L, beta = 3, 2, 5, 0.3
    logp = (-torch.rand(N, K, L, generator=g)).requires_grad_(True)
    ref = -torch.rand(N, K, L, generator=g)
    conf = torch.rand(N, K, L, generator=g)
    A = torch.randn(N, K, 1, generator=g)
    mask = (torch.rand(N, K, L, generator=g) < 0.6).float()
    mask[1, 0] = 0  # a step with nothing masked
    loss, _ = mdpo_loss(logp, logp.detach(), A * conf, mask, MDPOConfig(), group_size=1)
    kl = mdpo_kl(logp, ref, conf, mask)
    (grad,) = torch.autograd.grad(loss + beta * kl, logp)
    count = mask.sum(-1, keepdim=True)
    lam = L / (count + 1e-4)
    want = mask * (-A * conf * lam + beta * conf * (logp.detach() - ref)) / ((count + 1e-4) * N)
    torch.testing.assert_close(grad, want, atol=1e-7, rtol=1e-6)
    assert loss.item() == pytest.approx(float((mask * -A * conf * lam / (count + 1e-4)).sum() / N), rel=1e-6)
    empty, m = mdpo_loss(logp, logp.detach(), A * conf, torch.zeros_like(mask), MDPOConfig(), group_size=1)
    assert empty.item() == 0 and math.isfinite(m["mdpo/lambda_mean"].item())
    assert mdpo_kl(logp, ref, conf, torch.zeros_like(mask)).item() == 0


# ======================================================================= 5. configuration
@pytest.mark.parametrize("kwargs,key", [({"K": 0}, "objective.K"), ({"behaviour_correction": "tis"},
                                                                   "objective.behaviour_correction")])
def test_config_errors(kwargs, key):
    with pytest.raises(ConfigError) as err:
        MDPOConfig(**kwargs).validate()
    assert str(err.value).startswith(key + "=")


def test_refusals(tiny_bundle, monkeypatch):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    with pytest.raises(ConfigError, match="advantage.name"):
        MDPO(MDPOConfig(), lik).check_advantage(AdvantageConfig(name="group"))
    with pytest.raises(ConfigError, match="objective.K"):
        mdpo_rollout(tiny_bundle, monkeypatch, steps=4, K=5)
    with pytest.raises(ConfigError, match="sampler.temperature"):
        mdpo_rollout(tiny_bundle, monkeypatch, temperature=0.0)
    torch.manual_seed(0)
    block = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=4))
    with pytest.raises(ConfigError, match="model.block_size"):
        MDPO(MDPOConfig(), lik).bind(block)


def test_public_regime_and_the_testbed(tmp_path):
    from tests.helpers.common import compose_cfg

    public = compose_cfg(["objective=mdpo", "~testbed"], tmp_path)
    assert public.optim.lr == pytest.approx(7e-7) and list(public.optim.betas) == [0.9, 0.999]
    assert public.objective.beta == pytest.approx(0.02) and public.advantage.name == "mdpo"
    assert compose_cfg(["objective=mdpo"], tmp_path).optim.lr == pytest.approx(3e-4)  # conf/testbed/tiny_mdpo.yaml
    assert compose_cfg(["objective=mdpo", "optim.lr=5e-5"], tmp_path).optim.lr == pytest.approx(5e-5)
