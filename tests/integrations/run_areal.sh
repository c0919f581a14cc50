#!/usr/bin/env bash
# The AReaL integration tests (tests/integrations/) in an environment of their own. AReaL 1.0.4
# pins torch<2.11 (this machine's CPU torch is 2.13.0; torch 2.10 on PyPI is a CUDA build),
# transformers<=5.3 and pre-releases of omegaconf and hydra-core, and pulls in agent SDKs
# (openhands, claude-agent-sdk, langchain, ...) the workflow does not use. So areal is installed
# without its dependencies, beside the project (pinned by constraints/verl.txt) and exactly what
# areal.api, areal.engine.sglang_remote and its WorkflowExecutor import. Makes (or reuses) the
# venv $AREAL_VENV (default .venv-areal at the repository root), then runs pytest on
# tests/integrations (or the test paths and pytest options given). pip reports areal's unmet pins; they are
# expected.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${AREAL_VENV:-.venv-areal}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -c constraints/verl.txt torch==2.13.0 -e ".[test,tiny]" \
    hydra-core torchdata colorlog==6.12.0 lark==1.3.1 numba==0.68.1 einops==0.8.2 aiofiles==25.1.0 pybase64==1.5.1
"$VENV/bin/pip" install -q --no-deps areal==1.0.4 2>&1 | grep -v -e "^WARNING: Location" -e "areal 1.0.4 requires" -e "dependency resolver" || true
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests/integrations}"
