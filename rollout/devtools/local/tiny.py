"""The ``tiny`` backend: a small randomly initialised Qwen3-architecture LM on the CPU.

It exists so the local stack produces *real* tokens and *real* log-probs (with the real Qwen3
vocabulary and chat template) without a GPU or a model hub: nothing is downloaded, the weights
are drawn from ``cfg.seed``. It is a test/demo model, not a replacement for SGLang.

Log-prob convention (what :meth:`TinyLMBackend.generate` reports and what an RL trainer
recomputes): for a sampled token ``t`` at temperature ``T`` the reported value is
``log_softmax(logits / T)[t]`` over the **full** vocabulary, in float32, computed *before* any
top-k / top-p truncation. Greedy decoding (``T == 0``) reports ``log_softmax(logits)[t]``
(``T = 1``). :func:`recompute_log_probs` computes the same quantity with one full forward pass,
which is what ``python -m rollout.check exactness`` compares against.

Weight updates: :meth:`TinyLMBackend.load_weights` loads a folder written by a trainer with
``transformers``' ``save_pretrained`` (``config.json`` + ``model.safetensors``; :func:`save_weights`
writes one) and swaps the model in under the forward lock, so every later forward pass uses it.

torch is an optional extra (``pip install 'tau-rollout[tiny]'``); torch and the torch parts of
``transformers`` are imported only here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "the 'tiny' local backend needs torch: pip install 'tau-rollout[tiny]' "
        "(on the project's machines: pip install torch==2.13.0, the CPU build)"
    ) from exc

from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from rollout.core.config import TinyModelConfig
from rollout.devtools.local.backend_api import SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["TinyLMBackend", "build_tiny_model", "load_model", "recompute_log_probs", "save_weights"]

# Positions per lm_head chunk in recompute_log_probs: 256 x 151669 float32 logits is ~155 MB.
_HEAD_CHUNK = 256

_CFG_FIELDS = {f.name for f in dataclasses.fields(TinyModelConfig)}
_EXTRA_FIELDS = {"tie_word_embeddings", "rope_theta", "initializer_range"}


def _tiny_cfg(cfg: Any) -> dict:
    """Normalise ``cfg`` (TinyModelConfig, mapping such as a dict / DictConfig, or None) to a dict
    with every TinyModelConfig field plus the optional extras."""
    out: dict[str, Any] = dataclasses.asdict(TinyModelConfig())
    out.update(tie_word_embeddings=True, rope_theta=1_000_000.0, initializer_range=0.02)
    if cfg is None:
        return out
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        given = dataclasses.asdict(cfg)
    elif isinstance(cfg, Mapping) or hasattr(cfg, "items"):
        given = dict(cfg.items())
    else:
        raise TypeError(
            f"tiny model cfg must be a TinyModelConfig or a mapping, not {type(cfg).__name__}"
        )
    unknown = set(given) - _CFG_FIELDS - _EXTRA_FIELDS
    if unknown:
        logger.warning("tiny model cfg: ignoring unknown keys %s", sorted(unknown))
    out.update(
        {k: v for k, v in given.items() if k in _CFG_FIELDS or k in _EXTRA_FIELDS}
    )
    if out["hidden_size"] % out["num_attention_heads"]:
        raise ValueError(
            "tiny model: hidden_size must be divisible by num_attention_heads"
        )
    if out["num_attention_heads"] % out["num_key_value_heads"]:
        raise ValueError(
            "tiny model: num_attention_heads must be divisible by num_key_value_heads"
        )
    return out


def build_tiny_model(
    vocab_size: int, cfg: dict | TinyModelConfig | None = None
) -> Qwen3ForCausalLM:
    """Build a randomly initialised float32 Qwen3ForCausalLM in eval mode.

    The weights depend only on ``cfg.seed`` and the shapes: every parameter is (re)drawn in name
    order from a private ``torch.Generator`` (norm weights = 1, everything else
    ``N(0, initializer_range)``), so the same seed gives bit-identical weights in any process, and
    the global torch RNG is left untouched (construction runs under ``torch.random.fork_rng``).

    Args:
        vocab_size: number of token ids the model must cover (``len(tokenizer)``, 151669 for Qwen3).
        cfg: the architecture (``TinyModelConfig`` fields; optional ``tie_word_embeddings``,
            default True, ``rope_theta``, default 1e6, ``initializer_range``, default 0.02).
    """
    c = _tiny_cfg(cfg)
    config = Qwen3Config(
        vocab_size=int(vocab_size),
        hidden_size=int(c["hidden_size"]),
        intermediate_size=int(c["intermediate_size"]),
        num_hidden_layers=int(c["num_hidden_layers"]),
        num_attention_heads=int(c["num_attention_heads"]),
        num_key_value_heads=int(c["num_key_value_heads"]),
        head_dim=int(c["hidden_size"]) // int(c["num_attention_heads"]),
        max_position_embeddings=int(c["max_position_embeddings"]),
        tie_word_embeddings=bool(c["tie_word_embeddings"]),
        rope_parameters={"rope_type": "default", "rope_theta": float(c["rope_theta"])},
        initializer_range=float(c["initializer_range"]),
        use_sliding_window=False,
        use_cache=True,
        dtype=torch.float32,
    )
    config._attn_implementation = "sdpa"
    seed = int(c["seed"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.float32)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    std = float(c["initializer_range"])
    with torch.no_grad():
        # named_parameters() yields a tied weight once, so tied embeddings stay tied.
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
    model.eval()
    model.requires_grad_(False)
    return model


# Config fields a checkpoint must share with the running model: KV caches of requests paused
# between two steps are reused with the new weights, so their shapes must not change.
_SAME_SHAPE_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
)


def save_weights(model: Qwen3ForCausalLM, path: str | os.PathLike) -> Path:
    """Write ``model`` to the folder ``path`` as a trainer would (``save_pretrained``:
    ``config.json`` and ``model.safetensors``), for ``/update_weights_from_disk``.

    Creates the folder if needed and returns it as a :class:`~pathlib.Path`.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    return out


def load_model(path: str | os.PathLike, vocab_size: int | None = None) -> Qwen3ForCausalLM:
    """Load a ``save_pretrained`` Qwen3 checkpoint folder as a float32, eval-mode, no-grad model.

    Only local files are read (never a model hub). Args: ``path``, the folder; ``vocab_size``,
    if given, the number of token ids the model must cover exactly (``len(tokenizer)``).

    Raises:
        FileNotFoundError: ``path`` is not a folder holding ``config.json``.
        ValueError: the checkpoint's vocabulary size differs from ``vocab_size``.
        OSError / other ``transformers`` errors: unreadable or incomplete weights.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder: {str(folder)!r}")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json (not a save_pretrained folder)")
    model = Qwen3ForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
    )
    if vocab_size is not None and model.config.vocab_size != vocab_size:
        raise ValueError(
            f"checkpoint vocab_size {model.config.vocab_size} != tokenizer vocabulary {vocab_size}"
        )
    model = model.to(torch.float32)
    model.eval()
    model.requires_grad_(False)
    return model


def _effective_temperature(temperature: float) -> float:
    """Greedy (T <= 0) reports log-probs at T = 1."""
    return float(temperature) if temperature and temperature > 0 else 1.0


def recompute_log_probs(
    model: Qwen3ForCausalLM, tokens: list[int], temperature: float = 1.0
) -> list[float]:
    """Log-probs of ``tokens[1:]`` from one full (causal) forward pass over ``tokens``.

    Element ``j`` is ``log_softmax(logits_j / T)[tokens[j + 1]]`` (float32, full vocabulary), the
    quantity :class:`TinyLMBackend` reports while sampling; ``T <= 0`` means 1. The transformer
    runs once over the whole sequence; the vocabulary projection is applied in chunks of
    positions to keep memory small. Returns ``len(tokens) - 1`` floats (``[]`` for < 2 tokens).
    """
    if len(tokens) < 2:
        return []
    temp = _effective_temperature(temperature)
    ids = torch.tensor([list(tokens)], dtype=torch.long)
    out: list[float] = []
    with torch.inference_mode():
        out_trunk = model.model(input_ids=ids, use_cache=False)
        hidden = out_trunk.last_hidden_state[0]  # (L, H)
        targets = ids[0, 1:, None]
        n = targets.shape[0]
        for start in range(0, n, _HEAD_CHUNK):
            stop = min(start + _HEAD_CHUNK, n)
            logits = model.lm_head(hidden[start:stop]).float()
            if temp != 1.0:
                logits.div_(temp)
            # log_softmax(x)[t] = x[t] - logsumexp(x), without materialising the log_softmax.
            lp = logits.gather(-1, targets[start:stop])[:, 0] - torch.logsumexp(
                logits, dim=-1
            )
            out.extend(lp.tolist())
            del logits
    return out


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    """Inverse-CDF draw of an index from unnormalised non-negative 1-D ``probs`` using a single
    uniform from ``gen`` (float64 cumulative sum; zero-mass entries are never picked)."""
    cdf = torch.cumsum(probs.double(), dim=0)
    u = torch.rand(1, generator=gen, dtype=torch.float64) * cdf[-1]
    return int(torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1))


def _sample(
    logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
) -> tuple[int, float]:
    """Pick one token from 1-D float32 ``logits``; return ``(token, full-vocab log-prob)``.

    Order as in SGLang: temperature, then top-k, then top-p over the renormalised top-k mass.
    The returned log-prob is always ``log_softmax(logits / T)[token]`` over the full vocabulary.
    """
    if params.temperature is None or params.temperature <= 0:
        token = int(torch.argmax(logits))
        return token, float(F.log_softmax(logits, dim=-1)[token])
    scaled = logits / float(params.temperature) if params.temperature != 1.0 else logits
    log_probs = F.log_softmax(scaled, dim=-1)
    k = int(params.top_k) if params.top_k is not None else -1
    p = float(params.top_p) if params.top_p is not None else 1.0
    if k == 1:
        token = int(torch.argmax(log_probs))
        return token, float(log_probs[token])
    if 0 < k < log_probs.shape[-1]:
        cand_lp, cand_ids = torch.topk(log_probs, k)  # sorted, descending
    elif p < 1.0:
        cand_lp, cand_ids = torch.sort(log_probs, descending=True)
    else:
        cand_lp, cand_ids = log_probs, None
    probs = torch.softmax(cand_lp, dim=-1)  # renormalised over the kept candidates
    if p < 1.0 and cand_ids is not None:
        cum = torch.cumsum(probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = (
            int(torch.searchsorted(cum, torch.tensor([p], dtype=cum.dtype)).item()) + 1
        )
        keep = max(1, min(keep, probs.shape[-1]))
        probs = probs[:keep]
        cand_ids = cand_ids[:keep]
    choice = _draw(probs, gen)
    token = int(cand_ids[choice]) if cand_ids is not None else choice
    return token, float(log_probs[token])


class TinyLMBackend:
    """:class:`~rollout.devtools.local.backend_api.GenerationBackend` over the tiny random Qwen3 model.

    Sampling honours ``temperature`` (0 = greedy), ``top_k`` (-1 off), ``top_p`` (1.0 off) and
    ``seed`` (a private ``torch.Generator`` per request: same seed and prompt give the same
    tokens; None draws a fresh OS seed). Reported log-probs follow the module docstring's
    convention. Thread-safe: model forward calls are serialised by a lock, each request keeps its
    own KV cache and RNG, so requests from several threads interleave token by token.
    """

    name = "tiny"

    def __init__(
        self,
        tokenizer: Any,
        cfg: dict | TinyModelConfig | None = None,
        *,
        num_threads: int | None = None,
        chat_format: str = "auto",
    ):
        """Build the model for ``tokenizer`` (an object, or a name for ``load_tokenizer``).

        ``num_threads``: if given, ``torch.set_num_threads(num_threads)`` (process-wide). One
        thread is fastest for decoding on a small shared CPU: a one-token step of this model is
        too small for OpenMP, whose threads then only contend with other processes.
        ``chat_format``: the family whose format renders :meth:`chat`'s prompts when the
        tokenizer has no chat template of its own (``auto``: detected from the tokenizer).
        """
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        if isinstance(tokenizer, str):
            from rollout.core.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self._chat_renderer: Any = None  # the chat format chat() renders with, built on first use
        self.cfg = _tiny_cfg(cfg)
        self.vocab_size = len(tokenizer)
        self.model = build_tiny_model(self.vocab_size, self.cfg)
        self.weights_path: str | None = None  # None: the random weights drawn from cfg.seed
        self._lock = threading.Lock()
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if (
            not isinstance(eos, int)
            or eos < 0
            or eos == getattr(tokenizer, "unk_token_id", None)
        ):
            eos = tokenizer.eos_token_id
        self.eos_token_id: int | None = eos

    # -- helpers ---------------------------------------------------------------------------------

    def _forward_last(self, ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Run ``ids`` (1, n) through the model with ``cache``; return the last position's
        float32 logits (V,)."""
        with self._lock, torch.inference_mode():
            hidden = self.model.model(
                input_ids=ids, past_key_values=cache, use_cache=True
            ).last_hidden_state
            return self.model.lm_head(hidden[0, -1]).float()

    # -- GenerationBackend -----------------------------------------------------------------------

    def generate(
        self, input_ids: list[int], params: SamplingParams
    ) -> Iterator[tuple[int, float]]:
        """Yield ``(token_id, log_prob)`` forever; the caller stops by closing the generator."""
        if not input_ids:
            raise ValueError("tiny backend: empty prompt")
        bad = [t for t in input_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(
                f"tiny backend: token ids out of range [0, {self.vocab_size}): {bad[:5]}"
            )
        gen = torch.Generator(device="cpu")
        if params.seed is not None:
            gen.manual_seed(int(params.seed) & 0xFFFF_FFFF_FFFF_FFFF)
        else:
            gen.manual_seed(int.from_bytes(os.urandom(8), "little"))
        cache = DynamicCache(config=self.model.config)
        next_ids = torch.tensor([list(map(int, input_ids))], dtype=torch.long)
        while True:
            # No context manager spans a yield: inference_mode is thread-local state and the
            # consumer may resume this generator from another thread.
            logits = self._forward_last(next_ids, cache)
            with torch.inference_mode():
                token, log_prob = _sample(logits, params, gen)
            del logits
            yield token, log_prob
            next_ids = torch.tensor([[token]], dtype=torch.long)

    def chat(self, messages: list[dict], params: SamplingParams) -> str:
        """Render ``messages`` with the chat template (or, for a tokenizer without one, with the
        chat format's :meth:`~rollout.core.formats.ChatFormat.prompt_ids`), sample up to
        ``max_new_tokens`` tokens, stop at ``<|im_end|>`` / EOS / ``stop_token_ids``, return the
        text without special tokens."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompt = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            if self._chat_renderer is None:
                from rollout.core.formats import get_chat_format, resolve_chat_format

                self._chat_renderer = get_chat_format(resolve_chat_format(self.chat_format, self.tokenizer))(self.tokenizer)
            prompt = list(self._chat_renderer.prompt_ids(messages))
        stops = {int(t) for t in params.stop_token_ids}
        if not params.ignore_eos:
            stops.update(
                t
                for t in (self.eos_token_id, self.tokenizer.eos_token_id)
                if t is not None
            )
        out: list[int] = []
        if params.max_new_tokens > 0:
            stream = self.generate(prompt, params)
            try:
                for token, _ in stream:
                    if token in stops:
                        break
                    out.append(token)
                    if len(out) >= params.max_new_tokens:
                        break
            finally:
                stream.close()
        text_out = self.tokenizer.decode(out, skip_special_tokens=True)
        for s in params.stop:
            if s and s in text_out:
                text_out = text_out[: text_out.index(s)]
        return text_out

    def load_weights(self, model_path: str) -> None:
        """Load a ``save_pretrained`` folder (see :func:`load_model`) and swap it in.

        The checkpoint is read outside the forward lock (generation goes on meanwhile) and
        swapped in under it. It must have the running model's shapes (vocabulary, layers, heads,
        head and hidden sizes), since requests paused between steps keep their KV caches.

        Raises:
            FileNotFoundError, ValueError, OSError: see :func:`load_model`; ValueError also for a
                shape mismatch. The old weights stay in use.
        """
        model = load_model(model_path, self.vocab_size)
        old, new = self.model.config, model.config
        diff = [
            f"{k}: {getattr(new, k, None)} != {getattr(old, k, None)}"
            for k in _SAME_SHAPE_FIELDS
            if getattr(new, k, None) != getattr(old, k, None)
        ]
        if diff:
            raise ValueError("checkpoint shape differs from the running model (" + "; ".join(diff) + ")")
        with self._lock:
            self.model = model
            self.weights_path = str(model_path)
        logger.info("tiny backend: loaded weights from %s", model_path)

    # -- exactness -------------------------------------------------------------------------------

    def recompute_log_probs(
        self, tokens: list[int], temperature: float = 1.0
    ) -> list[float]:
        """:func:`recompute_log_probs` on this backend's model (serialised with generation)."""
        with self._lock:
            return recompute_log_probs(self.model, tokens, temperature)

    def num_parameters(self) -> int:
        """Distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.model.parameters())
