"""One source of defaults: the dataclasses are the defaults, the yaml files hold only what differs.

For every option of every config group: it composes and validates against its dataclass; no key in
its yaml restates the value it would have anyway; and a group's base option composes to exactly the
dataclass built in Python with no arguments (so ``GRPOConfig()`` is what ``objective=grpo`` runs
without the overlays). The two overlays (``conf/recipe/<objective>_<task>.yaml``: the public code's
per-task settings; ``conf/testbed/<model>_<objective>.yaml``: the embedded model's) are checked apart:
each names an objective, task or model that exists, sets only keys that exist, and changes every one.
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


# ---- the overlays ------------------------------------------------------------------------------------
OVERLAYS = [(g, p.stem) for g in ("recipe", "testbed") for p in sorted((CONF / g).glob("*.yaml"))]


def overlay_choices(group: str, option: str) -> list[str]:
    """The command-line choices that select ``conf/<group>/<option>.yaml``: objective and task (recipe),
    model and objective (testbed); the name splits where both halves are options of their groups."""
    first, second = ("objective", "task") if group == "recipe" else ("model", "objective")
    splits = [(option[:i], option[i + 1:]) for i, ch in enumerate(option) if ch == "_"]
    hits = [(a, b) for a, b in splits if (CONF / first / f"{a}.yaml").exists() and (CONF / second / f"{b}.yaml").exists()]
    assert len(hits) == 1, f"conf/{group}/{option}.yaml names no {first}_{second} pair (or several: {hits})"
    return [f"{first}={hits[0][0]}", f"{second}={hits[0][1]}"]


def leaves(node, prefix: str = "") -> dict:
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for key, sub in node.items() if key != "defaults" for k, v in leaves(sub, f"{prefix}{key}.").items()}


def test_every_overlay_is_checked():
    assert {g for g, _ in OVERLAYS} == {"recipe", "testbed"}


@pytest.mark.parametrize("group,option", OVERLAYS)
def test_overlay_changes_what_it_sets_and_builds(tmp_path, group, option):
    from diffusion_rl.app.train import build

    choices = overlay_choices(group, option)
    if group == "recipe":  # the testbed comes after the recipe and may set the same key for the embedded model
        choices.append("~testbed")
    without = OmegaConf.to_container(compose_cfg([*choices, f"~{group}"], tmp_path, tiny=False), resolve=True)
    with_it = compose_cfg(choices, tmp_path, tiny=False)
    build(with_it)  # every value validates
    flat_without = {k.rstrip("."): v for k, v in leaves(without).items()}
    for key, value in leaves(raw(group, option)).items():
        key = key.rstrip(".")
        if key.startswith("testbed_choices."):  # group choices on one task, taken by the app: checked apart
            check_task_choices(tmp_path, choices, key.split(".", 1)[1], value)
            continue
        assert key in flat_without, f"conf/{group}/{option}.yaml sets {key}, which the config does not have"
        assert OmegaConf.select(with_it, key) == value, f"{key}: the overlay's value does not reach the config"
        assert flat_without[key] != value, f"conf/{group}/{option}.yaml restates {key}={value}: delete it"


def check_task_choices(tmp_path, choices: list[str], task: str, items: list[str]) -> None:
    """Each ``group=option`` of a testbed's ``testbed_choices.<task>`` reaches the config composed for that
    task, and changes it."""
    on_task = compose_cfg([*choices, f"task={task}"], tmp_path, tiny=False)
    for item in items:
        group, option = item.split("=")
        chosen = compose_cfg([*choices, f"task={task}", item], tmp_path, tiny=False)
        assert on_task[group] == chosen[group], f"testbed_choices.{task}: {item} does not reach the config"
        without = compose_cfg([*choices, f"task={task}", "~testbed"], tmp_path, tiny=False)
        assert without[group] != chosen[group], f"testbed_choices.{task}: {item} restates the choice: delete it"
