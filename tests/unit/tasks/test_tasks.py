"""Every metric a task reports is defined in one line, in the code (printed with the results) and in
the "Metrics" table of docs/tasks.md, word for word (tasks/base.py ``metric_definitions``)."""

import re

import pytest

from diffusion_rl.app.train import build_task
from diffusion_rl.tasks import TASKS
from tests.conftest import ROOT
from tests.unit.tasks.test_text_tasks import write_jsonl

DATA = {  # a test file for the tasks that would otherwise read the hub
    "gsm8k": [{"question": "1+1?", "answer": "so\n#### 2"}, {"question": "2+2?", "answer": "so\n#### 4"}],
    "math500": [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}],
    "mbpp": [{"task_id": i, "text": "Return x.", "code": "def f(x):\n    return x", "test_list": ["assert f(1) == 1"],
              "test_setup_code": "", "challenge_test_list": []} for i in (11, 12, 601, 602)],
}


def readme_metrics() -> dict[tuple[str, str], str]:
    """``{(metric, task): definition}`` of docs/tasks.md's Metrics table (task ``all``: every task)."""
    section = (ROOT / "docs" / "tasks.md").read_text().split("## Metrics", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([\w@/]+)` \| (\w+) \| (.+) \|$", line.strip())
        if m:
            rows[m.group(1), m.group(2)] = m.group(3)
    return rows


@pytest.mark.parametrize("name", TASKS.names())
def test_every_reported_metric_is_defined_in_the_code_and_the_readme(name, tmp_path):
    overrides = {"name": name, "num_test": 2, "num_train": 8}
    if name in DATA:
        overrides["data_path"] = str(write_jsonl(tmp_path / "test.jsonl", DATA[name]))
        overrides["train_data_path"] = overrides["data_path"]
    cls = TASKS.get(name)
    task = build_task({k: v for k, v in overrides.items() if k in cls.config_class.__dataclass_fields__})
    items = task.test_items()
    reported = set(task.metrics([task.target(it) for it in items], items)) | {"reward", "num_items"}
    definitions = task.metric_definitions()
    assert reported <= set(definitions), reported - set(definitions)
    readme = readme_metrics()
    for metric in reported:
        family = "code" if name in ("humaneval", "mbpp") else name
        assert definitions[metric] in (readme.get((metric, name)), readme.get((metric, family)),
                                       readme.get((metric, "all"))), (metric, name)
