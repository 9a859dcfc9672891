"""Mutation testing's configuration still builds (scripts/mutate.py, docs/mutation.md): every module of
the listed areas is either mutated or excluded with a reason, each module's work folder holds what its
tests read, mutmut itself reads the table the script writes, and the score counts as documented. The
mutation runs themselves take minutes per module and are not part of CI."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = module  # its dataclass looks its module up while it is built
    spec.loader.exec_module(module)
    yield module
    del sys.modules["mutate"]


def test_every_module_of_the_areas_is_mutated_or_excluded_with_a_reason(mutate):
    package = ROOT / "src" / "diffusion_rl"
    found = {p.relative_to(package).as_posix() for area in mutate.AREAS for p in (package / area).rglob("*.py")
             if p.name != "__init__.py"}
    listed = set(mutate.modules())
    assert listed | set(mutate.EXCLUDED) == found  # nothing forgotten, no stale exclusion
    assert not listed & set(mutate.EXCLUDED)
    assert all(reason.strip() for reason in mutate.EXCLUDED.values())
    for must in ("rl/advantages.py", "sampling/sampler.py", "likelihood/elbo.py", "rewards/sudoku.py",
                 "tasks/base.py", "rl/objectives/stabledrl.py", "rl/objectives/egspo.py"):
        assert must in listed
    for m in listed:  # each against its own area's tests, a folder that exists
        assert (ROOT / mutate.tests_of(m)).is_dir(), m


def test_the_work_folder_holds_what_the_tests_read_and_mutmut_reads_its_table(mutate, tmp_path, monkeypatch):
    monkeypatch.setattr(mutate, "WORK", tmp_path)
    folder = mutate.prepare("rl/advantages.py")
    for name in ("src", "tests", *mutate.ALSO_COPY):
        assert (folder / name).resolve() == (ROOT / name).resolve()
    # mutmut's own reader, run in the folder as `mutmut run` runs there
    code = ("from mutmut.configuration import config; c = config(); "
            "print(c.only_mutate, c.pytest_add_cli_args_test_selection, [str(p) for p in c.source_paths]); "
            "print(c.do_not_mutate_patterns)")
    out = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert out.returncode == 0, out.stderr
    first, patterns = out.stdout.strip().splitlines()
    assert first == "['src/diffusion_rl/rl/advantages.py'] ['tests/unit/rl'] ['src']"
    assert patterns == str(list(mutate.NOT_MUTATED))


def test_not_mutated_lines_are_raises_and_warnings_only(mutate):
    import re

    def skipped(line):
        return any(re.search(p, line) for p in mutate.NOT_MUTATED)

    assert skipped("        raise ConfigError(key, value, 'must be > 0')") and skipped("    raise")
    assert skipped("    warnings.warn(f'{old} is deprecated')") and skipped("    assert eos_id is not None, 'EOSER'")
    assert skipped("        log.warning('objective.eps=%g cannot act', eps)") and skipped("    log.info('x')")
    for kept in ("    if x < 1:", "    raised = a / b", "    return warnings_of(x)", "    y = x  # raise later",
                 "    catalog.info(x)", "    asserted = x"):
        assert not skipped(kept)


def diff(before, after):
    return f"--- a\n+++ b\n@@ -1 +1 @@\n-{before}\n+{after}\n"


def test_equivalent_kinds_hold_apart_only_what_they_name(mutate):
    line = "    out = torch.ones(n, dtype=torch.bool, device=x.device)"
    assert mutate.equivalent_kind(diff(line, line.replace("device=x.device", "device=None"))) == "device"
    assert mutate.equivalent_kind(diff(line, line.replace(", device=x.device", ", "))) == "device"
    assert mutate.equivalent_kind(diff(line, line.replace("dtype=torch.bool", "dtype=None"))) is None
    first = "    return canvas.to(device=like.device, dtype=like.dtype)"
    assert mutate.equivalent_kind(diff(first, "    return canvas.to(dtype=like.dtype)")) == "device"
    inf = '    c = c.masked_fill(~ok, float("-inf"))'
    assert mutate.equivalent_kind(diff(inf, inf.replace("-inf", "-INF"))) == "float word"
    assert mutate.equivalent_kind(diff(inf, inf.replace("-inf", "+inf"))) is None
    big = "    v = torch.full_like(v, -1e30)"
    assert mutate.equivalent_kind(diff(big, big.replace("1e30", "1e+30"))) == "same number"
    assert mutate.equivalent_kind(diff(big, big.replace("1e30", "1e31"))) is None
    assert mutate.equivalent_kind(diff("    x = a / b", "    x = a * b")) is None


def test_the_score_counts_kills_and_timeouts_and_holds_explained_survivors_apart(mutate):
    codes = {"a": 1, "b": 3, "c": 36, "d": 0, "e": 0, "f": 5, "g": None, "h": 35, "i": -9}
    killed, survived, no_tests, equivalent = mutate.classify(codes, lambda name: name == "e")
    assert killed == 3  # test failure, pytest error, timeout
    assert survived == ["d", "g", "h", "i"]  # not run, suspicious or crashed: not a kill
    assert no_tests == ["f"] and equivalent == ["e"]
    score = mutate.Score("m.py", len(codes), killed, survived, no_tests, equivalent, 1.0)
    assert score.score == pytest.approx(3 / 8)  # killed / (all - equivalent)


def test_an_unknown_module_is_refused_with_the_list(mutate, capsys):
    with pytest.raises(SystemExit):
        mutate.main(["rl/no_such.py"])
    assert "rl/advantages.py" in capsys.readouterr().err


def test_rescore_needs_a_finished_run(mutate, tmp_path, monkeypatch):
    monkeypatch.setattr(mutate, "WORK", tmp_path)
    with pytest.raises(SystemExit, match="no finished run .* run it first: python scripts/mutate.py rl/advantages.py"):
        mutate.rescore("rl/advantages.py")


@pytest.mark.parametrize("module, isolation", [("tasks/sudoku.py", "forkserver"), ("rl/advantages.py", "fork")])
def test_the_tasks_mutants_run_under_the_fork_server(mutate, tmp_path, monkeypatch, module, isolation):
    # the tasks' tests leave the code sandbox's fork server as a child of the test process; mutmut's fork
    # runner would reap it with os.wait() and stop on an unknown pid
    monkeypatch.setattr(mutate, "WORK", tmp_path)
    folder = mutate.prepare(module)
    code = "from mutmut.configuration import config; print(config().process_isolation.value)"
    out = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == isolation
