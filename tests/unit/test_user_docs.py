"""What users read, held to the code: README's table of a sample's keys names every key a
``samples.jsonl`` line has; every config that ships is named in README's layout and in
docs/configuration.md; the verl install line (its pins, its venv) is the same in README,
docs/trainer.md, pyproject.toml and the script that tests it."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from rollout.core.issues import TaskIssue
from rollout.core.records import TrainingSample

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
VERL_INSTALL = 'python3 -m venv .venv-verl && .venv-verl/bin/pip install -c constraints/verl.txt torch==2.13.0 -e ".[verl]"'


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start: nxt if nxt != -1 else len(text)]


def test_the_sample_table_names_every_key_of_a_samples_line():
    sample = TrainingSample(tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], reward=0.5,
                            status="completed", group_id="g", sample_index=0, episode_id="e", raw_reward=1.0,
                            task_issues=[TaskIssue(id="issue_1", title="t")], metadata={"task_id": "0"}, weight_versions=["0"],
                            generation_spans=[[0, 1]], messages=[])
    table = _section(README, "## What you get")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert len(rows) > 10, "README's sample table was not found"
    assert sorted(set(sample.to_dict()) - documented) == [], "keys of a samples.jsonl line missing from README's table"
    assert sorted(documented - set(sample.to_dict())) == [], "README's table names keys a sample does not have"


def test_every_shipped_config_is_named_in_the_layout_and_the_configuration_reference():
    shipped = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert len(shipped) >= 3, shipped
    layout = _section(README, "## Layout")
    configs_line = next(line for line in layout.splitlines() if line.startswith("configs/"))
    reference = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    assert [n for n in shipped if n not in configs_line] == [], configs_line
    assert [n for n in shipped if f"configs/{n}" not in reference] == []


def test_the_verl_install_is_one_line_with_its_pins_everywhere_it_is_told():
    trainer = (ROOT / "docs/trainer.md").read_text(encoding="utf-8")
    assert VERL_INSTALL in README and VERL_INSTALL in trainer
    assert 'pip install -e ".[verl]"`' not in README, "README tells a verl install without its pins"
    pins = (ROOT / "constraints/verl.txt").read_text(encoding="utf-8").splitlines()
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["verl"]
    verl_pin = next(r for r in extra if r.startswith("verl=="))
    assert verl_pin in pins, (verl_pin, "constraints/verl.txt pins another verl")
    script = (ROOT / "tests/integrations/run_verl.sh").read_text(encoding="utf-8")
    assert "-c constraints/verl.txt" in script and '"${VERL_VENV:-.venv-verl}"' in script, "run_verl.sh installs elsewhere"
