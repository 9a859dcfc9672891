"""The offline report on hand-written run folders: plots, labels, numbers, failed runs."""

import csv
import json
import math
import statistics
import subprocess
import sys

import pytest

from diffusion_rl.report.build import build_report, find_runs, run_labels
from tests.helpers.common import CONF

ROOT = CONF.parent
COLUMNS = ["step", "grad/norm", "grad/norm_ema", "grad/spike", "grad/spikes_total", "train/reward",
           "ratio/log_std", "ratio/log_max", "weights/ess", "train/skipped_updates"]


def write_run(folder, overrides, norms, spikes, rewards, summary=None, failure=None, skipped=0, log_max=None):
    """A run folder as train() leaves it: metrics.csv (rollout metrics every 2nd row), .hydra, summary."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    total = 0
    with open(folder / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for i, (n, s) in enumerate(zip(norms, spikes)):
            total += s
            w.writerow({"step": i + 1, "grad/norm": n, "grad/norm_ema": n, "grad/spike": float(s),
                        "grad/spikes_total": float(total), "train/reward": rewards[i // 2] if i % 2 == 0 else "",
                        "ratio/log_std": 0.1 * (i + 1), "weights/ess": 4.0 - 0.1 * i,
                        "ratio/log_max": "" if log_max is None else log_max[i],
                        "train/skipped_updates": float(skipped)})
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if failure is not None:
        (folder / "failed.json").write_text(json.dumps(failure))


@pytest.fixture
def multirun(tmp_path):
    root = tmp_path / "multirun"
    write_run(root / "0_objective.eps=5", ["objective=stabledrl", "objective.eps=5", "seed=0"],
              norms=[1, 1, 1, 1, 1, 1, 1, 1], spikes=[0] * 8, rewards=[0.1, 0.2, 0.3, 0.4],
              summary={"before": {"cell_accuracy": 0.5, "solved_rate": 0.1},
                       "after": {"cell_accuracy": 0.625, "solved_rate": 0.2}, "skipped_updates": 0,
                       "optimizer_steps": 8})
    write_run(root / "1_objective.eps=100", ["objective=stabledrl", "objective.eps=100", "seed=0"],
              norms=[1, 1, 1, 1, 1, 12.5, 1, 30], spikes=[0, 0, 0, 0, 0, 1, 0, 1], rewards=[0.4, 0.3, 0.2, 0.0],
              summary={"before": {"cell_accuracy": 0.5}, "after": {"cell_accuracy": 0.25},
                       "skipped_updates": 3, "optimizer_steps": 8}, skipped=3)
    write_run(root / "2_objective.eps=1000", ["objective=stabledrl", "objective.eps=1000", "seed=0"],
              norms=[1, 50], spikes=[0, 1], rewards=[0.3],
              failure={"type": "RuntimeError", "error": "51 consecutive updates had a non-finite loss"})
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def test_labels_are_the_overrides_that_differ():
    ovs = [["objective=stabledrl", "objective.eps=5", "seed=0"], ["objective=stabledrl", "objective.eps=100", "seed=0"]]
    assert run_labels(ovs, ["a", "b"]) == ["eps=5", "eps=100"]
    ovs = [["ablation=clip_only", "eps=5", "seed=0"], ["ablation=stabledrl", "eps=5", "seed=1"]]
    assert run_labels(ovs, ["a", "b"]) == ["ablation=clip_only,seed=0", "ablation=stabledrl,seed=1"]
    # the same last component under two keys: keep the full keys
    ovs = [["objective.eps=5", "likelihood.eps=1"], ["objective.eps=100", "likelihood.eps=2"]]
    assert run_labels(ovs, ["a", "b"]) == ["objective.eps=5,likelihood.eps=1", "objective.eps=100,likelihood.eps=2"]
    assert run_labels([["seed=0"], ["seed=0"]], ["a", "b"]) == ["a", "b"]  # nothing differs: folder names
    assert run_labels([["paths.cache_dir=/x", "seed=0"], ["paths.cache_dir=/y", "seed=0"]], ["a", "b"]) == ["a", "b"]


def test_report_on_two_runs_and_a_failed_one(multirun):
    report, runs = build_report(multirun)
    assert [r.label for r in runs] == ["eps=5", "eps=100", "eps=1000"]
    out = multirun / "report"
    for name in ("grad_norm.png", "reward.png", "ratio_log_std.png", "ess.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    text = report.read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| eps=")}
    # run | status | steps | spikes | max grad norm | final reward (last 5) | held-out before -> after | skipped
    # | ratios clipped (none logged here)
    assert rows["eps=5"] == "| eps=5 | ok | 8 | 0 | 1.000 | 0.250 | 0.500 -> 0.625 | 0 | - |"
    assert rows["eps=100"] == "| eps=100 | ok | 8 | 2 | 30.000 | 0.225 | 0.500 -> 0.250 | 3 | - |"
    assert rows["eps=1000"].startswith("| eps=1000 | failed: RuntimeError: 51 consecutive updates had a non-finite loss |")
    assert "| 1 | 50.000 | 0.300 | - |" in rows["eps=1000"]  # what it logged before failing
    assert "held-out cell_accuracy before -> after" in text
    assert "3 runs, 1 failed" in text
    assert "![pre-clip gradient norm (x = spike; dotted: optim.grad_clip)](grad_norm.png)" in text


def test_a_run_without_summary_or_failed_json_is_failed_not_a_crash(tmp_path):
    run = tmp_path / "run"
    write_run(run, ["objective=grpo"], norms=[1.0], spikes=[0], rewards=[0.5])
    report, runs = build_report(run)
    assert runs[0].failed and runs[0].label == "run"
    assert "failed: no summary.json (crashed, interrupted or still running)" in report.read_text()
    assert (run / "report" / "grad_norm.png").exists()  # what it logged is still plotted
    (run / "metrics.csv").unlink()  # nothing logged at all
    report, _ = build_report(run)
    assert "failed" in report.read_text()


def test_find_runs_skips_the_report_and_orders_by_job_number(multirun):
    (multirun / "10_objective.eps=7" / ".hydra").mkdir(parents=True)
    (multirun / "10_objective.eps=7" / ".hydra" / "overrides.yaml").write_text("- objective.eps=7\n")
    names = [p.name for p in find_runs(multirun)]
    assert names == ["0_objective.eps=5", "1_objective.eps=100", "2_objective.eps=1000", "10_objective.eps=7"]


def test_entry_point_prints_the_table(multirun, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "src" / "report.py"), str(multirun), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| eps=100 | ok |" in out.stdout and (tmp_path / "r" / "report.md").exists()
    bad = subprocess.run([sys.executable, str(ROOT / "src" / "report.py"), str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == f"report error: folder='{tmp_path / 'nothing'}' is invalid: holds no run folder (a folder with .hydra/)"


def test_cost_plots_and_table_when_runs_log_the_rollouts_cost(tmp_path):
    root = tmp_path / "multirun"
    for i, (decode, forwards) in enumerate((("fixed", 128.0), ("threshold", 30.0))):
        run = root / f"{i}_sampler.decode={decode}"
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- sampler.decode={decode}\n")
        with open(run / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, ["step", "grad/norm", "time/rollout_s", "time/update_s", "rollout/forwards_per_sample",
                                   "rollout/tokens_per_forward", "rollout/mismatch_log_ratio"])
            w.writeheader()
            for step in range(1, 4):
                w.writerow({"step": step, "grad/norm": 1.0, "time/rollout_s": 4.0 / (i + 1) + step, "time/update_s": 1.0,
                            "rollout/forwards_per_sample": forwards, "rollout/tokens_per_forward": 256 / forwards,
                            "rollout/mismatch_log_ratio": 0.01 * i * step})
        (run / "summary.json").write_text(json.dumps({"optimizer_steps": 3, "fit_s": 30.0 / (i + 1)}))
    report, _ = build_report(root)
    text = report.read_text()
    for name in ("mismatch.png", "forwards.png", "rollout_time.png", "update_time.png"):
        assert (root / "report" / name).read_bytes()[:4] == b"\x89PNG" and f"]({name})" in text
    assert "| decode=fixed | 6.000 | 1.000 | 128.000 | 2.000 | 0.000 | 30.000 |" in text
    assert "| decode=threshold | 4.000 | 1.000 | 30.000 | 8.533 | 0.020 | 15.000 |" in text



def test_single_run_panels_heldout_kl_entropy_smoothed_reward_and_no_constant_panel(tiny_run, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    import diffusion_rl.report.build as report_mod

    figures = {}
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.setdefault(fig.axes[0].get_title(), fig))
    run, summary = tiny_run  # GRPO, mu=1: the log-ratio spread is 0 at every step
    report, runs = build_report(run, tmp_path / "rep")
    files = sorted(p.name for p in (tmp_path / "rep").glob("*.png"))
    assert files == ["entropy.png", "grad_norm.png", "heldout.png", "kl.png", "mismatch.png", "reward.png",
                     "rollout_time.png", "update_time.png"]  # GRPO: beta=0.04; forwards constant (exact sampler)
    text = report.read_text()
    assert "Not plotted, constant in every run: `ratio/log_std` (0 at every step)" in text
    held = figures["held-out metrics: validation split during RL (lines), test split before / after (diamonds)"].axes[0]
    lines = {ln.get_label(): ln for ln in held.get_lines()}
    names = {"cell_accuracy", "solved_rate", "valid_rate"}  # the task's metrics, not its reward
    assert set(lines) == names | {f"{n} (test)" for n in names}
    assert list(lines["cell_accuracy"].get_xdata()) == [0, 2, 4]  # validation: before RL, every 2 steps
    test = lines["cell_accuracy (test)"]
    assert list(test.get_xdata()) == [0, 5]  # the test split before and after RL
    assert test.get_ydata()[0] == pytest.approx(summary["before"]["cell_accuracy"])
    assert test.get_ydata()[-1] == pytest.approx(summary["after"]["cell_accuracy"])
    reward = figures["mean rollout reward (line: EMA; faint: each rollout)"].axes[0].get_lines()
    raw, smooth = reward  # the raw values faint behind the smoothed line
    assert raw.get_alpha() == report_mod.RAW_ALPHA and smooth.get_alpha() is None
    assert list(raw.get_ydata()) == [v for _, v in runs[0].metrics["train/reward"]]
    assert list(smooth.get_ydata()) == pytest.approx(report_mod.ema(list(raw.get_ydata()), 0.9))
    monkeypatch.setattr(plt, "close", real_close)
    for fig in figures.values():
        real_close(fig)


def test_kl_panel_appears_with_a_reference_policy(tmp_path):
    run = tmp_path / "run"
    write_run(run, ["objective.beta=0.04"], norms=[1, 2, 1, 2], spikes=[0] * 4, rewards=[0.1, 0.2])
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    with open(run / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, [*COLUMNS, "train/kl", "train/entropy"])
        w.writeheader()
        for i, r in enumerate(rows):
            w.writerow({**r, "train/kl": 0.001 * i, "train/entropy": 1.0 - 0.1 * i})
    build_report(run)
    assert {"kl.png", "entropy.png", "ratio_log_std.png", "ess.png"} <= {p.name for p in (run / "report").glob("*.png")}


def test_ema_is_debiased_and_smooths():
    from diffusion_rl.report.build import ema

    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0 at the start
    out = ema([0.0, 1.0] * 20, 0.9)
    assert max(out[-10:]) - min(out[-10:]) < 0.2 and out[-1] == pytest.approx(0.5, abs=0.1)


# each update's largest log-ratio, per condition and seed (condition b logs none)
LOG_MAX = {"a": [[0.5, 4.0, 1.0, 2.0], [3.0, 0.25, 9.5, 1.5]], "b": [None, None]}


@pytest.fixture
def seeded(tmp_path):
    """Two conditions x two seeds, each run with its after-RL per-item test rewards."""
    root = tmp_path / "seeded"
    items = {"a": [[1.0, 1.0, 0.5, 0.5], [1.0, 0.5, 1.0, 1.0]], "b": [[0.5, 0.5, 0.5, 0.0], [0.5, 0.5, 1.0, 0.5]]}
    for job, (cond, seed) in enumerate([("a", 0), ("a", 1), ("b", 0), ("b", 1)]):
        folder = root / f"{job}_ablation={cond},seed={seed}"
        scores = items[cond][seed]
        write_run(folder, [f"ablation={cond}", f"seed={seed}"], norms=[1, 2, 3, 4], spikes=[0, 0, 0, 1],
                  rewards=[0.5, 0.6], log_max=LOG_MAX[cond][seed],
                  summary={"before": {"cell_accuracy": 0.5}, "after": {"cell_accuracy": sum(scores) / 4},
                           "optimizer_steps": 4, "skipped_updates": 0, "config": {"seed": seed, "optim": {"grad_clip": 2.0}}})
        (folder / "eval_generations.jsonl").write_text("".join(json.dumps({"reward": v}) + "\n" for v in scores))
    return root


def test_seeds_are_aggregated_with_mean_sd_bands_and_paired_bootstrap(seeded, monkeypatch):
    import matplotlib.pyplot as plt

    from diffusion_rl.report.groups import group_runs, paired_bootstrap

    figures = {}
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.setdefault(fig.axes[0].get_title(), fig))
    report, runs = build_report(seeded)
    groups = group_runs(runs)
    assert list(groups) == ["ablation=a", "ablation=b"] and all(len(g) == 2 for g in groups.values())
    text = report.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| ablation=a |"))
    # after: seed 0 0.75, seed 1 0.875 -> mean 0.8125, sd 0.0884; gain 0.3125
    assert "| 2/2 | 0.500 ± 0.000 | 0.812 ± 0.088 | 0.312 ± 0.088 |" in row
    # largest log-ratio over a's 8 updates, both seeds pooled: sorted 0.25 0.5 1 1.5 | 2 3 4 9.5 -> median 1.75
    head = next(line for line in text.splitlines() if line.startswith("| condition | seeds ok |"))
    column = [c.strip() for c in head.split("|")].index("largest log-ratio: median update, max")
    cells = {cond: [c.strip() for c in line.split("|")][column] for cond in "ab"
             for line in text.splitlines() if line.startswith(f"| ablation={cond} | 2/2 |")}
    assert cells == {"a": "1.75, 9.50", "b": "-"}  # b logged no ratio
    mean, lo, hi, n = paired_bootstrap(groups["ablation=b"], groups["ablation=a"])
    assert n == 2 and mean == pytest.approx((1.5 - 3.0 + 2.5 - 3.5) / 8)  # per-item differences, pooled
    assert lo <= mean <= hi < 0  # b is worse on every seed: the interval excludes 0
    assert "| ablation=b | 2 | -0.3125 |" in text
    grad = figures["pre-clip gradient norm (x = spike; dotted: optim.grad_clip) (line: mean over seeds; band: their range)"].axes[0]
    assert any(line.get_label() == "clip threshold 2" for line in grad.get_lines())
    assert len(grad.collections) == 2  # one band per condition
    for fig in figures.values():
        real_close(fig)


def test_t_interval_hand_computed_and_the_verdict_follows_it():
    from diffusion_rl.report.groups import t_interval, verdict

    mean, lo, hi = t_interval([1.0, 2.0, 3.0])  # sd 1, n 3: half-width t(2) / sqrt(3) = 4.303 / 1.732
    assert mean == 2.0 and hi - mean == pytest.approx(4.303 / math.sqrt(3), rel=1e-4) and mean - lo == hi - mean
    assert t_interval([1.0]) is None
    assert verdict((0.5, 0.1, 0.9)) == "above 0" and verdict((-0.5, -0.9, -0.1)) == "below 0"
    assert verdict((0.5, -0.1, 1.1)) == "cannot tell"


def test_seed_table_pairs_runs_by_seed(seeded):
    _, runs = build_report(seeded)
    from diffusion_rl.report.groups import group_runs, seed_table

    table = seed_table(group_runs(runs))
    row_b = next(line for line in table.splitlines() if line.startswith("| ablation=b |"))
    # b - a after RL: seed 0 0.375 - 0.75, seed 1 0.625 - 0.875: mean -31.25 points, sd 8.84
    half = 12.706 * statistics.stdev([-37.5, -25.0]) / math.sqrt(2)
    assert f"{-31.25:+.1f} [{-31.25 - half:+.1f}, {-31.25 + half:+.1f}]" in row_b and "cannot tell" in row_b
    row_a = next(line for line in table.splitlines() if line.startswith("| ablation=a |"))
    assert "reference" in row_a and "+31.2 [" in row_a  # gains over the warm start of 0.5: 25 and 37.5 points


def test_a_recorded_experiment_opens_with_its_intro_and_regenerates_it(multirun):
    """docs/results/*: the question, answer and command (INTRO.md beside the runs) come first, and
    regenerating the report from the committed runs keeps them."""
    intro = "# What eps does\n\n**Question.** Does it act? **Answer.** No. **Command.** `python src/train.py -m ...`"
    (multirun / "INTRO.md").write_text(intro + "\n")
    for _ in range(2):
        report, _ = build_report(multirun, multirun / "report")
        text = report.read_text()
        assert text.startswith(intro + "\n\n") and "# Report:" not in text
    (multirun / "INTRO.md").unlink()
    assert build_report(multirun)[0].read_text().startswith(f"# Report: {multirun}")


def test_numbers_in_tables_stay_readable_when_a_gradient_explodes():
    from diffusion_rl.report.runs import fmt

    assert fmt(0.8567) == "0.857" and fmt(984.4112) == "984.411" and fmt(6.974e18) == "6.97e+18"
    assert fmt(float("nan")) == "-" and fmt(None) == "-"


def test_the_report_names_the_environment_and_where_runs_differ_in_it(tmp_path):
    def env(torch_version, threads, commit, dirty):
        return {"python": "3.11.9", "packages": {"torch": torch_version, "lightning": "2.6.0"},
                "torch_threads": threads, "cpu": "cpu A", "gpu": None, "platform": "Linux",
                "source": {"commit": commit, "dirty": dirty}}
    root = tmp_path / "multirun"
    base = {"before": {"cell_accuracy": 0.5}, "after": {"cell_accuracy": 0.6}, "optimizer_steps": 2}
    write_run(root / "0_seed=0", ["seed=0"], norms=[1, 1], spikes=[0, 0], rewards=[0.1],
              summary={**base, "environment": env("2.13.0+cpu", 1, "a" * 40, False)})
    write_run(root / "1_seed=1", ["seed=1"], norms=[1, 1], spikes=[0, 0], rewards=[0.1],
              summary={**base, "environment": env("2.12.0+cpu", 1, "b" * 40, True)})
    write_run(root / "2_seed=2", ["seed=2"], norms=[1, 1], spikes=[0, 0], rewards=[0.1], summary=base)
    text = build_report(root)[0].read_text()
    line = next(x for x in text.splitlines() if x.startswith("Environment:"))
    assert "python 3.11.9" in line and "torch_threads 1" in line and "lightning 2.6.0" in line
    assert "`torch` (2.12.0+cpu, 2.13.0+cpu)" in line
    assert "`commit` (aaaaaaaaaa, bbbbbbbbbb+modified)" in line
    assert "Not recorded for 1 of 3 runs." in line
    assert "gpu" not in line  # None in every run: nothing to say


def test_runs_in_one_environment_get_a_line_without_differences(tmp_path, multirun):
    assert "Environment:" not in build_report(multirun)[0].read_text()  # none of these runs recorded one
    env = {"python": "3.11.9", "packages": {"torch": "2.13.0+cpu"}, "torch_threads": 2, "cpu": "cpu A",
           "gpu": None, "platform": "Linux", "source": None}
    root = tmp_path / "same"
    for seed in (0, 1):
        write_run(root / f"{seed}_seed={seed}", [f"seed={seed}"], norms=[1, 1], spikes=[0, 0], rewards=[0.1],
                  summary={"after": {"cell_accuracy": 0.6}, "optimizer_steps": 2, "environment": env})
    line = next(x for x in build_report(root)[0].read_text().splitlines() if x.startswith("Environment:"))
    assert line == "Environment: python 3.11.9, torch_threads 2, cpu cpu A, torch 2.13.0+cpu."
