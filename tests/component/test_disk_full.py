"""A run's journal and result files on a real full disk: a tmpfs of 4 MiB in a mount namespace of a
child process's own (tests/support/disk_full_child.py, under ``unshare -m`` as root or ``unshare
-Urm`` with unprivileged user namespaces; nobody else sees the mount). The kernel's ``ENOSPC``
must come out as an ``OutputWriteError`` naming the file, with whole lines left in both files and
every episode journaled before kept; once space is freed the resumed journal and files take the
rest, each episode once. (The same through the Ray pool, with the disk filled at the write layer:
tests/ray/test_journal_faults.py; the whole CLI run: the chaos bench's ``disk_full`` row.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "disk_full_child.py"
pytestmark = pytest.mark.slow


def test_a_real_full_disk_keeps_whole_lines_names_the_file_and_a_resume_after_freeing_space_finishes(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: no tmpfs of the test's own")
    ns = ["-m"] if os.geteuid() == 0 else ["-U", "-r", "-m"]
    proc = subprocess.run(["unshare", *ns, "--propagation", "private", sys.executable, str(CHILD), str(tmp_path / "disk")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "mount" in proc.stderr and ("permission" in proc.stderr.lower() or "not permitted" in proc.stderr):
        pytest.skip(f"no tmpfs could be mounted here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    err = r["error"]
    assert err["disk_full"] and err["errno"] == 28 and err["path"].endswith(".jsonl") and err["path"] in err["message"]
    assert "No space left on device" in err["message"]
    assert r["damage_at_stop"] == []  # whole lines only in both files
    assert r["journaled_at_stop"] >= r["written_at_stop"] >= r["journaled_at_stop"] - 1 > 10  # the journal first, the files after
    assert r["repairs"] == [] and r["state"] == "finished"
    assert sorted(r["journaled"]) == sorted(r["specs"]) and sorted(r["written"]) == sorted(r["specs"])  # each once
    assert r["skipped"] == r["written_at_stop"]  # what the files held before was not written again
