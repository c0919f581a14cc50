#!/usr/bin/env bash
# The verl integration tests (tests/integrations/) in an environment of their own: verl 0.9.1
# pins transformers<5.11 and, through hydra-core 1.3, omegaconf<2.4, so it does not go into the
# project's .venv. Makes (or reuses) the venv $VERL_VENV (default .venv-verl at the repository
# root) with the CPU torch, the project and its `verl` extra, then runs pytest on
# tests/integrations (or the test paths and pytest options given). The normal test run skips these tests when
# verl is not importable.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${VERL_VENV:-.venv-verl}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -c constraints/verl.txt torch==2.13.0 -e ".[test,tiny,verl]"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests/integrations}"
