"""What the benches share (pure: no Ray, no run of the main job): the interleaved benches' options
and run-and-report sequence (rollout.devtools.bench.interleaved), and the config a bench command
loads and checks (rollout.devtools.bench.cli)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollout.devtools.bench.cli import load_checked_config
from rollout.devtools.bench.interleaved import add_bench_parser, run_and_report, run_bench
from rollout.devtools.bench.scale import main_scale
from rollout.devtools.bench.startup import main_startup

LOCAL_YAML = str(Path(__file__).resolve().parents[2] / "configs" / "local.yaml")


def test_an_interleaved_bench_gets_the_common_options_and_its_own():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    p = add_bench_parser(sub, "toy", "a toy bench", run=len, reps=3, reps_help="runs per way")
    p.add_argument("--ways", default="a,b")
    args = parser.parse_args(["toy", "--json", "out.json", "--ways", "b", "x=1", "y=2"])
    assert (args.config, args.reps, args.json, args.ways, args.overrides, args.run) == (None, 3, "out.json", "b", ["x=1", "y=2"], len)


def test_run_and_report_runs_each_way_interleaved_then_reports_and_writes_json(tmp_path, capsys):
    order = []

    def run_one(way, folder):
        order.append(way)
        return {"way": way, "exit_code": 0 if way != "bad" else 3}

    out = tmp_path / "bench.json"
    code = run_and_report(["a", "b"], 2, "bench-toy-", run_one, lambda way, rep, r: f"ran {way} {rep}",
                          lambda runs: [{"n": len(runs)}], lambda rows: f"rows {rows}", str(out))
    assert code == 0 and order == ["a", "b", "b", "a"]  # every other round reversed
    printed = capsys.readouterr().out
    assert "ran a 0" in printed and "rows [{'n': 4}]" in printed and f"json: {out}" in printed
    assert json.loads(out.read_text()) == {"rows": [{"n": 4}], "runs": [{"way": w, "exit_code": 0} for w in order]}
    # a run that exits non-zero makes the bench exit 1; a run that raises, 1 with nothing reported
    assert run_and_report(["bad"], 1, "bench-toy-", run_one, lambda *a: "", lambda runs: [], lambda rows: "", None) == 1

    def failing(way, folder):
        raise RuntimeError("the run wrote no summary")

    assert run_and_report(["a"], 1, "bench-toy-", failing, lambda *a: "", lambda runs: [], lambda rows: "rows", None) == 1
    captured = capsys.readouterr()
    assert "error: the run wrote no summary" in captured.err and "rows" not in captured.out


def test_run_bench_checks_the_arguments_first_then_runs_each_way_with_the_args(capsys):
    def ways(args):
        if args.ways == "none":
            raise ValueError("--ways names no way")
        return args.ways.split(",")

    seen = []

    def run_one(args, way, folder):
        seen.append((args.tag, way))
        return {"exit_code": 0}

    args = argparse.Namespace(ways="a,b", reps=1, json=None, tag="t")
    assert run_bench(args, ways, "bench-toy-", run_one, lambda *a: "", lambda runs: [], lambda rows: "rows") == 0
    assert seen == [("t", "a"), ("t", "b")]
    args.ways = "none"
    assert run_bench(args, ways, "bench-toy-", run_one, lambda *a: "", lambda runs: [], lambda rows: "rows") == 2
    assert capsys.readouterr().err == "error: --ways names no way\n" and len(seen) == 2


def test_the_scale_and_startup_benches_refuse_bad_arguments_with_exit_2_before_running(capsys):
    bad_scale = argparse.Namespace(actors="2,x", servers=4, reps=1, config=None, overrides=[], json=None)
    assert main_scale(bad_scale) == 2
    assert capsys.readouterr().err == "error: --actors is a comma-separated list of integers >= 1; --servers and --reps >= 1\n"
    bad_startup = argparse.Namespace(ways="no-such-way", tasks=2, reps=1, config=None, overrides=[], json=None)
    assert main_startup(bad_startup) == 2
    assert capsys.readouterr().err.startswith("error: --ways of ")


def test_a_bench_loads_and_checks_the_config_or_prints_the_config_error(tmp_path, capsys):
    cfg = load_checked_config(LOCAL_YAML, ["env.domain=airline"])
    assert cfg is not None and cfg.env.domain == "airline"
    assert load_checked_config(LOCAL_YAML, ["no_such_key=1"]) is None
    assert capsys.readouterr().err.startswith("config error: no_such_key")
    assert load_checked_config(str(tmp_path / "missing.yaml"), []) is None
    assert "config error: config file not found" in capsys.readouterr().err
