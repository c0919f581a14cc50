"""The real vLLM in the local stack: a random-weight checkpoint of a real architecture and
vocabulary (:func:`write_checkpoint`), vLLM servers on the CPU (:class:`VllmServer`) behind
``vllm-router`` (:class:`VllmRouter`), together :class:`VllmStack`. vLLM runs from a venv of its own
(``.venv-vllm``, ``launch/install_vllm.sh``; docs/engines.md)."""

from rollout.devtools.local.vllm.checkpoint import CheckpointSpec, checkpoint_problem, write_checkpoint
from rollout.devtools.local.vllm.processes import VLLM_PYTHON_ENV, VllmRouter, VllmServer, find_vllm_python, vllm_missing
from rollout.devtools.local.vllm.stack import VllmStack

__all__ = ["VLLM_PYTHON_ENV", "CheckpointSpec", "VllmRouter", "VllmServer", "VllmStack", "checkpoint_problem",
           "find_vllm_python", "vllm_missing", "write_checkpoint"]
