"""The shape of a causal LM, as the resource plan needs it, from a config.json or a known name.

A ``Shape`` holds the numbers of a Hugging Face ``config.json`` that fix the parameter count, the
activations and the KV cache. Three sources give one: the embedded tiny model
(``model.arch.*``), a local checkpoint's ``config.json`` (read from disk, never downloaded), or
``KNOWN_ARCHS``, the one table of public architectures, for a plan made before the weights are
on the machine (``model.arch_name``; ``scale=paper`` names Qwen2.5-32B).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vapo_lab.errors import ConfigError
from vapo_lab.registry import unknown_name_message


@dataclass(frozen=True)
class Shape:
    """The shape of a decoder-only transformer (Qwen2 naming: h, L, a, kv heads, d, i, V).

    ``qkv_bias``: q, k and v projections have biases (Qwen2 always; o_proj never). Counts are
    exact for Qwen2 and for Llama-style models without attention biases.
    """

    hidden_size: int  # h
    num_layers: int  # L
    num_heads: int  # a: query heads
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # d
    intermediate_size: int  # i: SwiGLU width
    vocab_size: int  # V
    tie_word_embeddings: bool
    max_position_embeddings: int  # the context the model is set up for
    qkv_bias: bool = True

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> Shape:
        """Returns the shape a Hugging Face ``config.json`` (as a dict) describes.

        Defaults follow transformers' Qwen2Config: no ``head_dim`` key means h / a, no
        ``num_key_value_heads`` means a, no ``tie_word_embeddings`` means untied; q/k/v biases for
        ``model_type`` qwen2, else ``attention_bias`` (Llama's key, default false).

        Raises:
            ConfigError: a key the shape needs is missing.
        """
        need = (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        )
        missing = [k for k in need if k not in config]
        if missing:
            raise ConfigError(
                f"the model's config.json lacks {', '.join(missing)}: the plan needs "
                f"{', '.join(need)}"
            )
        h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(
            hidden_size=h,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or h // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
            qkv_bias=config.get("model_type") == "qwen2"
            or bool(config.get("attention_bias", False)),
        )


def read_shape(path: str | Path) -> Shape:
    """Returns the shape in ``path``/config.json, a local checkpoint directory.

    Raises:
        ConfigError: no config.json there, or it is not JSON or lacks a key.
    """
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ConfigError(
            f"model.path={str(path)!r} is not a model directory (no config.json there): set "
            "model.path to a local checkpoint, or model.arch_name to a known architecture "
            f"({', '.join(KNOWN_ARCHS)}) for a plan without the weights"
        )
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{file} cannot be read as JSON ({e}): point model.path at a checkpoint "
            "saved with save_pretrained"
        ) from e
    return Shape.from_hf_config(config.get("text_config", config))


def _qwen25(
    h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool, context: int
) -> Shape:
    return Shape(
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=h // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        max_position_embeddings=context,
    )


# The public base checkpoints' config.json numbers (huggingface.co/Qwen/<name>): h, L, a, kv, i, V,
# tied, context. tests/models/test_footprint.py checks the counts they give against the model cards
# and the 32B checkpoint's size (docs/distributed.md, Resource plan).
KNOWN_ARCHS: dict[str, Shape] = {
    "Qwen2.5-0.5B": _qwen25(896, 24, 14, 2, 4864, 151936, True, 32768),
    "Qwen2.5-1.5B": _qwen25(1536, 28, 12, 2, 8960, 151936, True, 131072),
    "Qwen2.5-7B": _qwen25(3584, 28, 28, 4, 18944, 152064, False, 131072),
    "Qwen2.5-32B": _qwen25(5120, 64, 40, 8, 27648, 152064, False, 131072),
}


def known_arch(name: str) -> Shape:
    """Returns ``KNOWN_ARCHS[name]``; an unknown name raises ConfigError with the valid ones."""
    if name not in KNOWN_ARCHS:
        raise ConfigError(
            unknown_name_message("model.arch_name", name, list(KNOWN_ARCHS))
            + "; or set model.path to a local checkpoint with a config.json"
        )
    return KNOWN_ARCHS[name]


__all__ = ["KNOWN_ARCHS", "Shape", "known_arch", "read_shape"]
