"""EGSPO: trajectory recording and reconstruction, step selectors, stepwise likelihood, losses."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.likelihood.stepwise import stepwise_logps
from diffusion_rl.models.policy import decode_completions, encode_prompts, logits_fn
from diffusion_rl.rl.advantages import ADVANTAGES, StepwiseAdvantage, StepwiseConfig
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.egspo import EGSPO, EGSPOConfig, last_content_step, slice_slots
from diffusion_rl.rl.objectives.egspo_sa import EGSPOSA, EGSPOSAConfig
from diffusion_rl.rl.objectives.grpo import grpo_loss
from diffusion_rl.rl.objectives.selectors import SELECTORS, steps_up_to
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.trajectory import TrajectoryRecorder

PROMPTS = ["1203=", "40", "0000000=", "12"]  # different lengths: left padding is exercised


class Spy:
    """Keeps what the sampler passes to a recorder, for comparison."""

    def __init__(self, inner):
        self.inner, self.x, self.committed, self.drawn_masks = inner, [], [], 0

    def on_step(self, step, x_before, logits, candidates, committed):
        self.x.append(x_before.clone())
        # a drawn mask token is no commit: the position stays masked
        self.committed.append(committed & (candidates != self.inner.mask_id))
        self.drawn_masks += int((committed & (candidates == self.inner.mask_id)).sum())
        self.inner.on_step(step, x_before, logits, candidates, committed)


def _rollout(bundle, prompts=PROMPTS, steps=4, record_greedy=True, seed=1):
    ids, mask = encode_prompts(bundle.tokenizer, prompts)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=steps, temperature=0.9)
    fwd = logits_fn(bundle.net.eval())
    rec = TrajectoryRecorder(bundle.mask_token_id, record_greedy=record_greedy)
    spy = Spy(rec)
    out = generate(fwd, ids, mask, cfg, bundle.mask_token_id, RowNoise.rows(seed, 0, ids.shape[0]), spy)
    attn = torch.cat([mask, torch.ones_like(out.completion)], 1)
    return fwd, ids, mask, attn, out, rec, spy


def test_sampler_entropy_equals_the_trajectory_records(tiny_bundle):
    """train/entropy comes from the sampler's own per-row sums; the trajectory's per-step means agree."""
    ids, mask = encode_prompts(tiny_bundle.tokenizer, PROMPTS)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.9)
    rec = TrajectoryRecorder(tiny_bundle.mask_token_id)
    # a seed at which no row draws the mask token itself (which the recorder does not count as a
    # commit: test_drawn_mask_tokens_stay_masked_in_the_reconstruction)
    out = generate(logits_fn(tiny_bundle.net.eval()), ids, mask, cfg, tiny_bundle.mask_token_id,
                   RowNoise.rows(4, 0, ids.shape[0]), rec)
    assert out.num_committed.tolist() == [8] * 4 and rec.counts.sum(-1).tolist() == [8] * 4
    per_row = (rec.entropies * rec.counts.float()).sum(-1)  # (B,)
    assert torch.allclose(out.entropy_sum.float(), per_row, rtol=1e-5) and bool((per_row > 0).all())


def test_recorded_values_match_a_separate_forward_on_reconstructed_states(tiny_bundle):
    fwd, ids, mask, attn, out, rec, spy = _rollout(tiny_bundle)
    assert rec.num_steps == 4 and rec.logps.shape == rec.entropies.shape == (4, 4)
    _check_against_a_new_forward(fwd, ids, attn, out, rec, spy, tiny_bundle.mask_token_id)


def test_drawn_mask_tokens_stay_masked_in_the_reconstruction():
    """A model that often draws the mask token itself: reconstruction and records still agree."""
    V, m = 6, 5
    g = torch.Generator().manual_seed(0)
    W = torch.randn(V, V, generator=g)

    def fwd(ids, attn):  # deterministic in the input, so a second forward reproduces the logits
        logits = W[ids] + torch.arange(ids.shape[1])[None, :, None] * 0.1
        logits[..., m] += 1.5  # the mask token is likely
        return logits

    ids = torch.tensor([[1, 2], [3, 4]])
    rec = TrajectoryRecorder(m)
    spy = Spy(rec)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0)
    out = generate(fwd, ids, None, cfg, m, RowNoise.rows(3, 0, ids.shape[0]), spy)
    assert spy.drawn_masks > 0  # the case is exercised
    _check_against_a_new_forward(fwd, ids, None, out, rec, spy, m)


def _check_against_a_new_forward(fwd, ids, attn, out, rec, spy, m):
    T = rec.num_steps
    # reconstruction: the exact states the sampler was in, and the two ends
    for s in range(T):
        assert torch.equal(rec.state_before(s), spy.x[s])
        assert torch.equal(rec.commit_step.long() == s, spy.committed[s])
    assert torch.equal(rec.state_before(0)[:, : ids.shape[1]], ids)
    assert (rec.state_before(0)[:, ids.shape[1]:] == m).all()
    assert torch.equal(rec.state_before(T), out.sequences)
    assert torch.equal(rec.final, out.sequences)
    for s in range(T):
        state = rec.state_before(s)
        committed = rec.commit_step.long() == s
        with torch.no_grad():
            logits = fwd(state, attn)  # a new forward, not the sampler's
        logp = logits.log_softmax(-1)
        tok = logp.gather(-1, out.sequences[..., None]).squeeze(-1)  # (B, T)
        ent = -(logp.exp() * logp).sum(-1)
        want_lp = (tok * committed).sum(-1)
        want_ent = (ent * committed).sum(-1) / committed.sum(-1).clamp_min(1)
        assert torch.allclose(rec.logps[:, s], want_lp, atol=1e-4), s
        assert torch.allclose(rec.entropies[:, s], want_ent, atol=1e-4), s
        assert torch.equal(rec.counts[:, s].long(), committed.sum(-1))
        # greedy completion = argmax fill of every still-masked position
        no_mask = logits.clone()
        no_mask[..., m] = float("-inf")
        want_greedy = torch.where(state == m, no_mask.argmax(-1), state)
        assert torch.equal(rec.greedy_completion(s), want_greedy), s
        assert (rec.greedy_completion(s) != m).all()
        # the stepwise likelihood on the batched states agrees with the recording
        with torch.no_grad():
            lp = stepwise_logps(fwd, state, attn, committed, out.sequences)
            lp_mean = stepwise_logps(fwd, state, attn, committed, out.sequences, reduce="mean")
        assert torch.allclose(lp, rec.logps[:, s], atol=1e-4)
        assert torch.allclose(lp_mean, rec.logps[:, s] / committed.sum(-1).clamp_min(1), atol=1e-4)


def test_states_at_gathers_per_sample_steps(tiny_bundle):
    *_, rec, spy = _rollout(tiny_bundle, record_greedy=False)
    steps = torch.tensor([[3, 0], [1, 2], [0, 0], [2, 3]])
    states, committed = rec.states_at(steps)
    assert states.shape[0] == 8
    for b in range(4):
        for k in range(2):
            assert torch.equal(states[2 * b + k], spy.x[steps[b, k]][b])
            assert torch.equal(committed[2 * b + k], spy.committed[steps[b, k]][b])
    with pytest.raises(RuntimeError):
        rec.greedy_completion(0)  # not recorded for plain EGSPO


def test_memory_figure_in_docstring():
    """T=128, L=256, blocks of 32 (2 tokens per step): the arithmetic of the module docstring."""
    V, mask_id = 50, 49
    g = torch.Generator().manual_seed(0)

    def fwd(ids, attn):
        logits = torch.randn(ids.shape[0], ids.shape[1], V, generator=g)
        logits[..., mask_id] = float("-inf")
        return logits

    rec = TrajectoryRecorder(mask_id)
    cfg = SamplerConfig(gen_length=256, block_length=32, steps=128, temperature=1.0, gumbel_dtype="float32")
    generate(fwd, torch.zeros(1, 0, dtype=torch.long), None, cfg, mask_id, RowNoise.rows(0, 0, 1), rec)
    greedy_entries = sum(256 - 2 * s for s in range(128))  # still-masked positions before each step
    # V fits int16 here (2 bytes per greedy token); LLaDA's 126,464 ids need int32 (4 bytes): 69,888 B
    assert rec.nbytes() == 2 * 256 + 8 * 256 + 128 * (4 + 4 + 2) + 2 * greedy_entries
    assert rec.nbytes() - 2 * greedy_entries + 4 * greedy_entries == 69888


# ---- selectors ----------------------------------------------------------------------------
def test_entropy_selector_picks_highest_entropy_steps():
    H = torch.tensor([[0.1, 0.9, 0.3, 0.8, 0.2, 0.7], [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    idx = SELECTORS.get("entropy")(H, 3)
    assert idx.tolist() == [[1, 3, 5], [0, 1, 2]]  # highest first: slot k = k-th highest entropy
    cand = steps_up_to(torch.tensor([2, 5]), 6)
    assert SELECTORS.get("entropy")(H, 3, cand).tolist() == [[1, 2, 0], [0, 1, 2]]
    # fewer candidates than K: unused slots are -1
    assert SELECTORS.get("entropy")(H, 3, steps_up_to(torch.tensor([1, 0]), 6)).tolist() == [[1, 0, -1], [0, -1, -1]]


@pytest.mark.parametrize("name", ["random", "uniform"])
def test_random_and_uniform_include_the_last_step(name):
    H = torch.rand(16, 32, generator=torch.Generator().manual_seed(0))
    for K in (1, 4, 8):
        idx = SELECTORS.get(name)(H, K, None, torch.Generator().manual_seed(K))
        assert idx.shape == (16, K)
        assert (idx[:, -1] == 31).all()
        assert all(len(set(r)) == K for r in idx.tolist())  # distinct steps
        assert (idx[:, 1:] > idx[:, :-1]).all()  # step order
    last = torch.arange(16) + 10
    idx = SELECTORS.get(name)(H, 4, steps_up_to(last, 32), torch.Generator().manual_seed(0))
    assert torch.equal(idx[:, -1], last) and (idx <= last[:, None]).all()
    if name == "uniform":
        assert SELECTORS.get(name)(torch.zeros(1, 128), 8).tolist() == [[15, 31, 47, 63, 79, 95, 111, 127]]
    else:
        a = SELECTORS.get(name)(H, 4, None, torch.Generator().manual_seed(3))
        b = SELECTORS.get(name)(H, 4, None, torch.Generator().manual_seed(3))
        c = SELECTORS.get(name)(H, 4, None, torch.Generator().manual_seed(4))
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_stop_at_last_content_uses_the_last_step_before_eos():
    """Hand-built trajectory: prompt of 1 token, 4 completion tokens committed one per step."""
    M, EOS, A, B = 9, 2, 5, 6
    rec = TrajectoryRecorder(M)
    order = [(1, A), (2, EOS), (3, B), (4, EOS)]  # (position, token) committed at steps 0..3
    x = torch.tensor([[7, M, M, M, M]])
    for s, (pos, tok) in enumerate(order):
        committed = torch.zeros(1, 5, dtype=torch.bool)
        committed[0, pos] = True
        cand = torch.full((1, 5), tok)
        rec.on_step(s, x.clone(), torch.randn(1, 5, 10), cand, committed)
        x = torch.where(committed, cand, x)
    comp = x[:, 1:]
    cmask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert last_content_step(rec, comp, cmask, EOS).tolist() == [0]  # 'A' at step 0; 'B' after the EOS is not text
    comp = torch.tensor([[EOS, A, B, EOS]])  # empty answer: the step that placed the EOS
    rec.final[0, 1:] = comp
    cmask = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert last_content_step(rec, comp, cmask, EOS).tolist() == [0]
    rec.commit_step[0, 1:] = torch.tensor([2, 0, 1, 3], dtype=torch.int16)
    assert last_content_step(rec, comp, cmask, EOS).tolist() == [2]


# ---- pure math ----------------------------------------------------------------------------
def _step_loss(logp, old, adv, mask=None):
    """EGSPO's per-step loss: GRPO's clipped surrogate with EGSPO's clip range, advantages per step."""
    mask = torch.ones_like(logp) if mask is None else mask
    return grpo_loss(logp, old, adv, mask, EGSPOConfig(eps=0.2, eps_high=0.5), group_size=1)


def test_step_loss_hand_computed_and_clipping_on_both_sides():
    # inside the clip range: -mean(rho * A), gradient -rho * A / n
    logp = torch.tensor([[0.1, -0.1]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]])
    loss, m = _step_loss(logp, torch.zeros(1, 2), adv)
    assert loss.item() == pytest.approx(-(math.exp(0.1) * 1 - math.exp(-0.1) * 2) / 2, rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-math.exp(0.1) / 2, math.exp(-0.1)]]), atol=1e-6)
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    # A > 0, rho = 2 > 1 + eps_high: clipped at 1.5, no gradient
    logp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    loss, m = _step_loss(logp, torch.zeros(1, 1), torch.tensor([[1.0]]))
    assert loss.item() == pytest.approx(-1.5)
    loss.backward()
    assert logp.grad.item() == 0 and m["ratio/clip_frac_high"].item() == 1
    # A < 0, rho = 0.5 < 1 - eps: clipped at 0.8, no gradient
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = _step_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]))
    assert loss.item() == pytest.approx(0.8)
    loss.backward()
    assert logp.grad.item() == 0 and m["ratio/clip_frac_low"].item() == 1
    # A > 0, rho = 0.5 below the range: not clipped (the min keeps rho * A)
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, _ = _step_loss(logp, torch.zeros(1, 1), torch.tensor([[1.0]]))
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-0.5)


def test_step_loss_ignores_unused_slots():
    logp = torch.tensor([[0.0, 0.0], [0.3, 7.0]])
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    valid = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = _step_loss(logp, torch.zeros(2, 2), adv, valid)
    assert loss.item() == pytest.approx((-1.0 - 1.0 - 2 * math.exp(0.3)) / 3)  # the unused slot is ignored
    assert EGSPOConfig().agg == "token-mean"  # the mean over the (sample, step) units of the update
    assert m["ratio/log_max"].item() == pytest.approx(0.3)
    allmasked, _ = _step_loss(logp, logp, adv, torch.zeros(2, 2))
    assert torch.isfinite(allmasked)


def test_slice_schedule_covers_all_slots():
    assert [slice_slots(i, 8, 4) for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [slice_slots(i, 4, 2) for i in range(3)] == [[0, 1], [2, 3], [0, 1]]  # mu * K' > K wraps around
    assert EGSPOConfig(K=8, mu=2).per_update == 4
    assert EGSPOConfig(K=8, mu=3).per_update == 3
    assert EGSPOConfig(K=8, mu=3, steps_per_update=8).per_update == 8


@pytest.mark.parametrize(
    "cls,kwargs,key",
    [
        (EGSPOConfig, {"K": 0}, "objective.K"),
        (EGSPOConfig, {"select": "foo"}, "objective.select"),
        (EGSPOConfig, {"reduce": "max"}, "objective.reduce"),
        (EGSPOConfig, {"K": 4, "steps_per_update": 5}, "objective.steps_per_update"),
        (EGSPOConfig, {"old_logp": "x"}, "objective.old_logp"),
        (EGSPOConfig, {"eps": 1.5}, "objective.eps"),
    ],
)
def test_config_errors(cls, kwargs, key):
    with pytest.raises(ConfigError) as err:
        cls(**kwargs).validate()
    assert str(err.value).startswith(key + "=")


# ---- the objectives on a real rollout ------------------------------------------------------
class TextTask:
    """A reward that depends on the text, so greedy completions get different values."""

    cfg = SimpleNamespace(group_size=2, loss_mask="all")

    def prompt(self, item):
        return item["prompt"]

    def score(self, completions, items):
        r = torch.tensor([(sum(map(ord, c)) % 7) / 7 for c in completions])
        return r, {"text": r}

    def canvas(self, items, tokenizer, length, mask_id):
        return None  # pins nothing (Task.canvas)

    def reward_metrics(self, completions, items):
        return {}  # none (Task.reward_metrics)


ITEMS = [{"prompt": "1203="}, {"prompt": "0000000="}]  # different lengths: left padding is exercised


def _rollout_of(bundle, objective, advantage: str, steps=4, **adv_kw):
    cls = ADVANTAGES.get(advantage)
    sampler = SamplerConfig(gen_length=8, block_length=4, steps=steps, temperature=0.9)
    engine = RolloutEngine(bundle, TextTask(), objective, cls(cls.config_class(**adv_kw)), sampler, seed=1)
    return engine(ITEMS, bundle.net, rollout_id=0)


def _ctx(bundle, ro):
    f = logits_fn(bundle.net)
    return StepContext(ro, 0, 0, f, f, None)


def _grads(bundle, obj, ro, mu):
    ctx, out = _ctx(bundle, ro), []
    for it in range(mu):
        ctx.inner_iter = it
        bundle.net.zero_grad()
        loss, m = obj.loss(ctx)
        loss.backward()  # at theta_old the loss is -mean(A) = 0; the gradient carries the signal
        out.append(torch.cat([p.grad.flatten() for p in bundle.net.parameters() if p.grad is not None]))
        assert m["ratio/log_max"].item() == 0 and m["ratio/log_min"].item() == 0  # theta == theta_old
        assert m["egspo/slice_start"].item() == 2 * it
        assert m["cost/forwards_per_sample"].item() == pytest.approx(4 / 2 + 2 + 2)
    return torch.stack(out)


def test_sa_with_lam_zero_equals_egspo_and_values_are_greedy_rewards(tiny_bundle):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    egspo = EGSPO(EGSPOConfig(K=4, mu=2, old_logp="recompute"), lik)  # ratio exactly 1 at theta_old
    sa = EGSPOSA(EGSPOSAConfig(K=4, mu=2, old_logp="recompute"), lik)
    ro = _rollout_of(tiny_bundle, egspo, "group")
    ro0 = _rollout_of(tiny_bundle, sa, "stepwise", lam=0.0, std_scale=False)
    ro5 = _rollout_of(tiny_bundle, sa, "stepwise", lam=0.5)
    assert torch.equal(ro.completion_ids, ro5.completion_ids)  # recording greedy completions changes nothing
    g, g0, g5 = (_grads(tiny_bundle, o, r, 2) for o, r in ((egspo, ro), (sa, ro0), (sa, ro5)))
    assert torch.equal(g, g0) and g.abs().sum() > 0
    assert not torch.allclose(g, g5)  # the values do matter
    # V_s is the reward of the decoded greedy completion at the selected step
    traj, steps = ro5.trajectory, ro5.selected_steps
    assert torch.equal(steps, SELECTORS.get("entropy")(traj.entropies, 4))
    L = ro5.completion_ids.shape[1]
    V = torch.zeros(4, 4)
    for b in range(4):
        for k in range(4):
            comp = traj.greedy_completion(int(steps[b, k]))[b : b + 1, -L:]
            V[b, k] = TextTask().score(decode_completions(tiny_bundle.tokenizer, comp, tiny_bundle.eos_token_id), [])[0][0]
    want, _ = StepwiseAdvantage(StepwiseConfig(lam=0.5))(ro5.rewards, 2, V)
    assert torch.allclose(ro5.advantages, want)
    assert "time/score_s" in ro5.metrics and "egspo_sa/value_mean" in ro5.metrics


def test_old_logp_recorded_matches_recomputed_and_k_checked(tiny_bundle):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    res = {}
    for mode in ("recompute", "recorded"):
        obj = EGSPO(EGSPOConfig(K=4, mu=1, old_logp=mode, reduce="mean"), lik)
        res[mode] = obj.loss(_ctx(tiny_bundle, _rollout_of(tiny_bundle, obj, "group")))
    assert res["recorded"][0].item() == pytest.approx(res["recompute"][0].item(), abs=1e-5)
    assert abs(res["recorded"][1]["ratio/log_max"].item()) < 1e-4
    assert res["recorded"][1]["cost/old_forwards_per_sample"].item() == 0
    assert res["recompute"][1]["cost/old_forwards_per_sample"].item() == 4
    with pytest.raises(ConfigError, match="objective.K"):
        _rollout_of(tiny_bundle, EGSPO(EGSPOConfig(K=8), lik), "group")


@pytest.mark.parametrize("select", ["random", "uniform"])
def test_stop_at_last_content_in_step_selection(tiny_bundle, select):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    obj = EGSPOSA(EGSPOSAConfig(K=3, mu=1, select=select, stop_at_last_content=True), lik)
    ro = _rollout_of(tiny_bundle, obj, "stepwise", steps=8)
    last = last_content_step(ro.trajectory, ro.completion_ids, ro.completion_mask, tiny_bundle.eos_token_id)
    last = steps_up_to(last, 8).long().cumsum(-1).argmax(-1)  # (N,)
    for b in range(4):
        chosen = ro.selected_steps[b][ro.selected_steps[b] >= 0]
        assert chosen.max() == last[b] and (chosen <= last[b]).all()
    loss, _ = obj.loss(_ctx(tiny_bundle, ro))
    assert torch.isfinite(loss)


@pytest.mark.parametrize("objective,lr", [("egspo", 3e-5), ("egspo_sa", 3e-5), ("grpo", 3e-6), ("stabledrl", 1e-6)])
def test_objective_selects_its_public_optimiser_and_the_testbed_and_command_line_win(tmp_path, objective, lr):
    from tests.helpers.common import compose_cfg

    public = compose_cfg([f"objective={objective}", "~testbed"], tmp_path)
    assert public.optim.lr == pytest.approx(lr) and public.optim.grad_clip == 0.2  # the public code's clip
    assert compose_cfg([f"objective={objective}"], tmp_path).optim.lr == pytest.approx(3e-4)  # conf/testbed/tiny_*
    assert compose_cfg([f"objective={objective}", "optim.lr=5e-5"], tmp_path).optim.lr == pytest.approx(5e-5)


def test_selection_experiment_sweeps_selectors_and_seeds_with_egspo_defaults(tmp_path):
    from hydra import compose, initialize_config_dir

    from tests.helpers.common import CONF, compose_cfg

    cfg = compose_cfg(["experiment=egspo_selection"], tmp_path, tiny=False)
    assert cfg.objective.name == "egspo" and cfg.optim.lr == pytest.approx(3e-4) and cfg.task.name == "sudoku"
    assert (cfg.objective.K, cfg.sampler.steps) == (2, 16)  # one step in eight, as the paper's 8 of 128
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        full = compose(config_name="config", overrides=["experiment=egspo_selection"], return_hydra_config=True)
    params = full.hydra.sweeper.params
    assert set(params["objective.select"].split(",")) == {"entropy", "random", "uniform", "low_entropy"}
    assert len(params["seed"].split(",")) == 8


def test_low_entropy_selector_is_the_mirror_of_entropy():
    H = torch.tensor([[0.1, 0.9, 0.3, 0.8, 0.2, 0.7]])
    assert SELECTORS.get("low_entropy")(H, 3).tolist() == [[0, 4, 2]]
    assert SELECTORS.get("low_entropy")(H, 2, steps_up_to(torch.tensor([1]), 6)).tolist() == [[0, 1]]
    assert SELECTORS.get("low_entropy")(H, 3, steps_up_to(torch.tensor([0]), 6)).tolist() == [[0, -1, -1]]


def test_gradient_fidelity_report_says_whether_the_bound_held():
    """scripts/egspo_gradient_fidelity.py states its answer from the measured order of the selectors."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "scripts" / "egspo_gradient_fidelity.py"
    spec = importlib.util.spec_from_file_location("egspo_gradient_fidelity", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def seed(**cos):
        return {"selectors": {n: {"cosine": c} for n, c in cos.items()}}

    held = [seed(entropy=0.8, random=0.6, uniform=0.7, low_entropy=0.0),
            seed(entropy=0.5, random=0.6, uniform=0.55, low_entropy=-0.1)]
    text = mod.answer(held)
    assert text.startswith("The prediction held") and "entropy > uniform > random > low_entropy" in text
    assert "closest in 1 of 2 seeds" in text
    assert mod.answer([seed(entropy=0.5, random=0.9, uniform=0.7, low_entropy=0.1)]).startswith(
        "The prediction did not hold")


# ---- the objective's metrics, scale and options, hand-computed from its own rollout ----------------
def _egspo(**kw):
    lik = OneStepEstimator(LikelihoodConfig(), 99)
    return EGSPO(EGSPOConfig(**kw), lik)


def test_egspo_config_edges():
    for ok in (dict(K=1), dict(K=4, steps_per_update=4), dict(K=4, steps_per_update=0)):
        EGSPOConfig(**ok).validate()
    for bad, key in ((dict(K=0), "K"), (dict(K=4, steps_per_update=5), "steps_per_update"),
                     (dict(select="best"), "select"), (dict(reduce="max"), "reduce"), (dict(old_logp="cached"), "old_logp")):
        with pytest.raises(ConfigError, match=rf"^objective\.{key}\b"):
            EGSPOConfig(**bad).validate()


def test_the_old_policy_is_scored_as_the_policy_only_when_recomputed():
    assert _egspo(old_logp="recompute").old_logp_like_policy()
    assert not _egspo(old_logp="recorded").old_logp_like_policy()
    assert not _egspo(old_logp="recompute", share_masks_with_old=False).old_logp_like_policy()


def test_selection_metrics_hand_computed(tiny_bundle):
    obj = EGSPO(EGSPOConfig(K=3, mu=1, stop_at_last_content=True), OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id))
    ro = _rollout_of(tiny_bundle, obj, "group")
    traj, steps, m = ro.trajectory, ro.selected_steps, ro.metrics
    ent, valid = traj.entropies, steps >= 0
    picked = [float(ent[b, s]) for b in range(steps.shape[0]) for s in steps[b].tolist() if s >= 0]
    assert m["egspo/selected_entropy"] == pytest.approx(sum(picked) / len(picked), rel=1e-5)
    assert m["egspo/step_entropy"] == pytest.approx(float(ent.mean()), rel=1e-5)
    assert m["egspo/selected_step_mean"] == pytest.approx(float(steps[valid].float().mean()), rel=1e-6)
    assert m["egspo/valid_frac"] == pytest.approx(float(valid.float().mean()))
    assert m["egspo/trajectory_bytes_per_sample"] == pytest.approx(traj.nbytes() / steps.shape[0])


def test_random_selection_is_keyed_by_the_run_and_the_rollout():
    class Traj:  # what select_steps reads of a trajectory
        num_steps, variable_steps = 16, False
        counts = torch.ones(6, 16, dtype=torch.long)
        entropies = torch.rand(6, 16, generator=torch.Generator().manual_seed(0))

        def nbytes(self):
            return 0

    obj = _egspo(K=4, select="random")
    pick = lambda rollout, run: obj.select_steps(Traj(), torch.zeros(6, 8, dtype=torch.long), torch.ones(6, 8), 1,  # noqa: E731
                                                 rollout, run)[0]
    assert torch.equal(pick(3, 7), pick(3, 7))
    assert not torch.equal(pick(3, 7), pick(4, 7)) and not torch.equal(pick(3, 7), pick(3, 8))


def test_update_metrics_and_the_per_token_scale_of_summed_step_log_probs(tiny_bundle):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    obj = EGSPO(EGSPOConfig(K=4, mu=2, old_logp="recompute"), lik)
    ro = _rollout_of(tiny_bundle, obj, "group")  # gen_length 8 over 4 steps: 2 tokens per step
    ctx = _ctx(tiny_bundle, ro)
    ctx.inner_iter = 1
    loss, m = obj.loss(ctx)
    steps = ro.selected_steps[:, 2:4]
    valid = steps >= 0
    N = steps.shape[0]
    assert m["egspo/slice_start"].item() == 2 and m["egspo/slice_size"].item() == 2
    assert m["egspo/step_mean"].item() == pytest.approx(float(steps[valid].float().mean()))
    assert m["egspo/adv_abs_mean"].item() == pytest.approx(float(ro.advantages.abs()[:, None].expand(-1, 2)[valid].mean()))
    assert m["cost/gen_forwards_per_sample"].item() == pytest.approx(4 / 2)
    assert m["cost/train_forwards_per_sample"].item() == pytest.approx(float(valid.sum()) / N)
    unscaled, _ = EGSPO(EGSPOConfig(K=4, mu=2, old_logp="recompute", step_token_norm=False), lik).loss(ctx)
    assert unscaled.item() != 0 and loss.item() == pytest.approx(unscaled.item() / 2)
    mean, _ = EGSPO(EGSPOConfig(K=4, mu=2, old_logp="recompute", reduce="mean"), lik).loss(ctx)
    mean_unnormed, _ = EGSPO(EGSPOConfig(K=4, mu=2, old_logp="recompute", reduce="mean", step_token_norm=False),
                             lik).loss(ctx)
    assert mean.item() == pytest.approx(mean_unnormed.item())  # a mean per step is already per token


def test_only_the_tokens_the_reward_reads_count_in_a_step(tiny_bundle):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    obj = EGSPO(EGSPOConfig(K=4, mu=1, old_logp="recompute"), lik)
    ro = _rollout_of(tiny_bundle, obj, "group")
    f = logits_fn(tiny_bundle.net.eval())
    with torch.no_grad():
        full = obj.logp_units(_ctx(tiny_bundle, ro), f, "policy").logp
        ro.loss_mask = torch.zeros_like(ro.completion_mask)
        ro.loss_mask[:, :3] = 1  # the reward reads the first three completion tokens
        part = EGSPO(obj.cfg, lik).logp_units(_ctx(tiny_bundle, ro), f, "policy").logp
        traj, steps = ro.trajectory, ro.selected_steps
        states, committed = traj.states_at(steps.clamp_min(0))
        P = ro.prompt_ids.shape[1]
        keep = torch.cat([torch.ones_like(ro.prompt_mask), ro.loss_mask.long()], 1).bool().repeat_interleave(4, 0)
        attn = torch.cat([ro.prompt_mask.long(), torch.ones_like(ro.completion_ids)], 1).repeat_interleave(4, 0)
        want = stepwise_logps(f, states, attn, committed & keep, traj.final.repeat_interleave(4, 0)).view(-1, 4)
    assert not torch.allclose(full, part)
    assert torch.allclose(part, want * (steps >= 0), atol=1e-5)
    assert bool((committed[:, P + 3:] & ~keep[:, P + 3:]).any())  # steps did commit tokens the reward ignores


def test_recorded_old_log_probs_with_one_token_per_step_and_mean_reduce(tiny_bundle):
    lik = OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id)
    res = {}
    for mode in ("recompute", "recorded"):
        obj = EGSPO(EGSPOConfig(K=4, mu=1, old_logp=mode, reduce="mean"), lik)
        ro = _rollout_of(tiny_bundle, obj, "group", steps=8)  # one token per step
        ctx = _ctx(tiny_bundle, ro)
        with torch.no_grad():
            res[mode] = obj.logp_units(ctx, logits_fn(tiny_bundle.net.eval()), "old")
    assert torch.allclose(res["recorded"].logp, res["recompute"].logp, atol=1e-5)
    assert torch.equal(res["recorded"].mask, res["recompute"].mask)
    # one token per step: summed step log-probs are already per token, step_token_norm divides by 1
    obj = EGSPO(EGSPOConfig(K=4, mu=1, old_logp="recompute"), lik)
    ctx = _ctx(tiny_bundle, _rollout_of(tiny_bundle, obj, "group", steps=8))
    normed, _ = obj.loss(ctx)
    plain, _ = EGSPO(EGSPOConfig(K=4, mu=1, old_logp="recompute", step_token_norm=False), lik).loss(ctx)
    assert normed.item() == pytest.approx(plain.item()) and plain.item() != 0


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_uniform_noise_steps_replay_to_the_samplers_log_probs(reduce):
    """A uniform-noise trajectory (DiffusionGemma): each selected step's log-prob is its accepted tokens'
    log-probs as the sampler drew them, summed or averaged over the tokens, over those the reward reads
    when a loss mask is set."""
    from diffusion_rl.likelihood.trajectory import TrajectoryEstimator, TrajectoryLikelihoodConfig
    from tests.helpers.common import rollout_of
    from tests.helpers.gemma import sharp_gemma, uniform_rollout

    b = sharp_gemma()
    ids = torch.randint(4, 100, (4, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    traj, comp = uniform_rollout(b, ids, mask, [1, 2, 3, 4])
    obj = EGSPO(EGSPOConfig(K=3, mu=1, reduce=reduce, old_logp="recompute"),
                TrajectoryEstimator(TrajectoryLikelihoodConfig(), -1))
    cmask = torch.ones_like(comp, dtype=torch.float)
    steps, _ = obj.select_steps(traj, comp, cmask, b.eos_token_id, 0, 0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    f = logits_fn(b.net)
    pos, lp = traj.positions(16), traj.position_logps(16)  # (B, T, L) each
    for loss_mask in (None, (torch.arange(16) < 6).float().expand(4, -1)):
        ro = rollout_of(ids, mask, comp, cmask, adv, adv, 4, trajectory=traj, selected_steps=steps, loss_mask=loss_mask)
        with torch.no_grad():
            units = obj.logp_units(StepContext(ro, 0, 0, f, f, None), f, "policy")
        keep = torch.ones(4, 16, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
        for r in range(4):
            for k in range(3):
                s = int(steps[r, k])
                if s < 0:
                    assert units.mask[r, k] == 0
                    continue
                hit = pos[r, s] & keep[r]
                want = lp[r, s][hit].sum()
                if reduce == "mean":
                    want = want / max(int(hit.sum()), 1)
                assert units.logp[r, k].item() == pytest.approx(want.item(), abs=1e-4), (r, k, loss_mask is None)
        loss, m = obj.loss(StepContext(ro, 0, 0, f, f, None))  # at theta_old every step ratio is 1
        assert torch.isfinite(loss) and abs(m["ratio/log_max"].item()) < 1e-4
        assert m["egspo/slice_size"].item() == 3 and m["egspo/step_mean"].item() == pytest.approx(float(steps.float().mean()))
        assert m["cost/train_forwards_per_sample"].item() == 3
    assert (steps >= 0).all()


@pytest.mark.parametrize("name", ["random", "uniform", "entropy", "low_entropy"])
def test_a_row_with_fewer_candidates_than_k_keeps_them_all_and_marks_the_rest_unused(name):
    ent = torch.rand(2, 10, generator=torch.Generator().manual_seed(3))
    cand = torch.zeros(2, 10, dtype=torch.bool)
    cand[0, [1, 4, 6]] = True  # three candidates for K = 5
    cand[1] = True
    steps = SELECTORS.get(name)(ent, 5, cand, torch.Generator().manual_seed(0))
    assert steps.dtype == torch.long
    assert sorted(steps[0, :3].tolist()) == [1, 4, 6] and steps[0, 3:].tolist() == [-1, -1]
    assert (steps[1] >= 0).all() and len(set(steps[1].tolist())) == 5


def test_steps_up_to_keeps_every_step_of_a_row_with_no_content():
    assert steps_up_to(torch.tensor([2, -1]), 5).tolist() == [[True, True, True, False, False], [True] * 5]


def test_the_entropy_selector_breaks_ties_by_the_earlier_step():
    ent = torch.zeros(1, 64)
    ent[0, ::4] = 1.0  # 16 steps tied at the top
    assert SELECTORS.get("entropy")(ent, 6).tolist() == [[0, 4, 8, 12, 16, 20]]
    assert SELECTORS.get("low_entropy")(ent, 3).tolist() == [[1, 2, 3]]
