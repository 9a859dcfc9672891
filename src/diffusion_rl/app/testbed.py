"""A testbed's config-group choices on one task: ``testbed_choices`` in ``conf/testbed/<model>_<objective>.yaml``.

A testbed file holds the embedded model's settings for an objective as plain values, which the
experiment and the command line override as usual. A config-group choice that holds on one task only
(``advantage=per_token`` needs the task's per-token rewards, which only Sudoku gives) cannot sit there:
Hydra refuses a group override inside an interpolated defaults entry such as ``testbed:
${model}_${objective}``, and a value set there would beat the command line's own group choice. So the
file lists such choices by task::

    testbed_choices:
      sudoku: [advantage=per_token]

and the app composes the config again with the ones that apply (:func:`task_choices`): on the
composed task, for a group that neither the command line nor a config it selects (``experiment=...``,
``+ablation=...``) chooses, and where the run accepts them (:func:`compose_with_testbed`). An
experiment that must run the objective's own choice sets
``testbed_choices: {sudoku: []}``; ``~testbed`` drops the testbed altogether.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from diffusion_rl.core.config import group_options, override_key
from diffusion_rl.core.errors import ConfigError

log = logging.getLogger(__name__)


# the groups a testbed and a recipe are chosen by: the choices their own configs make are what the
# testbed refines, not a choice over it
KEYED_BY = ("model", "objective", "task")


def groups_chosen(overrides: Sequence[str], choices: Mapping[str, Any], conf_dir: Path) -> set[str]:
    """The config groups the command line ``overrides`` choose, with those chosen by the configs they
    select (an ``experiment``, an ``ablation``: the groups its defaults list names, followed into the
    group configs it selects), except the configs of :data:`KEYED_BY`. ``choices``: Hydra's final group
    choices (``experiment`` among them)."""
    named = {k for k in map(override_key, overrides) if "." not in k}
    chosen = set(named)
    todo = [(g, choices.get(g)) for g in (named | {"experiment"}) - set(KEYED_BY)]
    seen: set[tuple[str, str]] = set()
    while todo:
        group, option = todo.pop()
        path = conf_dir / group / f"{option}.yaml"
        if not isinstance(option, str) or (group, option) in seen or not path.is_file():
            continue
        seen.add((group, option))
        for entry in OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or []:  # type: ignore[union-attr]
            if not isinstance(entry, dict):
                continue
            for key, value in entry.items():
                sub = override_key(str(key))
                chosen.add(sub)
                if not str(key).startswith("override ") and isinstance(value, str):  # its own choices count
                    todo.append((sub, value))
    return chosen


def task_choices(cfg: DictConfig, task: str, chosen: Iterable[str], conf_dir: Path) -> list[str]:
    """The testbed's ``group=option`` overrides for ``task`` that apply: those for a group not in
    ``chosen`` (see :func:`groups_chosen`); each checked to name a config group and one of its options."""
    table = cfg.get("testbed_choices") or {}
    wanted = OmegaConf.to_container(table[task]) if task in table else []  # type: ignore[index]
    out, chosen = [], set(chosen)
    for item in wanted or []:  # type: ignore[union-attr]
        group, _, option = str(item).partition("=")
        allowed = group_options(group, conf_dir)
        if not option or allowed is None:
            raise ConfigError(f"testbed_choices.{task}", item, "each entry is group=option for a config group "
                              "(a plain setting goes in the testbed file as a value)")
        if option not in allowed:
            raise ConfigError(f"testbed_choices.{task}", item, f"unknown {group}; allowed: {', '.join(allowed)}")
        if group not in chosen:
            out.append(f"{group}={option}")
    return out


def compose_with_testbed(cfg: DictConfig, overrides: Sequence[str], choices: Mapping[str, Any], conf_dir: Path,
                         config_name: str = "config", check: Callable[[DictConfig], object] | None = None) -> DictConfig:
    """``cfg`` composed again (Hydra's compose API, inside a running app or an ``initialize`` block) with
    the testbed's choices for the composed task placed before the command line's ``overrides``; ``cfg``
    itself where none apply.

    ``check`` (the app's ``build``): the choices are a default, so where the rest of the run refuses them
    (per-cell credit beside ``likelihood=elbo``, which scores whole sequences) they are left out, with a
    log line saying why; an error the run has without them is left for the run to report."""
    from hydra import compose

    extra = task_choices(cfg, str(choices.get("task")), groups_chosen(overrides, choices, conf_dir), conf_dir)
    extra = [e for e in extra if choices.get(e.split("=", 1)[0]) != e.split("=", 1)[1]]
    if not extra:
        return cfg
    out = compose(config_name=config_name, overrides=[*extra, *overrides])
    where = f"testbed on {choices.get('task')}: {' '.join(extra)} (conf/testbed/{choices.get('testbed')}.yaml)"
    if check is not None:
        try:
            check(out)
        except ConfigError as refused:
            try:
                check(cfg)
            except ConfigError:
                pass  # wrong without the choices too: the run reports its own error
            else:
                log.info("%s left out: %s", where, refused)
                return cfg
        except Exception:  # noqa: BLE001 - not a config error (a missing data file, ...): the run reports it
            pass
    log.info("%s; the command line or experiment= chooses otherwise", where)
    return out
