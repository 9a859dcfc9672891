"""Adding an objective is one file and one yaml: the README's example objective, registered and trained."""

import csv
import re
import sys

from diffusion_rl.app.conf_store import register_configs
from diffusion_rl.app.train import train
from diffusion_rl.core.registry import discover
from tests.conftest import ROOT
from tests.helpers.common import compose_cfg


def readme_example() -> tuple[str, str]:
    """The python and yaml blocks of the README's "Adding an objective" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Adding an objective"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    yaml = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return code, yaml


def test_readme_objective_registers_from_its_own_file_and_trains(tmp_path, monkeypatch):
    import diffusion_rl.rl.objectives as objectives
    from diffusion_rl.rl.objectives import OBJECTIVES

    code, yaml = readme_example()
    assert len(code.strip().splitlines()) <= 30
    pkg = tmp_path / "plugin"
    pkg.mkdir()
    (pkg / "reinforce.py").write_text(code)
    conf = tmp_path / "conf" / "objective"
    conf.mkdir(parents=True)
    (conf / "reinforce.yaml").write_text(yaml)
    monkeypatch.setattr(objectives, "__path__", [*objectives.__path__, str(pkg)])  # "a file in objectives/"
    monkeypatch.setattr(OBJECTIVES, "_items", dict(OBJECTIVES._items))  # the registration ends with the test
    monkeypatch.delitem(sys.modules, f"{objectives.__name__}.reinforce", raising=False)
    discover(objectives.__name__, objectives.__path__)
    assert "reinforce" in OBJECTIVES
    register_configs()  # the new config dataclass becomes base_reinforce
    cfg = compose_cfg(["objective=reinforce", f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                       "eval.before=false", "eval.after=false"], tmp_path)
    assert cfg.objective.name == "reinforce" and cfg.objective.mu == 1  # the dataclass's defaults
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 4
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert all(float(r["grad/norm"]) >= 0 for r in rows if r.get("grad/norm"))
    assert any(float(r["train/kl"]) > 0 for r in rows if r.get("train/kl"))  # the shared KL anchor acts
