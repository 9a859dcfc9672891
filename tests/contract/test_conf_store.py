"""One source of defaults: the dataclasses are the defaults, the yaml files hold only what differs.

For every option of every config group: it composes and validates against its dataclass; no key in
its yaml restates the value it would have anyway; and a group's base option composes to exactly the
dataclass built in Python with no arguments (so ``GRPOConfig()`` is what ``objective=grpo`` runs
without the overlays). The two overlays (``conf/recipe/<objective>_<task>.yaml``: the public code's
per-task settings; ``conf/testbed/<model>_<objective>.yaml``: the embedded model's) are checked apart:
each names an objective, task or model that exists, sets only keys that exist, and changes every one.
"""

import dataclasses
import itertools

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


NO_OVERLAYS = ["~recipe", "~testbed"]


def composed(tmp_path, group: str, option: str) -> dict:
    cfg = compose_cfg([f"{group}={option}", *NO_OVERLAYS], tmp_path, tiny=False)
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
    cfg = OmegaConf.to_container(compose_cfg(["~testbed"], tmp_path, tiny=False), resolve=True)  # the overlays: below
    assert {k: cfg[k] for k in names} == defaults_of(RunConfig) | {"paths": {"cache_dir": str(tmp_path / "cache"),
                                                                            "warmstart_dir": str(tmp_path / "cache" / "warmstart")}}
    names = {f.name for f in dataclasses.fields(EvalRunConfig)}
    cfg = OmegaConf.to_container(compose_cfg(["~testbed"], tmp_path, tiny=False, config_name="eval"), resolve=True)
    want = defaults_of(EvalRunConfig) | {"paths": {"cache_dir": str(tmp_path / "cache"),
                                                   "warmstart_dir": str(tmp_path / "cache" / "warmstart")}}
    assert {k: cfg[k] for k in names} == want  # eval.batch_size follows task.eval_batch_size: 256 for Sudoku


def test_a_yaml_that_restated_a_default_would_be_caught():
    inherited = defaults_of(schema("model", "tiny"))
    own = {"d_model": 128, "block_size": 4, "lora_targets": list(inherited["lora_targets"]), "seed": "${seed}"}
    assert restated(own, inherited) == ["d_model", "lora_targets"]


# ---- the overlays: recipe/, testbed/, experiment/, ablation/ ----------------------------------------
OVERLAYS = [(g, p.stem) for g in ("recipe", "testbed", "experiment", "ablation") for p in sorted((CONF / g).glob("*.yaml"))]


def overlay_choices(group: str, option: str) -> list[str]:
    """The command-line choices that select ``conf/<group>/<option>.yaml``: objective and task (recipe),
    model and objective, and a task where the name has one (testbed: ``tiny_grpo``, ``tiny_grpo_sudoku``);
    the experiment or ablation itself. The name splits where each part is an option of its group."""
    if group in ("experiment", "ablation"):
        return [f"{'+' if group == 'ablation' else ''}{group}={option}"]
    groups = ("objective", "task") if group == "recipe" else ("model", "objective", "task")
    hits = []
    for n in (2, 3) if group == "testbed" else (2,):
        for cut in itertools.combinations([i for i, ch in enumerate(option) if ch == "_"], n - 1):
            parts = [option[i + 1:j] for i, j in zip((-1, *cut), (*cut, len(option)))]
            if all((CONF / g / f"{p}.yaml").exists() for g, p in zip(groups, parts)):
                hits.append([f"{g}={p}" for g, p in zip(groups, parts)])
    assert len(hits) == 1, f"conf/{group}/{option}.yaml names no {'_'.join(groups)} choice (or several: {hits})"
    return hits[0]


def test_every_overlay_is_checked():
    assert {g for g, _ in OVERLAYS} == {"recipe", "testbed", "experiment", "ablation"}
    assert ("testbed", "tiny_grpo_sudoku") in OVERLAYS


@pytest.mark.parametrize("group,option", OVERLAYS)
def test_an_overlay_sets_only_what_differs_and_builds(tmp_path, group, option):
    """Each value an overlay sets differs from the value the key has before it (no restating: a layer that
    guards against another it cannot see), and the config it gives builds."""
    from diffusion_rl.app.sources import config_sources
    from diffusion_rl.app.train import build

    choices = overlay_choices(group, option)
    label = f"conf/{group}/{option}.yaml"
    values = config_sources(CONF, choices).values
    mine = {k: s for k, s in values.items() if any(src == label for src, _ in s)}
    assert mine or group == "experiment", f"{label} sets nothing for {choices}"
    restated = []
    for key, settings in mine.items():
        i = max(j for j, (src, _) in enumerate(settings) if src == label)
        value = settings[i][1]
        if i > 0 and not (isinstance(value, str) and value.startswith("${")) and settings[i - 1][1] == value:
            restated.append(f"{key}={value} ({settings[i - 1][0]} gives it)")
    assert not restated, f"{label} restates {'; '.join(restated)}: delete them"
    build(compose_cfg(choices, tmp_path, tiny=False))  # every value validates


def test_the_main_config_sets_no_group_value():
    """conf/config.yaml is the defaults list (the precedence), not a place that sets values: a value there
    would be a fourth place beside the dataclass, the group files and the experiment or command line."""
    own = own_keys_of_file(CONF / "config.yaml")
    assert set(own) == {"task", "hydra"} and own["task"] == {"seed": "${warmstart.seed}"}


def own_keys_of_file(path) -> dict:
    return {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path), resolve=False).items() if k != "defaults"}
