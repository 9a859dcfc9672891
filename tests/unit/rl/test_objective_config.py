"""What every objective declares before it runs (rl/objectives/config.py): the shared keys' edges
(``objective.mu``, ``beta``, ``behaviour_correction``, ``tis_cap``), PPO's clip range, and the rule by
which an objective's :class:`LikelihoodNeed` accepts or refuses an estimator, each case by hand."""

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.objectives.config import LikelihoodNeed, ObjectiveConfig, check_clip

# ---------------------------------------------------------------- the shared keys


@pytest.mark.parametrize("ok", [dict(mu=1), dict(mu=2), dict(beta=0.0), dict(beta=0.5), dict(beta=2.0),
                                dict(behaviour_correction="none"), dict(behaviour_correction="tis"),
                                dict(tis_cap=1.0), dict(tis_cap=1.5), dict(tis_cap=10.0)])
def test_the_edges_each_key_allows(ok):
    ObjectiveConfig(**ok).validate()  # mu >= 1, beta >= 0, none | tis, tis_cap >= 1, each bound itself allowed


@pytest.mark.parametrize("bad,key", [
    (dict(mu=0), "mu"), (dict(mu=-1), "mu"),
    (dict(beta=-0.01), "beta"),
    (dict(behaviour_correction="is"), "behaviour_correction"), (dict(behaviour_correction="TIS"), "behaviour_correction"),
    (dict(tis_cap=0.99), "tis_cap"), (dict(tis_cap=0.0), "tis_cap"), (dict(tis_cap=float("nan")), "tis_cap"),
])
def test_each_refusal_names_its_key_and_value(bad, key):
    with pytest.raises(ConfigError) as err:
        ObjectiveConfig(**bad).validate()
    # the key exactly as the user writes it, and the value refused
    assert err.value.key == f"objective.{key}"
    (value,) = bad.values()
    assert err.value.value is value
    assert str(err.value).startswith(f"objective.{key}=")


def test_behaviour_correction_lists_what_is_allowed():
    with pytest.raises(ConfigError) as err:
        ObjectiveConfig(behaviour_correction="is").validate()
    assert err.value.allowed == "allowed: none, tis"


# ---------------------------------------------------------------- PPO's clip range


@pytest.mark.parametrize("eps,eps_high", [(0.2, 0.28), (0.001, 0.001), (0.999, 5.0), (0.5, float("inf"))])
def test_clip_ranges_allowed(eps, eps_high):
    check_clip(eps, eps_high)  # 0 < eps < 1 and eps_high > 0
    check_clip(eps)  # eps_high not given: eps both sides


@pytest.mark.parametrize("eps,eps_high,key", [
    (0.0, 0.2, "objective.eps"), (-0.1, 0.2, "objective.eps"), (1.0, 0.2, "objective.eps"), (1.5, 0.2, "objective.eps"),
    (0.2, 0.0, "objective.eps_high"), (0.2, -0.1, "objective.eps_high"),
])
def test_clip_ranges_refused(eps, eps_high, key):
    with pytest.raises(ConfigError) as err:
        check_clip(eps, eps_high)
    assert err.value.key == key


# ---------------------------------------------------------------- what an objective needs of its estimator


class Kind:
    """An estimator class an objective may name in ``kinds``."""

    def __init__(self, name, per_token):
        self.cfg, self.per_token = SimpleNamespace(name=name), per_token


class Other(Kind):
    pass


@dataclass
class Nameless:
    """A config with no ``name``: the estimator counts as ``one_step``."""


def estimator(name, per_token, cls=Kind):
    return cls(name, per_token)


def fits(need, likelihood):
    """The rule written out: per token if asked, one_step (a config without a name counts as it) if asked,
    an instance of one of the kinds if any are named."""
    name = getattr(likelihood.cfg, "name", "one_step")
    return ((likelihood.per_token or not need.per_token) and (name == "one_step" or not need.one_step)
            and (not need.kinds or isinstance(likelihood, need.kinds)))


NEEDS = [LikelihoodNeed("w"), LikelihoodNeed("w", per_token=True), LikelihoodNeed("w", one_step=True),
         LikelihoodNeed("w", per_token=True, one_step=True), LikelihoodNeed("w", kinds=(Kind,)),
         LikelihoodNeed("w", kinds=(Other,)), LikelihoodNeed("w", per_token=True, kinds=(Other,)),
         LikelihoodNeed("w", one_step=True, kinds=(Kind,))]
ESTIMATORS = [estimator(name, per_token, cls) for name in ("one_step", "elbo") for per_token in (True, False)
              for cls in (Kind, Other)]


@pytest.mark.parametrize("need", NEEDS)
@pytest.mark.parametrize("likelihood", ESTIMATORS)
def test_a_need_accepts_exactly_the_estimators_that_fit(need, likelihood):
    if fits(need, likelihood):
        need.check(likelihood)
    else:
        with pytest.raises(ConfigError) as err:
            need.check(likelihood)
        assert (err.value.key, err.value.value, err.value.allowed) == ("likelihood.name", likelihood.cfg.name, "w")


def test_the_table_holds_each_case_by_hand():
    """The cases the rule turns on, each written out (the table above is the rule's transcription)."""
    pt_elbo, seq_elbo = estimator("elbo", True), estimator("elbo", False)
    pt_one, seq_one = estimator("one_step", True), estimator("one_step", False)
    LikelihoodNeed("w").check(seq_elbo)  # needing nothing, anything fits
    LikelihoodNeed("w", per_token=True).check(pt_elbo)
    LikelihoodNeed("w", one_step=True).check(seq_one)
    LikelihoodNeed("w", per_token=True, one_step=True).check(pt_one)
    LikelihoodNeed("w", kinds=(Kind,)).check(estimator("elbo", False, Other))  # a subclass is a kind
    for need, lik in [(LikelihoodNeed("w", per_token=True), seq_one),  # one_step, but not per token
                      (LikelihoodNeed("w", one_step=True), pt_elbo),  # per token, but not one_step
                      (LikelihoodNeed("w", per_token=True, one_step=True), seq_one),
                      (LikelihoodNeed("w", per_token=True, one_step=True), pt_elbo),
                      (LikelihoodNeed("w", kinds=(Other,)), pt_one),  # not of the kind
                      (LikelihoodNeed("w", per_token=True, kinds=(Kind,)), seq_one)]:
        with pytest.raises(ConfigError, match=r"^likelihood\.name="):
            need.check(lik)


def test_an_estimator_config_without_a_name_counts_as_one_step():
    nameless = SimpleNamespace(cfg=Nameless(), per_token=True)
    LikelihoodNeed("w", one_step=True).check(nameless)
    LikelihoodNeed("w", per_token=True).check(nameless)
    LikelihoodNeed("w").check(nameless)
