"""The embedded default policy: a ~1M-parameter Qwen2 causal LM with a structured init.

It is ``transformers``' own Qwen2 built from a config (nothing downloaded), so everything
downstream treats it as a real Qwen2.5 checkpoint. Only some weights' initial values are chosen
here: word embeddings built from shared type, position and digit parts, a layer-0 head that
matches positions, and a wider init; why, as measured: docs/default-task.md, The task and the
model.
"""

from __future__ import annotations

import math
import re

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from vapo_lab.models.arch import TINY_ARCH

# A position-labelled task word, bare or with its leading space: type, position, digit.
_WORD = re.compile(r"^ ?([a-z])(\d+)_(\d)$")


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = TINY_ARCH["hidden_size"],
    num_layers: int = TINY_ARCH["num_layers"],
    num_heads: int = TINY_ARCH["num_heads"],
    num_kv_heads: int = TINY_ARCH["num_kv_heads"],
    intermediate_size: int = TINY_ARCH["intermediate_size"],
    max_position_embeddings: int = TINY_ARCH["max_position_embeddings"],
    seed: int = 0,
    tie_word_embeddings: bool = True,
    structured_init: bool = True,
    rope_theta: float = 1e6,
    init_std: float = 0.1,
) -> Qwen2ForCausalLM:
    """Returns a randomly initialised Qwen2ForCausalLM sized for ``tokenizer`` (~1.1M parameters).

    With the defaults and the arith tokenizer (2827 tokens): embeddings 2827 x 128 = 362k (tied
    with the output layer), 4 layers x 185k = 739k, 1.10M in all. ``seed`` seeds the init and
    leaves the caller's torch RNG state as it was.

    Args:
        tokenizer: gives the vocabulary size, the bos/eos/pad ids and the task words.
        structured_init: when the vocabulary has position-labelled words (``x3_7``), build their
            embeddings from parts and set the position-matching head; other tokens keep
            N(0, init_std²).
        rope_theta: 1e6 as in Qwen2.5, so that the slowest RoPE dimensions (the position-matching
            head's) turn by < 0.25 rad over the longest task sequences.
        init_std: std of the normal init of every weight matrix and embedding.
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
        initializer_range=init_std,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        if structured_init:
            basis = _structured_embeddings(model, tokenizer, config.initializer_range)
            if basis is not None:
                _position_matching_head(model, basis)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@torch.no_grad()
def _structured_embeddings(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, std: float
) -> torch.Tensor | None:
    """Returns the orthonormal basis (d, P) of the position codes after setting the word embeddings.

    Sets, in place, embedding(``tK_D``) = type(t) + position(K) + digit(D) for every position-
    labelled word, and embedding(``D``) = type(plain) + digit(D) for the ten digit characters of
    the boxed answer, so that copying a sum digit into the answer is, through the tied output
    layer, a copy of its digit part. Returns None when the vocabulary has no such words.

    * position(K) = units(K mod 10) + tens(K div 10), with units and tens orthonormal directions
      of their own P-dimensional subspace (P = 10 + number of tens): what the network learns
      about the units of short problems' positions carries over to long problems' positions.
    * type and digit parts lie outside the position subspace, so position matching
      (:func:`_position_matching_head`) sees positions only.

    Each part has the norm of a N(0, (std/√3)²) vector, so a word's embedding has the scale of
    every other token's (std per coordinate) and the three parts weigh the same.
    """
    words = {}
    for token, token_id in tokenizer.get_vocab().items():
        match = _WORD.match(token)
        if match:
            words[token_id] = (match.group(1), int(match.group(2)), int(match.group(3)))
        elif len(token) == 1 and token.isdigit() and token.isascii():
            words[token_id] = ("", None, int(token))
    if not words:
        return None
    embedding = model.get_input_embeddings().weight
    width = embedding.shape[1]
    n_positions = max(k for _, k, _ in words.values() if k is not None) + 1
    n_code = 10 + (n_positions + 9) // 10
    part_norm = std / math.sqrt(3) * math.sqrt(width)  # the norm of a random part

    basis = torch.linalg.qr(torch.randn(width, width)).Q
    position_basis, rest = basis[:, :n_code], basis[:, n_code:]

    def random_parts(count: int) -> torch.Tensor:
        """Random vectors of norm part_norm outside the position subspace."""
        parts = torch.randn(count, rest.shape[1]) @ rest.T
        return parts * part_norm / parts.norm(dim=1, keepdim=True)

    types = sorted({t for t, _, _ in words.values()})
    type_part = random_parts(len(types))
    k = torch.arange(n_positions)
    position_part = (
        (position_basis[:, k % 10] + position_basis[:, 10 + k // 10]).T * part_norm / math.sqrt(2)
    )
    digit_part = random_parts(10)
    for token_id, (t, k, d) in words.items():
        vector = type_part[types.index(t)] + digit_part[d]
        embedding[token_id] = vector if k is None else vector + position_part[k]
    return position_basis


@torch.no_grad()
def _position_matching_head(
    model: Qwen2ForCausalLM, position_basis: torch.Tensor, sharpness: float = 8.0
) -> None:
    """Sets layer 0's first query head and its key head to attend to tokens with the same position.

    The head at the word for column k (``c3_1`` while writing ``z3_*``) then attends to x3, y3 and
    the column's scratchpad words from the start, for every position at once.

    q = k = α·(position coordinates of the normalised input), placed in the head's lowest-RoPE-
    frequency dimensions (rotation ≤ 0.25 rad over 250 tokens with rope_theta = 1e6, so the match
    survives distance). α is set so that an exact position match (units and tens shared) beats a
    units-only one by ``sharpness`` in the attention logits.
    """
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    n_code = position_basis.shape[1]
    half = head_dim // 2
    pairs = (n_code + 1) // 2
    if pairs > half:
        return  # more position codes than the head has dimensions: keep the random init
    # rotate_half pairs dimension i with i + half; the last pairs turn slowest
    dims = [i for i in range(half - pairs, half)] + [i + half for i in range(half - pairs, half)]
    dims = dims[:n_code]
    # after RMSNorm a word's position part has norm √(d/3): each code coordinate ≈ √(d/6)
    coordinate = math.sqrt(config.hidden_size / 6)
    # logit = α²·coordinate²·(shared units + shared tens)/√head_dim; exact minus partial = sharpness
    alpha = math.sqrt(sharpness * math.sqrt(head_dim)) / coordinate
    attention = model.model.layers[0].self_attn
    q, k = attention.q_proj.weight, attention.k_proj.weight
    q[:head_dim] = 0.0
    for row, j in zip(dims, range(n_code)):
        q[row] = alpha * position_basis[:, j]
        k[row] = alpha * position_basis[:, j]
