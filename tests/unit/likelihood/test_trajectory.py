"""The trajectory likelihood (likelihood/trajectory.py): a recorded step replayed from the state the
sampler saw gives the sampler's own log-probabilities, and for a uniform-noise model the same values as
transformers' forward run step after step with its own self-conditioning logits."""

from __future__ import annotations

import torch

from diffusion_rl.likelihood.trajectory import (
    TrajectoryEstimator,
    TrajectoryLikelihoodConfig,
    replay_logps,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.sampling.entropy_bound import step_temperature
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from tests.helpers.gemma import EB, sharp_gemma
from tests.helpers.gemma import uniform_rollout as rollout


def test_every_recorded_step_replays_to_the_samplers_log_probs():
    """Two canvases, left padding, early stops: each (row, step) action's tokens replayed at the behaviour
    weights give the log-probs the sampler drew them with (float batching apart), and the estimator's
    trajectory log-likelihood is their sum."""
    b = sharp_gemma()
    ids = torch.randint(4, 100, (3, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2], ids[0, :2] = 0, 0
    traj, comp = rollout(b, ids, mask, [1, 2, 3])
    sample_, step = (traj.counts > 0).nonzero(as_tuple=True)
    fwd = logits_fn(b.net)
    with torch.no_grad():
        got = replay_logps(fwd, traj, ids, mask, comp, sample_, step)  # (M, 16)
        total = TrajectoryEstimator(TrajectoryLikelihoodConfig(), -1)(fwd, ids, mask, comp, torch.ones_like(comp), [],
                                                                      trajectory=traj)
    want = traj.position_logps(16)[sample_, step]
    assert set(traj.canvas_of) == {0, 1} and torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(total, traj.logps.sum(-1), atol=1e-3) and (total < 0).all()
    rows = torch.tensor([2, 0])  # dynamic sampling keeps some rows: their steps replay as before
    kept = traj.select(rows)
    with torch.no_grad():
        again = TrajectoryEstimator(TrajectoryLikelihoodConfig(), -1)(fwd, ids[rows], mask[rows], comp[rows],
                                                                      torch.ones_like(comp[rows]), [], trajectory=kept)
    assert torch.allclose(again, total[rows], atol=1e-4) and torch.equal(kept.final, comp[rows])


def test_the_replay_equals_transformers_forward_step_after_step():
    """One row's canvas replayed by transformers' own forward: each step fed the canvas the sampler saw and,
    as ``generate`` does, the previous step's logits over its temperature as ``self_conditioning_logits``;
    the log-probabilities of the accepted tokens at the step's temperature are the replay's."""
    b = sharp_gemma(scale=20.0)
    ids = torch.randint(4, 100, (1, 6), generator=torch.Generator().manual_seed(2))
    traj, comp = rollout(b, ids, None, [5], gen_length=8)
    fwd, hf = logits_fn(b.net), b.net.model
    previous = None
    for s in range(traj.num_steps):
        with torch.no_grad():
            logits = hf(input_ids=ids, decoder_input_ids=traj.canvas[s], self_conditioning_logits=previous).logits
            ours = replay_logps(fwd, traj, ids, torch.ones_like(ids), comp, torch.tensor([0]), torch.tensor([s]))
        T = step_temperature(EB, EB.steps - s)
        assert float(T) == traj.temperature[s]
        ref = (logits / T).log_softmax(-1).gather(-1, traj.tokens[s][..., None])[..., 0]
        ref = torch.where(traj.accepted[s], ref, torch.zeros_like(ref))
        assert torch.allclose(ours, ref, atol=1e-4), s
        previous = logits / T
    assert traj.num_steps >= 2 and traj.counts.sum() > traj.num_steps


def test_the_gradient_reaches_the_weights():
    b = sharp_gemma(scale=5.0)
    ids = torch.randint(4, 100, (2, 4), generator=torch.Generator().manual_seed(3))
    traj, comp = rollout(b, ids, None, [1, 2], gen_length=8)
    b.net.train()
    total = TrajectoryEstimator(TrajectoryLikelihoodConfig(), -1)(logits_fn(b.net), ids, torch.ones_like(ids), comp,
                                                                  torch.ones_like(comp), [], trajectory=traj)
    total.sum().backward()
    grads = [p.grad for n, p in b.net.named_parameters() if "layers.1.self_attn.q_proj" in n]
    assert grads and grads[0] is not None and grads[0].abs().sum() > 0


def test_a_masking_trajectory_sums_to_its_recorded_log_probs(tiny_bundle):
    """likelihood=trajectory on a masked model: each committed token's temperature-1 log-prob from the state
    before its step, summed (GRPO on the trajectory of any model)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (3, 5), generator=g)
    traj = TrajectoryRecorder(tiny_bundle.mask_token_id, record_greedy=False)
    tiny_bundle.net.eval()
    out = sample(tiny_bundle, ids, None, SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=0.9),
                 RowNoise([1, 2, 3]), traj)
    with torch.no_grad():
        total = TrajectoryEstimator(TrajectoryLikelihoodConfig(), tiny_bundle.mask_token_id)(
            logits_fn(tiny_bundle.net), ids, torch.ones_like(ids), out.completion, torch.ones_like(out.completion), [],
            trajectory=traj)
    assert torch.allclose(total, traj.logps.sum(-1), atol=1e-4)


def test_a_padded_masking_trajectory_counts_the_completion_up_to_eos_only(tiny_bundle):
    """Left-padded prompts replay with their attention mask (as the sampler drew them); tokens past the
    completion mask are not counted."""
    from diffusion_rl.models.policy import encode_prompts

    ids, mask = encode_prompts(tiny_bundle.tokenizer, ["1203=", "4", "0000000="])
    traj = TrajectoryRecorder(tiny_bundle.mask_token_id, record_greedy=False)
    tiny_bundle.net.eval()
    out = sample(tiny_bundle, ids, mask, SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=0.9),
                 RowNoise([1, 2, 3]), traj)
    est = TrajectoryEstimator(TrajectoryLikelihoodConfig(), tiny_bundle.mask_token_id)
    with torch.no_grad():
        total = est(logits_fn(tiny_bundle.net), ids, mask, out.completion, torch.ones_like(out.completion), [],
                    trajectory=traj)
        cmask = torch.ones_like(out.completion)
        cmask[:, 5:] = 0  # the last three tokens after an (assumed) end
        part = est(logits_fn(tiny_bundle.net), ids, mask, out.completion, cmask, [], trajectory=traj)
    assert torch.allclose(total, traj.logps.sum(-1), atol=1e-4)
    assert torch.allclose(part, (out.token_logp * cmask).sum(-1), atol=1e-4)
    assert torch.allclose(est.sampler_units(out.token_logp, cmask), (out.token_logp[:, :5]).sum(-1))
