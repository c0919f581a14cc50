"""The run journal under a full disk, a torn last line and a corrupted line, through the trainer API:
the pool stops on a refused journal write with every undelivered episode handed back, and a new pool
resumed from the repaired journal delivers every episode once. The disk fills at the write layer
here (the journal's file refuses with ENOSPC after some bytes, as the kernel does); the real full
disk (a tmpfs) is tests/component/test_disk_full.py and the chaos bench's ``disk_full`` row."""

from __future__ import annotations

import collections
import errno
import os

import pytest
from support.raypool import pool_config

from rollout.core.journal import EPISODES_FILE, RunJournal
from rollout.core.jsonl import read_lines

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _cfg(router_url: str, out, *overrides: str):
    return pool_config(router_url, f"rollout.output_dir={out}", *overrides)


class FillingDisk:
    """The journal's episodes file on a disk with ``room`` bytes left: a write past it writes what
    fits, the next raises ``OSError(ENOSPC)``."""

    def __init__(self, f, room: int):
        self._f, self.room = f, room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self._f.write(bytes(data[: self.room]))
        self.room -= n
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


def _resume_and_finish(router_url: str, out) -> tuple[list[str], RunJournal]:
    from rollout.core.pool import RolloutPool

    journal = RunJournal.open(out, _cfg(router_url, out), resume=True)
    pool = RolloutPool(_cfg(router_url, out)).start()
    try:
        pool.attach_journal(journal)
        pool.restore(journal)
        ids = [r.spec.episode_id for r in pool.results(timeout_s=300)]
    finally:
        pool.shutdown()
        journal.close("finished")
    return ids, journal


def test_a_full_disk_stops_the_pool_handing_back_every_undelivered_episode_and_a_resume_finishes(ray_cluster, retail_stack, retail, tmp_path):
    from rollout.core.pool import JournalWriteError, RolloutPool

    cfg = _cfg(retail_stack.router_url, tmp_path)
    journal = RunJournal.open(tmp_path, cfg)
    pool = RolloutPool(cfg).start()
    delivered = []
    try:
        pool.attach_journal(journal)
        specs = pool.submit_tasks(retail.task_ids("base")[:8])
        with pytest.raises(JournalWriteError) as e:
            for r in pool.results(timeout_s=300):
                delivered.append(r.spec.episode_id)
                if len(delivered) == 2:  # the disk fills now: room for a part of the next line only
                    journal._episodes_f = FillingDisk(journal._episodes_f, room=1000)
    finally:
        pool.shutdown()
        journal._episodes_f = journal._episodes_f._f if isinstance(journal._episodes_f, FillingDisk) else journal._episodes_f
        journal.close("interrupted")
    err = e.value
    assert err.disk_full and err.path == str(tmp_path / EPISODES_FILE) and "No space left on device" in str(err)
    handed_back = [s.episode_id for s in err.undelivered]
    assert sorted(delivered + handed_back) == sorted(s.episode_id for s in specs)  # each delivered or handed back, once
    journaled, damage = read_lines(tmp_path / EPISODES_FILE)
    assert damage == [] and [d["metadata"]["episode_id"] for d in journaled] == delivered  # whole lines: what was handed out
    ids, resumed = _resume_and_finish(retail_stack.router_url, tmp_path)  # space freed
    assert sorted(ids) == sorted(handed_back) and resumed.repairs == []
    assert len(read_lines(tmp_path / EPISODES_FILE)[0]) == len(specs)


def test_a_resumed_pool_runs_the_episodes_of_a_torn_and_a_corrupted_journal_line_once(ray_cluster, retail_stack, retail, tmp_path):
    from rollout.core.pool import RolloutPool

    cfg = _cfg(retail_stack.router_url, tmp_path)
    journal = RunJournal.open(tmp_path, cfg)
    pool = RolloutPool(cfg).start()
    try:
        pool.attach_journal(journal)
        specs = pool.submit_tasks(retail.task_ids("base")[:6])
        results = iter(pool.results(timeout_s=300))
        first = [next(results).spec.episode_id for _ in range(4)]
    finally:
        pool.shutdown()  # the driver "dies": the journal is not closed
    path = tmp_path / EPISODES_FILE
    lines = path.read_bytes().split(b"\n")[:-1]
    assert len(lines) >= 4
    lines[1] = lines[1][:30] + bytes(200) + lines[1][230:]  # line 2 corrupted
    torn = lines[-1][: len(lines[-1]) // 3]  # the last line torn
    path.write_bytes(b"".join(x + b"\n" for x in lines[:-1]) + torn)
    corrupted = first[1]  # journal lines are in delivery order
    ids, resumed = _resume_and_finish(retail_stack.router_url, tmp_path)
    assert [(d.line, d.kind) for d in resumed.repairs] == [(2, "corrupt"), (len(lines), "torn")]
    assert corrupted in ids  # set aside: run again
    final = [d["metadata"]["episode_id"] for d in read_lines(path)[0]]
    counts = collections.Counter(final)
    assert sorted(counts) == sorted(s.episode_id for s in specs) and set(counts.values()) == {1}
