"""The dataset verl reads for the ``tau2_agent`` loop: one row per task (a Parquet file).

verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``, 0.9.1) reads Parquet rows and hands
every column but the tensors to the agent loop as keyword arguments: ``raw_prompt`` (the chat
messages of the ``prompt`` column), ``extra_info``, ``data_source``, ``agent_name`` (which
registered agent loop runs the row), ``index`` (``extra_info["index"]``). The tau2 agent loop
reads the task from ``extra_info["task_id"]`` (and ``extra_info["domain"]``, ``extra_info["seed"]``
when given); the ``prompt`` column is a one-line placeholder that verl tokenizes only to filter
over-long prompts (the loop renders the real one: the domain's policy, its tools and the
simulated user's opening).

Write one with ``python -m rollout.integrations.verl_data --domain retail --split train --out
~/data/tau2/retail_train.parquet`` (needs ``pandas`` and ``pyarrow``, which verl installs: without
them it says so in one line, exit 2, before it loads anything).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["AGENT_NAME", "INSTALL_HINT", "require_parquet", "task_rows", "write_dataset", "main"]

AGENT_NAME = "tau2_agent"
# What brings pandas and pyarrow: the verl extra (verl 0.9.1 requires both)
INSTALL_HINT = "pip install 'tau-rollout[verl]'"


def require_parquet() -> None:
    """pandas and pyarrow (the Parquet engine verl reads with) can be imported here.

    Raises:
        ImportError: one line naming what is missing and :data:`INSTALL_HINT`.
    """
    missing = []
    for module in ("pandas", "pyarrow"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(f"writing verl's dataset (Parquet) needs pandas and pyarrow, and {' and '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} not installed here: {INSTALL_HINT}")


def task_rows(domain: str, task_ids: list[str], *, agent_name: str = AGENT_NAME, seeds: list[int] | None = None) -> list[dict[str, Any]]:
    """One verl dataset row per task id.

    Args:
        domain: the tau2 domain (``retail``, ``airline``, ``telecom``, ...).
        task_ids: tau2 task ids, in order (``extra_info["index"]`` is the position).
        agent_name: the registered agent loop that runs the rows.
        seeds: one episode seed per row (``extra_info["seed"]``), for reproducible episodes; every
            repeat of a row (``rollout.n``) then gets the same seed. ``None``: a fresh seed per run.

    Returns:
        Rows with ``data_source`` (``tau2/<domain>``), ``agent_name``, ``prompt`` (one user
        message naming the task), ``reward_model`` (``{"style": "tau2", "ground_truth": task id}``)
        and ``extra_info`` (``index``, ``task_id``, ``domain``, and ``seed`` when given).

    Raises:
        ValueError: ``seeds`` is not one per task.
    """
    if seeds is not None and len(seeds) != len(task_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(task_ids)} tasks")
    rows = []
    for i, tid in enumerate(task_ids):
        extra: dict[str, Any] = {"index": i, "task_id": str(tid), "domain": domain}
        if seeds is not None:
            extra["seed"] = int(seeds[i])
        rows.append({
            "data_source": f"tau2/{domain}",
            "agent_name": agent_name,
            "prompt": [{"role": "user", "content": f"tau2 {domain} task {tid}"}],
            "reward_model": {"style": "tau2", "ground_truth": str(tid)},
            "extra_info": extra,
        })
    return rows


def write_dataset(path: str | Path, domain: str, task_ids: list[str], **kwargs: Any) -> Path:
    """Write :func:`task_rows` to the Parquet file ``path`` (folders created) and return it.

    Raises:
        ImportError: pandas or pyarrow is missing (:func:`require_parquet`: one line, ``pip install
            'tau-rollout[verl]'`` brings them).
    """
    require_parquet()
    import pandas as pd

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(task_rows(domain, task_ids, **kwargs)).to_parquet(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m rollout.integrations.verl_data``: write the tasks of one split (or given ids).
    Exit status 0, or 2 with one line on stderr: pandas or pyarrow missing (:func:`require_parquet`,
    checked first), or a domain, split or task id the benchmark lacks."""
    ap = argparse.ArgumentParser(prog="python -m rollout.integrations.verl_data", description=__doc__.splitlines()[0].replace("``", ""))
    ap.add_argument("--domain", default="retail")
    ap.add_argument("--split", default="train", help="tau2's split of the domain (base, train, test, ...)")
    ap.add_argument("--task-ids", nargs="*", default=None, help="these task ids instead of the split")
    ap.add_argument("--benchmark", default="tau2", help="env.benchmark (tau2, tau_bench)")
    ap.add_argument("--open-issues", default="skip", choices=("skip", "run"),
                    help="env.open_issues: leave out (skip, the default) or keep (run) tasks with an open issue in the benchmark")
    ap.add_argument("--out", required=True, help="the Parquet file to write")
    args = ap.parse_args(argv)
    from rollout.core.config import ConfigError, EnvConfig
    from rollout.core.environment import load_benchmark
    from rollout.core.tasks import select_tasks

    try:
        require_parquet()
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bench = load_benchmark(EnvConfig(benchmark=args.benchmark, domain=args.domain))
    try:
        selection = select_tasks(bench, args.split, args.task_ids, args.open_issues)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        bench.close()
    ids = selection.task_ids
    out = write_dataset(args.out, args.domain, ids)
    left_out = f"; {len(selection.skipped)} with an open issue left out: {', '.join(selection.skipped)}" if selection.skipped else ""
    print(f"{len(ids)} {args.domain} tasks ({args.split if args.task_ids is None else 'given ids'}) -> {out}{left_out}")
    return 0


if __name__ == "__main__":
    from rollout.core.pipes import pipe_safe

    raise SystemExit(pipe_safe(main))
