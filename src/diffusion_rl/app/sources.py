"""Where each value of a run's config comes from: ``python src/train.py <overrides> --explain``.

The run's config is Hydra's composition, nothing else (``--cfg job`` prints it, ``.hydra/config.yaml``
and ``summary.json`` hold it). Hydra merges, in the defaults list's order, the dataclass defaults
(``base_*`` nodes, :mod:`diffusion_rl.app.conf_store`), the config-group files (``conf/config.yaml``
names them: an objective's file may choose its optimiser, advantage and likelihood; the public code's
per-task ``recipe/`` and the embedded model's ``testbed/`` follow), an ``experiment=`` file, and last the
command line. :func:`config_sources` replays that merge one config at a time with Hydra's own defaults
list and loader, and records which of them set each key and to what; :func:`explain` renders it. The
training app logs the same table at start-up and keeps it in ``summary.json`` (``config_sources``), so a
run says where each of its non-default values came from.

Hydra keeps no such record itself: this module reads its defaults list through the config loader's
internal methods (``hydra-core`` is pinned below 1.4; ``tests/unit/app/test_sources.py`` checks the replay
against Hydra's own composition for every objective and task).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

COMMAND_LINE = "command line"
DATACLASS = "dataclass"


@dataclass
class Sources:
    """What set a composed config: for each leaf key (``optim.lr``), every ``(source, value)`` that set it in
    merge order, the last one the value that runs (values as written: an interpolation stays ``${...}``);
    for each config group chosen, its option and what chose it."""

    values: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    choices: list[tuple[str, str, str]] = field(default_factory=list)  # (group, option, chosen by)

    def set_over_defaults(self) -> dict[str, list[tuple[str, Any]]]:
        """The keys whose value does not come from a dataclass default, with every setting of them."""
        return {k: s for k, s in self.values.items() if s[-1][0] != DATACLASS}

    def variant(self) -> dict[str, dict[str, Any]]:
        """What a run sets beyond the public code's regime and its set-up, by source: the embedded model's
        testbed files, an experiment's files and the command line (``{source: {key: value}}``)."""
        out: dict[str, dict[str, Any]] = {}
        for key, settings in self.set_over_defaults().items():
            src, value = settings[-1]
            if src == COMMAND_LINE or src.split("/")[1:2] in (["testbed"], ["experiment"], ["ablation"]):
                out.setdefault(src, {})[key] = value
        return out

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps: each group's option and chooser, each key set over a dataclass
        default with its settings (``[source, value]`` in merge order)."""
        return {"choices": {f"{g}={o}": by for g, o, by in self.choices},
                "values": {k: [[src, v] for src, v in s] for k, s in self.set_over_defaults().items()},
                "variant": self.variant()}

    def header(self, cfg: DictConfig) -> list[str]:
        """The run's start-up lines: the variant it runs, then every value set over a dataclass default."""
        testbed = any(src.split("/")[1:2] == ["testbed"] for src in self.variant())
        lines = [f"variant: {variant_text(self.variant())}" + (" (the testbed's settings are the embedded model's, "
                                                              "not the public code's: ~testbed drops them)" if testbed else "")]
        return lines + ["values set over the dataclass defaults (key = value: set by; earlier settings; "
                        "--explain prints these for a command line without running it):"] + format_values(self, cfg)


def variant_text(variant: dict[str, dict[str, Any]]) -> str:
    """``source: key=value ...; source: ...`` (:meth:`Sources.variant`, or as ``summary.json`` keeps it)."""
    return "; ".join(f"{src}: {' '.join(f'{k}={_short(v)}' for k, v in kv.items())}" for src, kv in variant.items()) \
        or "none"


def config_sources(conf_dir: Path, overrides: Sequence[str], config_name: str = "config") -> Sources:
    """Replay Hydra's composition of ``config_name`` with ``overrides`` and record who set what. The
    dataclass nodes must be stored (``conf_store.register_configs``: the entry points do it at import)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.defaults_list import create_defaults_list
    from hydra._internal.utils import create_config_search_path

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf_dir)))
    parsed, repo = loader._parse_overrides_and_create_caching_repo(config_name, list(overrides))
    defaults = create_defaults_list(repo=repo, config_name=config_name, overrides_list=parsed, prepend_hydra=True,
                                    skip_missing=False)
    chosen_by = defaults.overrides.override_metadata  # group -> the command line or the config that overrode it
    out = Sources()
    for d in defaults.defaults:
        path, parent = str(d.config_path), str(d.parent)
        if path.startswith("hydra/") or str(d.package).startswith("hydra"):
            continue  # Hydra's own settings (launcher, output folders)
        label = _label(conf_dir, path)
        group, _, option = path.rpartition("/")
        if group and not option.startswith("base_"):
            meta = chosen_by.get(group) if parent.rpartition("/")[0] != group else None  # not a file it extends
            chooser = _label(conf_dir, parent) if meta is None else \
                COMMAND_LINE if meta.external_override else _label(conf_dir, str(meta.containing_config_path))
            out.choices.append((group, option, chooser))
        loaded = loader._load_single_config(default=d, repo=repo)
        for key, value in _leaves(loaded.config):
            if key != "defaults" and not key.startswith(("hydra.", "defaults.")):
                out.values.setdefault(key, []).append((label, value))
    for o in defaults.config_overrides:
        if o.is_delete():  # ~key: the key and everything below it
            for key in [k for k in out.values if k == o.key_or_group or k.startswith(f"{o.key_or_group}.")]:
                del out.values[key]
            continue
        value = o.value()
        for key, leaf in _leaves(OmegaConf.create({"v": value}).v, o.key_or_group) if isinstance(value, dict) \
                else [(o.key_or_group, value)]:
            out.values.setdefault(key, []).append((COMMAND_LINE, leaf))
    return out


def explain(conf_dir: Path, overrides: Sequence[str], config_name: str = "config", command: str = "src/train.py") -> str:
    """The text ``--explain`` prints: each config group's option and what chose it, then each value set over
    its dataclass default, by whom, over which earlier settings."""
    from hydra import compose, initialize_config_dir

    src = config_sources(conf_dir, overrides, config_name)
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    lines = [f"python {command} {' '.join(overrides)}".rstrip(), "", "config groups (group=option: chosen by):"]
    width = max((len(f"{g}={o}") for g, o, _ in src.choices), default=0)
    lines += [f"  {f'{g}={o}':<{width}}  {by}" for g, o, by in src.choices]
    lines += ["", "values set over the dataclass defaults (key = value: set by; earlier settings):"]
    lines += format_values(src, cfg)
    lines += ["", f"Every other value is its dataclass default; `python {command} ... --cfg job` prints the whole config."]
    return "\n".join(lines)


def format_values(src: Sources, cfg: DictConfig | None = None) -> list[str]:
    """One line per key set over its dataclass default: ``key = value  source  (over source: value, ...)``;
    ``value`` is the composed one (``cfg``, interpolations resolved) where given."""
    rows = []
    for key, settings in src.set_over_defaults().items():
        value = settings[-1][1]
        if cfg is not None:
            node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
            value = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
        earlier = [f"{s}: {_short(v)}" for s, v in settings[:-1] if s != DATACLASS]
        rows.append((f"{key} = {_short(value)}", settings[-1][0], f"  (over {'; '.join(earlier)})" if earlier else ""))
    width = max((len(r[0]) for r in rows), default=0)
    return [f"  {a:<{width}}  {b}{c}" for a, b, c in rows]


def _label(conf_dir: Path, config_path: str) -> str:
    """``conf/<path>.yaml`` for a file under ``conf_dir``; a ConfigStore node (``base_*``) is the dataclass."""
    if (conf_dir / f"{config_path}.yaml").is_file():
        return f"{conf_dir.name}/{config_path}.yaml"
    return DATACLASS


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a config node (a list is one leaf), interpolations as written."""
    if not isinstance(node, DictConfig):
        return [(prefix, OmegaConf.to_container(node) if isinstance(node, ListConfig) else node)]
    out = []
    for key in map(str, node.keys()):
        child = node._get_node(key)
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(child, DictConfig) and not child._is_interpolation() and not child._is_none():
            out += _leaves(child, name)  # an empty mapping sets nothing (a group file's own node)
        elif isinstance(child, ListConfig) and not child._is_interpolation() and not child._is_none():
            out.append((name, OmegaConf.to_container(child, resolve=False)))
        else:
            out.append((name, child._value() if child is not None else None))  # type: ignore[union-attr]
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
