#!/usr/bin/env bash
# Submit a job to a Ray cluster with `ray job submit`.
#
#   launch/submit.sh [--address http://HEAD:8265] [--entry launch/job.py] [--python PATH] [--no-wait] -- ARGS...
#
# --entry is the script the job runs (default launch/job.py, the rollout job; e.g.
# launch/train_grpo_tiny.py for the GRPO example); ARGS are its arguments, e.g.
#   launch/submit.sh -- --config configs/retail_grpo.yaml pool.num_actors=32
#   launch/submit.sh --entry launch/train_grpo_tiny.py -- --config configs/local.yaml local.backend=tiny --steps 3
# --address defaults to $RAY_ADDRESS, then http://127.0.0.1:8265 (run it on the head node).
# The project folder is uploaded as the job's working directory (virtual environments, outputs
# and git data excluded); the cluster's Python environment must have the dependencies installed
# (pip install -e . on every node, or add "pip" to the runtime env below).
# `ray` is the project's own (.venv/bin/ray under the repository root; no need to activate the
# virtual environment), else `ray` on PATH; $RAY_BIN overrides both.
# The job runs `PYTHON ENTRY ARGS` on the head, PYTHON named by its path: Ray runs a job's entry
# point with the head's PATH, whose `python` is not the project's when the head was started from
# a virtual environment that was not activated. PYTHON is the `python` beside that `ray` (the
# project's .venv/bin/python), so the path must be the same on the head; --python PATH names the
# head's interpreter otherwise.
# Token authentication (Ray >= 2.5x): `ray start --head` turns it on when it finds a token
# ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, which any local ray.init() writes),
# but `ray job submit` sends the token only with RAY_AUTH_MODE=token; this script sets that by the
# same rule when RAY_AUTH_MODE is unset (a head without authentication ignores the token).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${RAY_BIN:-}" ]]; then
  if ! ray_bin="$(command -v -- "$RAY_BIN")"; then
    echo "submit.sh: RAY_BIN=$RAY_BIN is not an executable (a path, or a command on PATH)" >&2
    exit 127
  fi
elif [[ -x "$here/.venv/bin/ray" ]]; then
  ray_bin="$here/.venv/bin/ray"
elif command -v ray >/dev/null 2>&1; then
  ray_bin="$(command -v ray)"
else
  echo "submit.sh: cannot find 'ray': neither $here/.venv/bin/ray (the project's virtual environment) nor 'ray' on PATH;" \
    "install the project there (python -m venv .venv && .venv/bin/pip install -e .) or set RAY_BIN" >&2
  exit 127
fi
address="${RAY_ADDRESS:-http://127.0.0.1:8265}"
entry="launch/job.py"
python=""
wait_flag=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --address) address="$2"; shift 2 ;;
    --entry) entry="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --no-wait) wait_flag="--no-wait"; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [[ ! -f "$here/$entry" ]]; then
  echo "submit.sh: --entry $entry: no such file in $here" >&2
  exit 2
fi
if [[ -z "$python" ]]; then
  python="$(cd "$(dirname "$ray_bin")" && pwd)/python"  # not resolved: a venv's python is a link out of the venv
  if [[ ! -x "$python" ]]; then
    echo "submit.sh: no python beside $ray_bin to run the job with; pass --python PATH (the head's interpreter" \
      "that has the project installed)" >&2
    exit 2
  fi
fi
if [[ -z "${RAY_AUTH_MODE+set}" ]] && { [[ -n "${RAY_AUTH_TOKEN:-}" ]] || [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]] || [[ -f ~/.ray/auth_token ]]; }; then
  export RAY_AUTH_MODE=token
fi
runtime_env='{"excludes": [".venv", "venv", "outputs", "runs", ".git", "**/__pycache__", ".pytest_cache"], "env_vars": {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "TOKENIZERS_PARALLELISM": "false"}}'
# A head that has just started may not have its job agent yet: Ray then refuses the submission
# ("No available agent to submit job, please try again later") before creating any job, so
# retrying it is safe. Up to $SUBMIT_AGENT_WAIT_S seconds (default 60); then one line naming the
# agent's log (a head whose agent never started: often its port held by another Ray head).
# Ray's output is held until the job is submitted and passed through from then on (the job's own
# logs stream as they come), so that a refusal is one line here instead of Ray's traceback per try.
agent_wait_s=${SUBMIT_AGENT_WAIT_S:-60}
agent_log="${RAY_TMPDIR:-${TMPDIR:-/tmp}}/ray/session_latest/logs/dashboard_agent.log"

# Reads Ray's output: prints it once the submission succeeded; returns 10 (nothing printed) when
# Ray refused for want of a job agent, 11 when nothing answered at the address, else prints it all.
relay() {
  local line released=0 all
  local -a held=()
  while IFS= read -r line || [[ -n "$line" ]]; do
    if (( released )); then printf '%s\n' "$line"; continue; fi
    held+=("$line")
    if [[ "$line" == *"submitted successfully"* ]]; then
      printf '%s\n' "${held[@]}"
      released=1
      held=()
    fi
  done
  (( released )) && return 0
  all="$(printf '%s\n' "${held[@]}")"
  [[ "$all" == *"No available agent to submit job"* ]] && return 10
  [[ "$all" == *"Failed to connect to Ray at address"* ]] && return 11
  (( ${#held[@]} == 0 )) || printf '%s\n' "${held[@]}"
  return 0
}

# The one line for a head without a job agent: the port its agent could not bind when its log is
# on this machine and says so, else where to look.
no_agent() {
  local host port=""
  host="${address#*://}"
  host="${host%%[:/]*}"
  if [[ "$host" == 127.0.0.1 || "$host" == localhost || "$host" == "$(hostname)" ]] && [[ -f "$agent_log" ]]; then
    port="$(grep -o 'Agent port #[0-9]* failed to bind' "$agent_log" | tail -n 1 | tr -dc '0-9')" || true
  fi
  if [[ -n "$port" ]]; then
    echo "submit.sh: the Ray head at $address has no job agent after ${agent_wait_s} s: its dashboard agent could not bind port $port" \
      "(held by another process, e.g. another Ray head), see $agent_log; start the head with a free one:" \
      "ray start --head --dashboard-agent-listen-port PORT" >&2
  else
    echo "submit.sh: the Ray head at $address has no job agent after ${agent_wait_s} s (Ray: 'No available agent to submit job'):" \
      "its dashboard agent did not start; see $agent_log on the head (often its port, 52365 by default, held by another Ray head" \
      "there: ray start --head --dashboard-agent-listen-port PORT)" >&2
  fi
}

deadline=$(( SECONDS + agent_wait_s ))
said_waiting=0
while true; do
  set +e
  "$ray_bin" job submit --address "$address" --working-dir "$here" --runtime-env-json "$runtime_env" $wait_flag \
    -- "$python" "$entry" "$@" 2>&1 | relay
  status=("${PIPESTATUS[@]}")
  set -e
  case "${status[1]}" in
    10)
      if (( SECONDS < deadline )); then
        (( said_waiting )) || echo "submit.sh: the Ray head at $address has no job agent yet; trying again for up to ${agent_wait_s} s" >&2
        said_waiting=1
        sleep 3
        continue
      fi
      no_agent
      exit 1 ;;
    11)
      echo "submit.sh: no Ray head answers at $address (Ray: 'Failed to connect'): start one (ray start --head) or pass" \
        "--address http://HEAD:8265 (the head's dashboard port)" >&2
      exit 1 ;;
  esac
  exit "${status[0]}"
done
