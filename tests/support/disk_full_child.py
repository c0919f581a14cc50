"""A run's journal and result files on a real full disk, as a child process run by
tests/component/test_disk_full.py under ``unshare -m`` (or ``unshare -Urm``): it mounts a tmpfs of 4
MiB on ``DIR`` in its own mount namespace (nobody else sees it), takes 2 MiB of it with a filler
file, then journals and writes 80 episodes of ~20 KB each (a ``RunJournal`` and a ``RunWriter``,
as the CLI does) until the kernel refuses a write (``ENOSPC``). It records what the refusal left,
deletes the filler, resumes (journal and files), writes the rest, and prints one JSON report.

Usage: python tests/support/disk_full_child.py DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rollout.core.config import load_config  # noqa: E402
from rollout.core.journal import EPISODES_FILE, OutputWriteError, RunJournal, load_run  # noqa: E402
from rollout.core.jsonl import read_lines  # noqa: E402
from rollout.core.output import RunWriter, read_samples  # noqa: E402
from rollout.core.pool import make_specs  # noqa: E402
from rollout.core.records import TrainingSample  # noqa: E402


def _sample(spec) -> TrainingSample:
    n = 4000  # ~20 KB of JSON
    return TrainingSample(tokens=list(range(n)), response_length=10, loss_mask=[1] * 10, rollout_log_probs=[-0.5] * 10, reward=1.0,
                          status="completed", group_id=spec.group_id, sample_index=spec.sample_index, metadata={"episode_id": spec.episode_id})


def main(disk: Path) -> dict:
    """The run goes into ``disk/run`` on a 4 MiB tmpfs mounted at ``disk``, half of it taken by a
    file beside the run's folder (a run's folder holding other files is refused)."""
    disk.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    filler = disk / "filler"
    filler.write_bytes(bytes(2 * 2**20))
    d = disk / "run"
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={d}"])
    specs = make_specs("retail", [str(i) for i in range(80)], 1, prefix="b0:")
    journal, writer = RunJournal.open(d, cfg), RunWriter(d)
    journal.record_specs(specs)
    report: dict = {}
    for s in specs:
        sample = _sample(s)
        try:
            journal.record(sample)
            writer.add_group([sample])
        except OutputWriteError as e:
            report["error"] = {"path": str(e.path), "disk_full": e.disk_full, "errno": e.error.errno, "message": str(e)}
            break
    report["journaled_at_stop"] = len(read_lines(d / EPISODES_FILE)[0])
    report["written_at_stop"] = len(read_lines(d / "samples.jsonl")[0])
    report["damage_at_stop"] = [str(x) for f in (EPISODES_FILE, "samples.jsonl") for x in read_lines(d / f)[1]]
    for close in (lambda: journal.close("interrupted", "disk full"), writer.close):
        try:
            close()
        except OutputWriteError as e:  # run.json / summary.json on the full disk: the old one stays
            report.setdefault("close_errors", []).append(str(e.path.name))
    filler.unlink()  # space freed
    resumed, writer = RunJournal.open(d, cfg, resume=True), RunWriter(d, resume=True)
    for eid, sample in resumed.delivered.items():  # what the CLI's restore hands the writer again
        writer.add_group([sample])
    for s in resumed.undelivered():
        sample = _sample(s)
        resumed.record(sample)
        writer.add_group([sample])
    resumed.close("finished")
    writer.close()
    run = load_run(d)
    report.update(repairs=[str(x) for x in resumed.repairs], skipped=writer.skipped,
                  journaled=[s.episode_id for s, _ in run.episodes], written=[s.episode_id for s in read_samples(d / "samples.jsonl")],
                  specs=[s.episode_id for s in specs], state=json.loads((d / "run.json").read_text())["status"])
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
