"""Make the dashboard preview of docs/observability.md from a real run: a local gold-replay stack,
a throwaway Ray head with a metrics export port, tests/support/metrics_driver.py running a few
rounds of retail episodes (completed, unsolved, failed) with a weight update after each, and
Ray's Prometheus export scraped every ``--every`` seconds meanwhile; then the dashboard's panels
are evaluated on those scrapes and drawn (``python -m rollout.devtools.grafana render``).

Everything it starts (the stack, the head's process group, the driver) it stops by pid or process
group.

Usage: python tests/support/dashboard_preview.py --out docs/observability_dashboard.png [--rounds 6]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--ok-tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between scrapes")
    ap.add_argument("--tail", type=float, default=40.0, help="seconds scraped after the run (the gauges at rest)")
    args = ap.parse_args(argv)

    from rollout.core.config import LocalConfig
    from rollout.devtools.grafana import read_scrapes, render
    from rollout.devtools.local.stack import LocalStack
    from support.ray_head import ray_head

    work = Path(tempfile.mkdtemp(prefix="dash"))
    scrapes, done = work / "scrapes.jsonl", work / "done"
    env = dict(os.environ, RAY_metrics_report_interval_ms="1000", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    stack = LocalStack(LocalConfig(enabled=True, backend="gold_replay"), "retail", "builtin:qwen3", log_dir=work / "stack")
    stack.start()
    try:
        with ray_head(env, include_dashboard=False) as head, open(work / "driver.log", "w") as log:
            scraper = subprocess.Popen([sys.executable, "-m", "rollout.devtools.grafana", "scrape", "--url", head.metrics_url, "--out", str(scrapes),
                                        "--every", str(args.every), "--until", str(done)], env=env, start_new_session=True)
            driver = subprocess.Popen([sys.executable, str(HERE / "metrics_driver.py"), "--address", head.gcs_address, "--router-url",
                                       stack.router_url, "--out", str(work / "report.json"), "--rounds", str(args.rounds),
                                       "--ok-tasks", str(args.ok_tasks), "--samples", str(args.samples), "--concurrency", str(args.concurrency),
                                       "--max-steps", str(args.max_steps)],
                                      env=head.env | {"PYTHONPATH": env["PYTHONPATH"]}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=log, text=True, start_new_session=True)
            t0 = time.monotonic()
            try:
                ready = driver.stdout.readline().strip()
                if ready != "READY":
                    raise SystemExit(f"the driver failed: see {work / 'driver.log'}")
                print(f"run over after {time.monotonic() - t0:.0f} s; scraping {args.tail:.0f} s more", flush=True)
                time.sleep(args.tail)
            finally:
                done.touch()
                scraper.wait(timeout=30)
                with contextlib.suppress(OSError):
                    driver.stdin.close()
                try:
                    driver.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(driver.pid, signal.SIGKILL)
    finally:
        stack.stop()
    data = read_scrapes(scrapes)
    span = data[-1][0] - data[0][0]
    caption = (f"tau-rollout Grafana dashboard (docs/grafana/tau_rollout.json), its panels' queries evaluated on {len(data)} real scrapes of "
               f"Ray's metrics export port (every {args.every:g} s over {span / 60:.1f} min; rates over 30 s) and drawn with matplotlib: "
               f"not a Grafana screenshot.\nThe run: tests/support/dashboard_preview.py, 2 actors on the local gold-replay stack, "
               f"{args.rounds} rounds of retail episodes (gold replays, unsolved replies, /generate failures) with a weight update after each.")
    render(data, args.out, caption=caption)
    print(f"wrote {args.out} ({len(data)} scrapes over {span:.0f} s; files in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
