"""One source of defaults: the dataclasses are the defaults, the yaml files hold only what differs.

For every option of every config group: it composes and validates against its dataclass; no key in
its yaml restates the value it would have anyway; and a group's base option composes to exactly the
dataclass built in Python with no arguments (so ``GRPOConfig()`` is what ``objective=grpo`` runs).
"""

import dataclasses

import pytest
from omegaconf import OmegaConf

from diffusion_rl.app.conf_store import GROUP_SCHEMAS, REGISTRIES, defaults_of, schema
from diffusion_rl.app.evaluate import EvalRunConfig
from diffusion_rl.app.train import RunConfig
from diffusion_rl.core.config import from_dict
from tests.helpers.common import CONF, compose_cfg

GROUPS = sorted([*GROUP_SCHEMAS, *REGISTRIES])
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def raw(group: str, option: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"), resolve=False)


def own_keys(group: str, option: str) -> dict:
    return {k: v for k, v in raw(group, option).items() if k != "defaults"}


def parent(group: str, option: str) -> str | None:
    """The sibling option a yaml extends (``defaults: [tiny, _self_]``), if any."""
    for entry in raw(group, option).get("defaults", []):
        if isinstance(entry, str) and entry != "_self_" and not entry.startswith("base_") and "/" not in entry:
            return entry
    return None


def composed(tmp_path, group: str, option: str) -> dict:
    cfg = compose_cfg([f"{group}={option}"], tmp_path, tiny=False)
    return OmegaConf.to_container(cfg[group], resolve=True)


def test_every_group_option_is_covered():
    assert len(OPTIONS) >= 30 and {g for g, _ in OPTIONS} == set(GROUPS)


@pytest.mark.parametrize("group,option", OPTIONS)
def test_option_composes_and_validates(tmp_path, group, option):
    node = composed(tmp_path, group, option)
    from_dict(schema(group, node.get("name", option)), node, group)


def restated(own: dict, inherited: dict) -> list[str]:
    """Keys of a yaml that set what the option has anyway (interpolations tie keys together: not defaults)."""
    return [k for k, v in own.items() if k in inherited and v == inherited[k]
            and not (isinstance(v, str) and v.startswith("${"))]


@pytest.mark.parametrize("group,option", OPTIONS)
def test_no_yaml_restates_a_default(tmp_path, group, option):
    base = parent(group, option)
    inherited = composed(tmp_path, group, base) if base else defaults_of(schema(group, option))
    own = own_keys(group, option)
    assert set(own) <= set(inherited), f"conf/{group}/{option}.yaml: unknown keys {set(own) - set(inherited)}"
    assert not restated(own, inherited), f"conf/{group}/{option}.yaml restates {restated(own, inherited)}: delete them"


BASE = [(g, o) for g, o in OPTIONS if not own_keys(g, o) and parent(g, o) is None]


def test_each_group_has_a_base_option():
    assert {g for g, _ in BASE} == set(GROUPS)


@pytest.mark.parametrize("group,option", BASE)
def test_base_option_is_the_dataclass_built_with_no_arguments(tmp_path, group, option):
    cls = schema(group, option)
    assert composed(tmp_path, group, option) == defaults_of(cls)
    assert from_dict(cls, composed(tmp_path, group, option), group) == cls()


def test_root_keys_are_run_config_and_eval_config(tmp_path):
    names = {f.name for f in dataclasses.fields(RunConfig)}
    cfg = OmegaConf.to_container(compose_cfg([], tmp_path, tiny=False), resolve=True)
    assert {k: cfg[k] for k in names} == defaults_of(RunConfig) | {"paths": {"cache_dir": str(tmp_path / "cache")}}
    names = {f.name for f in dataclasses.fields(EvalRunConfig)}
    cfg = OmegaConf.to_container(compose_cfg([], tmp_path, tiny=False, config_name="eval"), resolve=True)
    want = defaults_of(EvalRunConfig) | {"paths": {"cache_dir": str(tmp_path / "cache")}}
    assert {k: cfg[k] for k in names} == want  # eval.batch_size follows task.eval_batch_size: 256 for Sudoku


def test_a_yaml_that_restated_a_default_would_be_caught():
    inherited = defaults_of(schema("model", "tiny"))
    own = {"d_model": 128, "block_size": 4, "lora_targets": list(inherited["lora_targets"]), "seed": "${seed}"}
    assert restated(own, inherited) == ["d_model", "lora_targets"]
