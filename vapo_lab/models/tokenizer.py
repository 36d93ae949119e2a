"""The embedded tokenizer: byte-level BPE for any UTF-8 text, plus one token per task word.

Built locally with ``tokenizers`` and wrapped as a ``transformers`` fast tokenizer, so it saves and
loads like a real checkpoint's. The base vocabulary is GPT-2's 256 byte symbols with no merges, so
any text encodes (a token a byte) and decodes back exactly. Each task word is an added token, bare
and with a leading space, matched before byte-level splitting: a space-separated scratchpad costs
one token a word, and ``decode(encode(s)) == s`` still holds. ``<|bos|>``, ``<|endoftext|>`` (eos)
and ``<|pad|>`` take ids 0..2; encoding adds none of them, as Qwen2's tokenizer.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"


def build_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Returns a byte-level tokenizer in which each of ``words`` (and " " + word) is one token.

    The order of ``words`` (e.g. :meth:`vapo_lab.tasks.arith.ArithTask.vocabulary`) fixes their
    ids. The tokenizer pads on the right (set ``padding_side="left"`` for batched generation) and
    does not clean up spaces on decode, which would break round trips.

    Raises:
        ValueError: a word is empty, has whitespace, or repeats.
    """
    if len(set(words)) != len(words):
        raise ValueError("build_tokenizer: the task words repeat; pass each word once")
    for word in words:
        if not word or any(ch.isspace() for ch in word):
            raise ValueError(f"build_tokenizer: task word {word!r} is empty or contains whitespace")

    specials = [BOS, EOS, PAD]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # add_prefix_space=False: a leading space would be invented on encode and kept on decode.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    added = []
    for word in words:
        # A one-character word that is already a byte symbol ("+") needs no bare added token.
        if word not in vocab:
            added.append(word)
        added.append(" " + word)
    tokenizer.add_tokens([AddedToken(w, normalized=False) for w in added])

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        padding_side="right",
        model_max_length=1 << 30,
    )
