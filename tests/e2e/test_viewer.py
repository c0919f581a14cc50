"""The trajectory viewer as a user meets it: ``python -m rollout view`` over a real run's output.

Run A is the gold-replay main job on retail tasks 0, 1 and 2 (twice each) through the CLI with
``env.max_steps=8``: tasks 0 and 1 complete in 6 turns (reward 1), task 2 needs 12 and ends
``max_steps`` (reward 0), so the filters have something to tell apart. Run B (for ``--compare``
and the log-probs on hover) is tasks 0 and 2 once each on the local stack's tiny model (real
sampled tokens and log-probs; every episode ends ``truncated`` at the short ``max_new_tokens``,
reward 0): task 0 changed reward, task 2 did not, task 1 is in A only. Run E is an evaluation
(``python -m rollout eval``, retail tasks 0 and 1 twice each, gold replay) with DeepSeek-V4's
vocabulary, whose special tokens (``<｜User｜>``: U+FF5C) no font of this machine draws.

The runs join the session's shared Ray head and local stacks (``support.cli``). The viewer runs as its own process on 127.0.0.1 (``--port 0``), started and stopped (SIGTERM, by
pid) by each test. The browser tests drive headless Chromium (Debian's ``chromium`` package) with
Playwright; where either is missing they are skipped with how to install them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ROLLOUT_CHROMIUM", "/usr/bin/chromium")
# Set to a folder (docs/) to keep the browser test's screenshots there.
SHOTS = os.environ.get("ROLLOUT_VIEWER_SHOTS")
pytestmark = pytest.mark.slow


def _env() -> dict:
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def cli_run(local_stacks, shared_ray):
    """The main job with ``overrides`` into ``out``, on the session's shared head and the stack of its kind."""
    def run(out: Path, *overrides: str, command: str = "run") -> subprocess.CompletedProcess:
        proc = run_cli([command, "--config", "configs/local.yaml", "--no-progress", "pool.num_actors=1", *overrides, f"rollout.output_dir={out}"],
                       stack=local_stacks, ray=shared_ray)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc
    return run


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, cli_run) -> Path:
    out = tmp_path_factory.mktemp("viewer") / "gold"
    cli_run(out, "env.task_ids=[0,1,2]", "rollout.n_samples_per_task=2", "env.max_steps=8")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"completed": 4, "max_steps": 2}, summary
    return out


@pytest.fixture(scope="module")
def run_b(tmp_path_factory, cli_run) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("viewer") / "tiny"
    cli_run(out, "env.task_ids=[0,2]", "rollout.n_samples_per_task=1", "local.backend=tiny", "policy.sampling.max_new_tokens=24", "env.max_steps=2")
    return out


@pytest.fixture(scope="module")
def run_c(tmp_path_factory, cli_run) -> Path:
    """Airline task 2 with gold replay grows past a 6000-token context: drop_tool_results compacts
    it twice, so its episode sample has three segments (tests/e2e/test_context_cli.py)."""
    out = tmp_path_factory.mktemp("viewer") / "compacted"
    cli_run(out, "env.domain=airline", "env.task_ids=[2]", "rollout.n_samples_per_task=1", "policy.max_context_tokens=6000",
             "policy.context_headroom_tokens=256", "policy.context_strategy=drop_tool_results")
    return out


@pytest.fixture(scope="module")
def run_eval(tmp_path_factory, cli_run) -> Path:
    """``python -m rollout eval`` with DeepSeek-V4's vocabulary and chat format (the run folder it writes)."""
    pytest.importorskip("renderers")
    out = tmp_path_factory.mktemp("viewer") / "eval"
    proc = cli_run(out, "env.task_ids=[0,1]", "rollout.n_samples_per_task=2", "policy.tokenizer=builtin:deepseek-v4",
                   "policy.chat_format=deepseek-v4", command="eval")
    assert "retail: 2 tasks, 4 trials" in proc.stdout, proc.stdout
    return out


@contextlib.contextmanager
def viewer(log: Path, *args: str):
    """``python -m rollout view ARGS --port 0`` on 127.0.0.1; yields ``(url, process)``; stops the
    process it started (SIGTERM, then SIGKILL after 10 s) and checks it stopped cleanly."""
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rollout", "view", *args, "--port", "0"], cwd=ROOT, env=_env(),
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            line = proc.stdout.readline() if ready else ""
            found = re.search(r"http://127\.0\.0\.1:\d+/", line)
            assert found, f"no URL from the viewer: {line!r}; log: {log.read_text()[-2000:]}"
            yield found.group(0), proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 0, f"the viewer did not stop cleanly ({proc.returncode}): {log.read_text()[-2000:]}"


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def test_view_refuses_a_folder_that_is_not_a_run_and_a_port_in_use(tmp_path):
    (tmp_path / "notes.txt").write_text("not a run")
    for folder in (tmp_path, tmp_path / "missing"):
        proc = subprocess.run([sys.executable, "-m", "rollout", "view", str(folder)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert len(proc.stderr.strip().splitlines()) == 1 and str(folder) in proc.stderr, proc.stderr
    (tmp_path / "episodes.jsonl").write_text("")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "rollout", "view", str(tmp_path), "--port", str(port)], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rollout", "view", str(tmp_path), "--port", "70000"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "must be 0 to 65535, got 70000" in proc.stderr, proc.stderr  # not wrapped round to 4464


def test_the_api_serves_the_runs_files_and_decodes_its_tokens(run_a, tmp_path, tokenizer):
    samples = {s["metadata"]["episode_id"]: s for s in _lines(run_a / "samples.jsonl")}
    with viewer(tmp_path / "viewer.log", str(run_a)) as (url, _):
        rows = _get(url + "api/episodes?since=0")["rows"]
        assert {r["episode_id"]: (r["status"], r["reward"], r["tokens"], r["outcome"]) for r in rows} == {
            eid: (s["status"], s["reward"], len(s["tokens"]), "trained") for eid, s in samples.items()}
        eid = next(e for e, s in samples.items() if s["status"] == "max_steps")
        data = _get(url + "api/tokens?" + urllib.parse.urlencode({"id": eid}))
        [part] = data["parts"]
        assert data["tokenizer"] == "builtin:qwen3" and data["tokenizer_error"] is None
        assert part["ids"] == samples[eid]["tokens"] and part["loss_mask"] == samples[eid]["loss_mask"]
        assert "".join(part["text"]) == tokenizer.decode(part["ids"])  # every token decoded on its own, nothing lost
        summary = _get(url + "api/summary")
        assert summary["live"]["status_counts"] == summary["file"]["status_counts"] == {"completed": 4, "max_steps": 2}
        assert summary["live"]["mean_reward_per_domain"] == pytest.approx(summary["file"]["mean_reward_per_domain"])
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(url + "api/episode?id=nope")
        assert e.value.code == 404


def test_an_evaluation_folder_lists_its_episodes_with_their_conversations_and_tokens(run_eval, tmp_path):
    """The folder ``rollout eval`` writes is a run folder: the viewer's data layer lists its
    episodes with their conversations and exact tokens, and the viewer's server answers for it,
    eval.json included."""
    from rollout.app.viewer.data import RunIndex
    from rollout.core.tokenizer import load_tokenizer

    ev = json.loads((run_eval / "eval.json").read_text())
    assert ev["domains"]["retail"]["pass_hat_k"] == {"1": 1.0, "2": 1.0}
    journal = _lines(run_eval / "episodes.jsonl")
    assert len(journal) == 4 and {x["episode_id"] for x in journal} == {x["episode_id"] for x in _lines(run_eval / "samples.jsonl")}
    index = RunIndex(run_eval)
    index.refresh()
    rows = index.rows()
    assert sorted((r["task_id"], r["status"], r["reward"], r["outcome"]) for r in rows) == [(t, "completed", 1.0, "trained") for t in "0011"]
    for x in journal:
        ep = index.episode(x["episode_id"])
        assert ep["messages"] == x["messages"] and ep["row"]["tokens"] == len(x["tokens"]) > 0
        calls = [c["function"]["name"] for m in ep["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert calls and any(m["role"] == "tool" for m in ep["messages"]) and any(m["role"] == "user" for m in ep["messages"])
        [(_, part)] = index.sample_parts(x["episode_id"])
        assert (part["tokens"], part["loss_mask"], part["rollout_log_probs"]) == (x["tokens"], x["loss_mask"], x["rollout_log_probs"])
    assert index.tokenizer_name() == "builtin:deepseek-v4" and index.eval_file() == ev
    tok = load_tokenizer("builtin:deepseek-v4")
    with viewer(tmp_path / "viewer.log", str(run_eval)) as (url, _):
        assert {r["episode_id"] for r in _get(url + "api/episodes?since=0")["rows"]} == {x["episode_id"] for x in journal}
        eid = journal[0]["episode_id"]
        assert _get(url + "api/episode?" + urllib.parse.urlencode({"id": eid}))["messages"] == journal[0]["messages"]
        data = _get(url + "api/tokens?" + urllib.parse.urlencode({"id": eid}))
        [part] = data["parts"]
        assert data["tokenizer"] == "builtin:deepseek-v4" and part["ids"] == journal[0]["tokens"]
        assert "".join(part["text"]) == tok.decode(part["ids"]) and "<｜User｜>" in part["text"]
        summary = _get(url + "api/summary")
        assert summary["eval"] == ev and summary["file"]["command"] == "eval" and summary["file"]["status_counts"] == {"completed": 4}


# -- the browser ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (the tests that use it name it first, so a skip costs no run)."""
    how = ("the viewer's browser tests need Debian's Chromium and Playwright: apt-get install chromium && pip install playwright "
           "(Playwright's own browser download is not used; ROLLOUT_CHROMIUM names another Chromium binary)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(f"Playwright is not installed; {how}")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}; {how}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


def _page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=30000)
    return page, errors


def _shot(page, tmp_path: Path, name: str, **kw) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), **kw)
    assert path.stat().st_size > 10000  # a rendered page, not a blank one
    if SHOTS:
        shutil.copy(path, Path(SHOTS) / name)


def _ids(page) -> list[str]:
    return page.eval_on_selector_all("#episodes tbody tr", "rows => rows.map(r => r.dataset.id)")


def _wait_rows(page, n: int) -> None:
    page.wait_for_function(f"document.querySelectorAll('#episodes tbody tr').length === {n}", timeout=30000)


V_HASH = "#/episode/a/{id}/{tab}"
TOKEN_COLOURS = """() => {
  const bg = (sel) => getComputedStyle(document.querySelector(sel)).backgroundColor;
  const legend = {p: bg('.legend .tok.p'), m0: bg('.legend .tok.m0'), m1: bg('.legend .tok.m1')};
  const toks = [...document.querySelectorAll('#tokens .toks .tok')];
  return {legend, toks: toks.map(t => [Number(t.dataset.i), getComputedStyle(t).backgroundColor, t.title])};
}"""


def test_the_page_filters_opens_an_episode_and_colours_its_tokens_by_loss_mask(browser, run_a, tmp_path):
    samples = {s["metadata"]["episode_id"]: s for s in _lines(run_a / "samples.jsonl")}
    with viewer(tmp_path / "viewer.log", str(run_a)) as (url, _):
        page, errors = _page(browser, url)
        _wait_rows(page, 6)
        assert sorted(_ids(page)) == sorted(samples)
        assert page.inner_text("#rowcount") == "6 of 6 episodes"

        page.select_option("#f-status", "max_steps")
        _wait_rows(page, 2)
        stopped = sorted(e for e, s in samples.items() if s["status"] == "max_steps")
        assert sorted(_ids(page)) == stopped and {samples[e]["metadata"]["task_id"] for e in stopped} == {"2"}
        page.select_option("#f-status", "")
        page.fill("#f-rmin", "0.5")
        _wait_rows(page, 4)
        assert all(samples[e]["reward"] == 1.0 for e in _ids(page))
        page.click("#f-clear")
        _wait_rows(page, 6)
        page.click('#episodes th[data-key="turns"]')
        page.click('#episodes th[data-key="turns"]')  # descending
        turns = page.eval_on_selector_all('#episodes tbody td[data-col="turns"]', "cells => cells.map(c => Number(c.textContent))")
        assert turns == sorted((s["metadata"]["turns"] for s in samples.values()), reverse=True)
        bottom = page.evaluate("document.querySelector('#episodes').getBoundingClientRect().bottom")
        _shot(page, tmp_path, "viewer-episodes.png", clip={"x": 0, "y": 0, "width": 1400, "height": min(900, bottom + 16)})

        eid = sorted(e for e, s in samples.items() if s["status"] == "completed")[0]
        sample = samples[eid]
        page.click(f'#episodes tbody tr[data-id="{eid}"]')
        page.wait_for_selector("#conversation")
        assert page.get_attribute("#conversation details.system", "open") is None  # the system prompt is folded
        calls = [c["function"]["name"] for m in sample["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert len(calls) >= 1 and page.eval_on_selector_all("#conversation .toolcall .callhead b", "bs => bs.map(b => b.textContent)") == calls
        results = [m["content"] for m in sample["messages"] if m["role"] == "tool"]
        assert page.eval_on_selector_all("#conversation .toolcall .result pre", "ps => ps.map(p => p.textContent)") == results
        users = [m["content"] for m in sample["messages"] if m["role"] == "user"]
        assert page.eval_on_selector_all('#conversation [data-role="user"] pre', "ps => ps.map(p => p.textContent)") == users
        reward = page.inner_text("#reward")
        info = sample["metadata"]["reward_info"]
        actions = info["action_match"]
        assert re.search(r"reward\s+1\b", reward) and re.search(r"DB check \(db_match\)\s+✓ yes", reward), reward
        assert re.search(r"raw reward \(tau2's, unshaped\)\s+1\b", reward), reward  # unshaped run: the same
        assert f"breakdown: DB\t{info['reward_breakdown']['DB']:g}" in reward and f"gold actions matched\t{sum(actions)} of {len(actions)}" in reward, reward
        _shot(page, tmp_path, "viewer-conversation.png")

        page.click("#tab-tokens")
        page.wait_for_selector("#tokens .toks .tok", state="attached")
        got = page.evaluate(TOKEN_COLOURS)
        legend, toks = got["legend"], got["toks"]
        assert len(set(legend.values())) == 3, legend
        assert [i for i, _, _ in toks] == list(range(len(sample["tokens"])))
        p = len(sample["tokens"]) - sample["response_length"]
        colour = {legend["m1"]: 1, legend["m0"]: 0}
        assert all(bg == legend["p"] for _, bg, _ in toks[:p])
        assert [colour.get(bg) for _, bg, _ in toks[p:]] == sample["loss_mask"]  # token for token
        for (_, _, title), m, lp in zip(toks[p:], sample["loss_mask"], sample["rollout_log_probs"]):
            if m:
                assert float(re.search(r"logp (\S+)", title).group(1)) == lp
        marks = page.eval_on_selector_all("#tokens .callmark[title]", "ms => ms.map(m => m.textContent)")
        assert marks == [f"call {j} · v{v}" for j, ((a, b), v) in enumerate(zip(sample["generation_spans"], sample["weight_versions"])) if b > a]
        first = p + sample["loss_mask"].index(1)
        page.hover(f'#tokens .tok[data-i="{first}"]')
        assert "mask 1" in page.inner_text("#tokinfo") and f"token {first}" in page.inner_text("#tokinfo")
        _shot(page, tmp_path, "viewer-tokens.png")
        page.click("#nav a[data-route=summary]")
        page.wait_for_selector("#status-counts")
        assert page.inner_text('#status-counts tr[data-key="max_steps"]').split() == ["max_steps", "2"]
        assert errors == []


def test_the_page_shows_episodes_appended_while_it_is_open(browser, run_a, tmp_path):
    """A run still going: the journal grows line by line (one line written in two pieces, and a
    malformed line among them); the open page shows each episode as it arrives, its outcome once
    its group reaches samples.jsonl, and a failure with its error text, without a reload."""
    live = tmp_path / "live"
    live.mkdir()
    for name in ("config.yaml", "specs.jsonl"):
        shutil.copy(run_a / name, live / name)
    state = json.loads((run_a / "run.json").read_text())
    (live / "run.json").write_text(json.dumps(dict(state, status="running")))
    journal = (run_a / "episodes.jsonl").read_text().splitlines(keepends=True)
    (live / "episodes.jsonl").write_text("".join(journal[:2]))
    (live / "samples.jsonl").write_text("")
    log = tmp_path / "viewer.log"
    with viewer(log, str(live)) as (url, proc):
        page, errors = _page(browser, url + "?poll=300")
        _wait_rows(page, 2)
        assert page.eval_on_selector_all('#episodes tbody td[data-col="outcome"]', "c => c.map(x => x.textContent)") == ["pending"] * 2
        with open(live / "episodes.jsonl", "a") as f:
            f.write(journal[2][:100])
            f.flush()
            time.sleep(1.5)  # several refreshes see half a line
            assert len(_ids(page)) == 2 and proc.poll() is None
            f.write(journal[2][100:] + '{"tokens": [1, 2\n')
            f.flush()
            _wait_rows(page, 3)
            f.write("".join(journal[3:]))
        _wait_rows(page, 6)
        with open(live / "samples.jsonl", "a") as f:
            f.write((run_a / "samples.jsonl").read_text())
        page.wait_for_function("""[...document.querySelectorAll('#episodes tbody td[data-col="outcome"]')].every(c => c.textContent === 'trained')""",
                               timeout=30000)
        # an infrastructure failure arrives: the journal's line, then failed.jsonl's (a real line, its status and error changed)
        failed = json.loads(journal[0])
        failed["metadata"].update(episode_id="b0:retail/0/9", error="EnvironmentStepError: the tool raised\nTraceback (most recent call last): ...")
        failed.update(episode_id="b0:retail/0/9", status="env_error", reward=0.0)
        with open(live / "episodes.jsonl", "a") as f:
            f.write(json.dumps(failed) + "\n")
        with open(live / "failed.jsonl", "a") as f:
            f.write(json.dumps(failed) + "\n")
        _wait_rows(page, 7)
        page.wait_for_function("""document.querySelector('tr[data-id="b0:retail/0/9"] td[data-col="outcome"]').textContent === 'failed: env_error'""",
                               timeout=30000)
        assert page.inner_text('tr[data-id="b0:retail/0/9"] td[data-col="termination"]') == "EnvironmentStepError: the tool raised"
        (live / "run.json").write_text(json.dumps(state))
        page.wait_for_function("document.getElementById('runinfo').dataset.status === 'finished'", timeout=30000)
        assert "1 malformed line(s) skipped" in page.inner_text("#runinfo")
        page.click('tr[data-id="b0:retail/0/9"]')
        page.wait_for_selector("#error")
        assert page.inner_text("#error") == failed["metadata"]["error"]
        assert errors == []
    assert "episodes.jsonl:4: skipping a malformed line" in log.read_text()


def test_two_runs_side_by_side_and_the_log_probs_on_hover(browser, run_a, run_b, tmp_path):
    tiny = {s["metadata"]["episode_id"]: s for s in _lines(run_b / "samples.jsonl")}
    with viewer(tmp_path / "viewer.log", str(run_a), "--compare", str(run_b)) as (url, _):
        page, errors = _page(browser, url + "#/compare")
        page.wait_for_selector("#compare")
        counts = page.inner_text("#comparecounts")
        assert counts.startswith("3 tasks; 1 changed reward (0 higher in B, 1 lower); 1 only in A, 0 only in B"), counts
        changed = page.eval_on_selector_all("#compare tr.changed", "rs => rs.map(r => r.dataset.task)")
        assert changed == ["retail/0"]
        assert page.eval_on_selector_all("#compare tr.row", "rs => rs.map(r => r.dataset.task)") == ["retail/0", "retail/1", "retail/2"]
        assert page.inner_text('#compare tr[data-task="retail/1"] td:last-child') == "only in A"
        page.click('#compare tr[data-task="retail/0"]')
        eid = next(e for e, s in tiny.items() if s["metadata"]["task_id"] == "0")
        page.click(f'#compare a[href="#/episode/b/{urllib.parse.quote(eid, safe="")}/conversation"]')  # B's (the ids are A's too)
        page.wait_for_selector("#eptitle")
        assert page.inner_text("#eptitle") == f"episode {eid} (compared run)"
        page.wait_for_selector("#conversation")
        page.click("#tab-tokens")
        page.wait_for_selector("#tokens .toks .tok", state="attached")
        sample = tiny[eid]
        toks = page.evaluate(TOKEN_COLOURS)["toks"]
        p = len(sample["tokens"]) - sample["response_length"]
        shown = [float(re.search(r"logp (\S+)", t).group(1)) for (_, _, t), m in zip(toks[p:], sample["loss_mask"]) if m]
        want = [lp for lp, m in zip(sample["rollout_log_probs"], sample["loss_mask"]) if m]
        assert shown == want and len(set(want)) > 1  # the tiny model's own log-probs, each on its token
        assert errors == []


def _train_line(step: int, reward: float, filtered: int, diff: float) -> dict:
    """A line with the keys launch/train_grpo_tiny.py writes to train_log.jsonl (values made up:
    a real GRPO run takes minutes; tests/e2e/test_train_grpo_tiny.py checks the script's own)."""
    return {"step": step, "weight_version": step + 1, "groups_used": 2, "groups_filtered": filtered, "episodes_submitted": 8,
            "episodes_delivered": 8, "episodes_interrupted": 1, "episodes_continued": 1, "episodes_excluded": 2 * filtered,
            "episodes_outstanding_at_update": 2, "update_checked": True, "update_generating_requests": 2, "update_waited_s": 0.01,
            "update_episodes_running": 2, "update_interrupted_calls": 1, "weight_versions_seen": [str(step)], "reward_mean": reward,
            "max_abs_logprob_diff": diff, "logprob_tokens_checked": 512, "loss": 0.01, "tokens": 512, "clipped_tokens": 0,
            "update_norm": 1.5, "seconds": 12.5}


def test_a_grpo_folder_opens_on_its_train_log_plotted_by_step(browser, tmp_path):
    """The GRPO example's output folder holds its train log (no sample files): the page opens on
    the plots, one point per step, and draws the steps appended while it is open."""
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    lines = [_train_line(0, 0.25, 1, 2e-6), _train_line(1, 0.5, 0, 1e-6), _train_line(2, 0.75, 2, 3e-6)]
    (grpo / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
    with viewer(tmp_path / "viewer.log", str(grpo)) as (url, _):
        page, errors = _page(browser, url + "?poll=300")
        page.wait_for_selector("#trainlog svg.plot")
        assert page.evaluate("location.hash") == "#/train"
        titles = page.eval_on_selector_all("#trainlog svg.plot", "ps => ps.map(p => p.dataset.title)")
        assert titles == ["reward mean", "groups filtered", "max |trainer − rollout| log-prob"]
        with open(grpo / "train_log.jsonl", "a") as f:
            f.write(json.dumps(lines[2]) + "\n")
        page.wait_for_function("document.querySelectorAll('#trainlog svg.plot')[0].querySelectorAll('circle').length === 3", timeout=30000)
        dots = page.eval_on_selector_all("#trainlog svg.plot circle title", "ts => ts.map(t => t.textContent)")
        shown = [(int(t.split(": ")[0].removeprefix("step ")), float(t.split(": ")[1])) for t in dots]
        assert shown == [(x["step"], x[k]) for k in ("reward_mean", "groups_filtered", "max_abs_logprob_diff") for x in lines]
        ys = page.eval_on_selector_all("#trainlog svg.plot:first-of-type circle", "cs => cs.map(c => Number(c.getAttribute('cy')))")
        assert ys[0] > ys[1] > ys[2]  # the reward mean rises: up the plot (SVG y grows downwards)
        assert errors == []


def test_an_episode_of_several_segments_shows_each_segment_as_the_trainer_gets_it(browser, run_c, tmp_path):
    [episode] = _lines(run_c / "episodes.jsonl")
    samples = _lines(run_c / "samples.jsonl")  # trajectory mode: one sample per segment
    starts = episode["segment_starts"]
    assert len(starts) >= 1 and len(samples) == len(starts) + 1
    eid = episode["metadata"]["episode_id"]
    with viewer(tmp_path / "viewer.log", str(run_c)) as (url, _):
        page, errors = _page(browser, url + V_HASH.format(id=urllib.parse.quote(eid, safe=""), tab="tokens"))
        page.wait_for_selector("#tokens .toks .tok", state="attached")
        starts_shown = page.eval_on_selector_all("#tokens table.segments tr td:nth-child(2)", "ts => ts.map(t => Number(t.textContent))")
        p = len(episode["tokens"]) - episode["response_length"]
        assert starts_shown == [-p, *starts]
        # the tokens between the segment marks, read back from the page, are the trainer's samples
        pieces = page.evaluate("""() => {
          const out = [[]];
          for (const el of document.querySelectorAll('#tokens .toks .segmark, #tokens .toks .tok')) {
            if (el.classList.contains('segmark')) out.push([]);
            else out[out.length - 1].push(Number(/ id (\\d+)/.exec(el.title)[1]));
          }
          return out;
        }""")
        assert pieces == [s["tokens"] for s in samples]
        toks = page.evaluate(TOKEN_COLOURS)
        colour = {toks["legend"]["m1"]: 1, toks["legend"]["m0"]: 0}
        assert [colour.get(bg) for _, bg, _ in toks["toks"][p:]] == episode["loss_mask"]
        page.eval_on_selector("#tokens .segmark", "m => m.scrollIntoView({block: 'center'})")
        _shot(page, tmp_path, "viewer-segments.png")
        page.goto(url + "#/episodes")
        _wait_rows(page, 1)
        assert page.inner_text('#episodes td[data-col="segments"]') == str(len(samples))
        assert errors == []


def _font_draws(code_point: int) -> bool:
    """Whether an installed font has the character (fontconfig's list; Chromium on Linux draws from it)."""
    fc = shutil.which("fc-list")
    if fc is None:
        pytest.skip("no fc-list: cannot tell which characters this machine's fonts draw")
    return bool(subprocess.run([fc, f":charset={code_point:x}", "family"], capture_output=True, text=True, timeout=60).stdout.strip())


def test_a_token_no_font_draws_is_shown_escaped_never_as_a_box(browser, run_eval, tmp_path):
    """DeepSeek-V4's special tokens hold U+FF5C (FULLWIDTH VERTICAL LINE): where no installed font
    has it (no CJK fonts, as on this machine), the token view shows it as \\uFF5C; characters a font
    has (U+2581 in DejaVu, the ASCII) are shown as they are; invisible ones (U+200B) are escaped."""
    [episode] = _lines(run_eval / "episodes.jsonl")[:1]
    eid = episode["episode_id"]
    bar, block = "\uff5c", "\u2581"
    bar_drawn = _font_draws(0xFF5C)  # False here: no CJK font (fc-list lists none with U+FF5C)
    with viewer(tmp_path / "viewer.log", str(run_eval)) as (url, _):
        texts = _get(url + "api/tokens?" + urllib.parse.urlencode({"id": eid}))["parts"][0]["text"]
        page, errors = _page(browser, url + V_HASH.format(id=urllib.parse.quote(eid, safe=""), tab="tokens"))
        page.wait_for_selector("#tokens .toks .tok", state="attached")
        shown = page.eval_on_selector_all("#tokens .toks .tok", "ts => ts.map(t => [t.textContent, t.title, t.classList.contains('esc')])")
        assert len(shown) == len(texts)
        special = [i for i, t in enumerate(texts) if bar in t]
        assert special and any(block in texts[i] for i in special)  # <｜begin▁of▁sentence｜>, <｜User｜>, ...
        for i, t in enumerate(texts):
            text, title, escaped = shown[i]
            want = t.replace("\n", "↵\n").replace("\t", "→\t")
            if bar in t and not bar_drawn:
                assert escaped and bar not in text and text == want.replace(bar, "\\uFF5C"), (i, t, text)
                assert "shown escaped: U+FF5C" in title
            elif all(" " <= c <= "~" or c in "\n\t" for c in t):
                assert not escaped and text == want, (i, t, text)
        if _font_draws(0x2581):
            assert any(block in text for text, _, _ in shown)  # drawn as it is: not every non-ASCII character is escaped
        # the page's own judgement, against fontconfig's, and on characters whatever the fonts
        assert page.evaluate("V.canDraw('\\uFF5C')") == bar_drawn
        assert page.evaluate("V.canDraw('a')") is True and page.evaluate("V.canDraw('\\u200B')") is False
        assert page.evaluate("V.glyphPieces('a\\u200Bb')") == [["a", False], ["\\u200B", "\u200b"], ["b", False]]
        assert page.evaluate("V.glyphPieces('\\u{10FFFD}')") == [["\\u{10FFFD}", "\U0010fffd"]]
        assert page.evaluate("V.glyphPieces('plain ascii')") is None
        if SHOTS:
            page.eval_on_selector("#tokens .tok.esc", "t => t.scrollIntoView({block: 'center'})")
            _shot(page, tmp_path, "viewer-escaped-tokens.png")
        assert errors == []
