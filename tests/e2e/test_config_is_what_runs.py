"""What you see is what runs: the config a command line trains with is Hydra's composition, the one
``--cfg job`` prints and ``.hydra/config.yaml`` holds, and ``summary.json`` keeps it with the source of
each value (diffusion_rl/app/sources.py).

Every training command of the README's "Everyday commands" (``trainer.max_steps=1``; every job of a
sweep) and every objective x task pair on the embedded model runs through the real entry point with
``train()`` replaced by a recorder (``tests/helpers/record_config.py``), and each job's config is compared
with Hydra's composition of that job's overrides. One real run checks ``summary.json`` end to end.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from tests.conftest import CONF, FIXTURES, ROOT
from tests.helpers.record_config import RECORDED

OBJECTIVES = sorted(p.stem for p in (CONF / "objective").glob("*.yaml"))
TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))


def readme_training_commands() -> list[list[str]]:
    """The arguments of each ``python src/train.py`` line of the README's "Everyday commands" block that
    trains (not ``--cfg job`` or ``--explain``, which print and stop)."""
    text = (ROOT / "README.md").read_text().split("## Everyday commands", 1)[1]
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        command = line.split("  #", 1)[0].strip()
        if command.startswith("python src/train.py") and "..." not in command and " --" not in command:
            out.append(shlex.split(command.replace("$DATA", str(FIXTURES / "mbpp")))[2:])
    return out


def resolved(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def run_recorder(cases: list[list[str]], cwd: Path) -> list[dict]:
    (cwd / "cases.json").write_text(json.dumps([{"argv": ["src/train.py", *a]} for a in cases]))
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "HOME": str(cwd), "WANDB_MODE": "offline"}
    subprocess.run([sys.executable, "-m", "tests.helpers.record_config", "cases.json", "out.json"], cwd=cwd, env=env,
                   check=True, timeout=1200)
    return json.loads((cwd / "out.json").read_text())


def check_jobs(root: Path, expected_jobs: int) -> None:
    """Each job under ``root`` trained with the config Hydra composed for it, the one it wrote to
    ``.hydra/config.yaml`` before the job ran (``--cfg job`` prints the same composition), and the sources
    it recorded end at that config's values."""
    folders = sorted(p.parent for p in root.rglob(RECORDED))
    assert len(folders) == expected_jobs, (root, len(folders), expected_jobs)
    for folder in folders:
        recorded = json.loads((folder / RECORDED).read_text())
        hydras = OmegaConf.load(folder / ".hydra" / "config.yaml")
        assert recorded["config"] == resolved(hydras), folder  # what runs is Hydra's composition, nothing else
        written = OmegaConf.to_container(hydras, resolve=False)  # interpolations as written, as the sources keep them
        for key, settings in recorded["config_sources"]["values"].items():
            value = written
            for part in key.split("."):
                value = value[part]
            assert settings[-1][1] == value, (folder, key, settings)


def experiment_sweep(name: str) -> dict[str, str]:
    """An experiment's sweeper params, with those of the experiments it builds on (plain entries of its
    defaults list, same group) under its own."""
    spec = yaml.safe_load((CONF / "experiment" / f"{name}.yaml").read_text())
    params = {}
    for entry in spec.get("defaults") or []:
        if isinstance(entry, str) and (CONF / "experiment" / f"{entry}.yaml").exists():
            params.update(experiment_sweep(entry))
    params.update({k: str(v) for k, v in ((spec.get("hydra") or {}).get("sweeper", {}).get("params", {}) or {}).items()})
    return params


def one_job(args: list[str]) -> list[str]:
    """A sweep's command line cut to its first job: each swept key (its own comma lists and its experiment's
    sweeper params) at its first value. The jobs of a sweep differ only in those keys, and the pairs test
    below runs every objective on every task."""
    experiment = next((a.split("=", 1)[1] for a in args if a.startswith("experiment=")), None)
    params = experiment_sweep(experiment) if experiment else {}
    for a in args:
        key, _, value = a.partition("=")
        if "," in value and not value.startswith("["):
            params[key] = value
    kept = [a for a in args if a.partition("=")[0] not in params]
    return kept + [f"{k}={v.split(',')[0]}" for k, v in params.items()]


def test_every_readme_training_command_runs_the_config_hydra_composes(tmp_path):
    commands = readme_training_commands()
    assert len(commands) >= 15 and ["objective=stabledrl", "task=sudoku"] in commands
    cases = []
    for i, args in enumerate(commands):
        args = [a for a in args if not a.startswith("hydra.run.dir=")] + ["trainer.max_steps=1"]
        if "-m" in args:  # its first job, in one process: the recorder
            args = one_job(args) + [f"hydra.sweep.dir={tmp_path / str(i)}", "hydra/launcher=basic"]
        else:
            args += [f"hydra.run.dir={tmp_path / str(i)}"]
        cases.append(args)
    results = run_recorder(cases, tmp_path)
    for i, (args, res) in enumerate(zip(cases, results, strict=True)):
        assert res["rc"] == 0, (args, res["stderr"][-3000:])
        check_jobs(tmp_path / str(i), 1)


def test_every_objective_on_every_task_runs_the_config_hydra_composes(tmp_path):
    sweep = ["-m", f"objective={','.join(OBJECTIVES)}", f"task={','.join(TASKS)}", "trainer.max_steps=1",
             f"hydra.sweep.dir={tmp_path / 'pairs'}", "hydra.sweep.subdir=${hydra.runtime.choices.objective}_${hydra.runtime.choices.task}"]
    # and what --cfg job prints, for the default job of each seed objective; and what --explain prints
    seeds = ("grpo", "stabledrl", "egspo", "egspo_sa")
    printed = [[f"objective={o}", "task=sudoku", "trainer.max_steps=1", "--cfg", "job"] for o in seeds]
    explained = [[*args, "--explain"] for args, _ in EXPLAINED]
    results = run_recorder([sweep, *printed, *explained], tmp_path)
    assert results[0]["rc"] == 0, results[0]["stderr"][-3000:]
    check_jobs(tmp_path / "pairs", len(OBJECTIVES) * len(TASKS))
    for o, res in zip(seeds, results[1:]):
        assert res["rc"] == 0, res["stderr"][-2000:]
        shown = OmegaConf.create(res["stdout"])
        assert resolved(shown) == resolved(OmegaConf.load(tmp_path / "pairs" / f"{o}_sudoku" / ".hydra" / "config.yaml"))
    for (args, wanted), res in zip(EXPLAINED, results[1 + len(seeds):]):
        assert res["rc"] == 0, res["stderr"][-2000:]
        for pattern in wanted:  # where each value comes from, printed without running
            assert re.search(pattern, res["stdout"]), (args, pattern, res["stdout"])
    assert not (tmp_path / "outputs").exists()  # --cfg job and --explain ran nothing


EXPLAINED = [
    (["objective=grpo", "task=sudoku"], [r"optim=d1 +conf/objective/grpo.yaml",
                                         r"advantage.credit = 'token' +conf/testbed/tiny_grpo_sudoku.yaml",
                                         r"objective.mu = 1 +conf/testbed/tiny_grpo.yaml +\(over conf/recipe/grpo_sudoku.yaml: 8\)"]),
    (["-m", "experiment=stabledrl_eps"], [r"objective.beta = 0.0 +conf/experiment/stabledrl_eps.yaml "
                                          r"+\(over conf/testbed/tiny_stabledrl.yaml: 0.04\)"]),
]


def test_a_run_keeps_its_config_and_where_each_value_came_from(tmp_path):
    """One real training run of the default job, shrunk: summary.json's config is .hydra/config.yaml's and
    the --cfg job output's, and the run says which values the testbed set (the variant it is)."""
    from tests.helpers.common import TINY

    args = ["objective=grpo", "task=sudoku", *TINY, "trainer.max_steps=1", "eval.every_n_steps=0",
            f"paths.cache_dir={tmp_path / 'cache'}"]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, str(ROOT / "src" / "train.py"), *args, f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = subprocess.run([sys.executable, str(ROOT / "src" / "train.py"), *args, "--cfg", "job"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"] == resolved(OmegaConf.create(shown.stdout))
    assert summary["config"] == resolved(OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml"))
    sources = summary["config_sources"]
    assert sources["variant"]["conf/testbed/tiny_grpo_sudoku.yaml"] == {"advantage.credit": "token", "objective.beta": 0.002}
    assert sources["variant"]["conf/testbed/tiny_grpo.yaml"] == {"objective.mu": 1, "optim.lr": 3.0e-4}
    assert sources["values"]["optim.lr"] == [["dataclass", 3.0e-4], ["conf/optim/d1.yaml", 3.0e-6],
                                             ["conf/testbed/tiny_grpo.yaml", 3.0e-4]]
    assert sources["choices"]["optim=d1"] == "conf/objective/grpo.yaml"
    assert sources["choices"]["objective=grpo"] == "command line"
    printed = next(ln for ln in run.stdout.splitlines() if ln.startswith("  variant: "))  # the printed summary too
    assert "conf/testbed/tiny_grpo.yaml: optim.lr=0.0003 objective.mu=1" in printed
    assert "conf/testbed/tiny_grpo_sudoku.yaml: advantage.credit='token' objective.beta=0.002" in printed
    log = (tmp_path / "run" / "train.log").read_text()
    assert re.search(r"variant: .*conf/testbed/tiny_grpo_sudoku.yaml: advantage.credit='token' objective.beta=0.002", log)
    assert re.search(r"optim.lr = 0.0003 +conf/testbed/tiny_grpo.yaml +\(over conf/optim/d1.yaml: 3e-06\)", log)
