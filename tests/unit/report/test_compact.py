"""A recorded experiment compacted for the repository (report/compact.py, scripts/compact_results.py):
the report reads the compacted runs as it read the originals, every metric row and column is kept,
and compacting again changes nothing."""

import csv
import json
import lzma
import shutil
import subprocess
import sys

import pytest

from diffusion_rl.report.build import build_report
from diffusion_rl.report.compact import REPORT_WIDTH, compact_folder
from diffusion_rl.report.runs import find_runs, load_run
from tests.unit.report.test_report import ROOT, write_run

KEPT = ("summary.json", ".hydra/config.yaml", ".hydra/overrides.yaml", "train.log")


@pytest.fixture
def recorded(tmp_path):
    """Two conditions x two seeds as train() leaves them (generations, samples, Hydra's settings, a
    log), with per-item test rewards and metrics of float32 values written at double precision."""
    root = tmp_path / "recorded"
    items = {"a": [[1.0, 0.8181818127632141, 0.5, 0.5], [1.0, 0.5, 1.0, 1.0]],
             "b": [[0.5, 0.5, 0.5, 0.0], [0.5, 0.30000001192092896, 1.0, 0.5]]}
    for job, (cond, seed) in enumerate([("a", 0), ("a", 1), ("b", 0), ("b", 1)]):
        run = root / f"{job}_ablation={cond},seed={seed}"
        scores = items[cond][seed]
        write_run(run, [f"ablation={cond}", f"seed={seed}"], norms=[0.12345678901, 2.0000001, 1234.5678901, 4.25],
                  spikes=[0, 0, 1, 0], rewards=[0.8181818127632141, 0.6],
                  summary={"before": {"cell_accuracy": 0.5}, "after": {"cell_accuracy": sum(scores) / 4},
                           "optimizer_steps": 4, "skipped_updates": 0, "config": {"seed": seed}})
        (run / "eval_generations.jsonl").write_text(
            "".join(json.dumps({"prompt": "=", "completion": "1234", "reward": v}) + "\n" for v in scores))
        (run / "samples.jsonl").write_text(json.dumps({"step": 2, "completion": "1234", "reward": 0.5}) + "\n")
        (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  run:\n    dir: x\n")
        (run / "train.log").write_text("[2026-12-03 12:00:00,000][x][INFO] - started\n")
    return root


def test_a_compacted_folder_gives_the_same_report(recorded, tmp_path):
    original = tmp_path / "original"
    shutil.copytree(recorded, original)
    kept = {p.relative_to(recorded): p.read_bytes() for run in recorded.iterdir() for p in map(run.joinpath, KEPT)}
    done = compact_folder(recorded)
    assert done.runs == 4 and done.bytes_after < done.bytes_before
    for run in recorded.iterdir():
        names = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
        assert names == {*KEPT, "metrics.csv.xz", "eval_rewards.csv.xz"}
    assert {p: (recorded / p).read_bytes() for p in kept} == kept  # what is kept is kept byte for byte
    a, b = (build_report(r, tmp_path / "out" / r.name)[0].read_text() for r in (original, recorded))
    assert b == a.replace(str(original), str(recorded))
    assert "| ablation=b | 2 | -0.3148 |" in b  # the paired bootstrap still has its per-item rewards


def test_every_row_and_column_is_kept_to_7_significant_digits(recorded):
    run = recorded / "0_ablation=a,seed=0"
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    before = load_run(run).metrics
    compact_folder(recorded)
    with lzma.open(run / "metrics.csv.xz", "rt", newline="") as f:
        kept = list(csv.reader(f))
    assert kept[0] == rows[0] and len(kept) == len(rows)
    assert [[v == "" for v in r] for r in kept] == [[v == "" for v in r] for r in rows]  # the same empty cells
    after = load_run(run).metrics
    assert after.keys() == before.keys()
    for name, points in before.items():
        assert [s for s, _ in after[name]] == [s for s, _ in points]
        assert [v for _, v in after[name]] == pytest.approx([v for _, v in points], rel=5e-7, abs=0)
    assert ("grad/norm", "1234.568") in {(h, v) for r in kept[1:] for h, v in zip(kept[0], r)}


def test_compacting_again_changes_nothing_and_plots_keep_their_line_colours(recorded, tmp_path):
    from PIL import Image

    build_report(recorded, recorded)  # plots drawn as report.py draws them: palette PNGs already
    pngs = sorted(recorded.glob("*.png"))
    assert pngs and all(Image.open(p).mode == "P" and Image.open(p).width == REPORT_WIDTH for p in pngs)
    big = Image.new("RGBA", (990, 528), (255, 255, 255, 255))  # a panel as the report drew it before
    big.paste((31, 119, 180, 255), (100, 100, 900, 110))  # a tab:blue line
    big.save(recorded / "old.png")
    compact_folder(recorded)
    with Image.open(recorded / "old.png") as img:
        assert img.mode == "P" and img.size == (REPORT_WIDTH, 422)
        assert (31, 119, 180) in {c for _, c in img.convert("RGB").getcolors()}
    state = {p: p.read_bytes() for p in recorded.rglob("*") if p.is_file()}
    done = compact_folder(recorded)
    assert done.plots == 0 and {p: p.read_bytes() for p in recorded.rglob("*") if p.is_file()} == state


def test_the_script_compacts_the_folders_it_is_given(recorded):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "compact_results.py"), str(recorded)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{recorded}: 4 runs, 0 plots compacted; ")
    assert not list(recorded.rglob("metrics.csv")) and len(list(recorded.rglob("metrics.csv.xz"))) == 4


def test_the_recorded_experiments_are_kept_compacted():
    """docs/results holds each run's metrics compacted and none of what its command regenerates, and
    palette plots at the report's width (``python scripts/compact_results.py docs/results/<name>``)."""
    from PIL import Image

    results = ROOT / "docs" / "results"
    runs = find_runs(results)
    assert len(runs) > 100
    for run in runs:
        files = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
        assert "metrics.csv.xz" in files, run
        assert not files & {"metrics.csv", "eval_generations.jsonl", "samples.jsonl", ".hydra/hydra.yaml"}, run
    for png in results.rglob("*.png"):
        with Image.open(png) as img:
            assert img.mode == "P" and img.width <= REPORT_WIDTH, png
