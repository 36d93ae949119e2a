"""The embedded tokenizer: byte-level BPE for any UTF-8 text, plus one token per task word.

Built locally with the ``tokenizers`` library (nothing is downloaded) and wrapped as a
``transformers`` fast tokenizer, so it is saved and loaded with ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` exactly like a real checkpoint's tokenizer.

* Any text encodes: the base vocabulary is the 256 byte symbols of GPT-2's byte-level scheme (as
  in Qwen2), with no merges, so an AIME problem, emoji or Chinese become one token per UTF-8 byte
  and decode back exactly.
* Every task word (``x3_7``, ``\\boxed{``, ...) is an added token, twice: bare and with a leading
  space. Added tokens are matched before byte-level splitting, longest first, so ``" x3_7"`` is
  one token and a space-separated scratchpad costs one token per word, not two; decoding an added
  token gives back its text verbatim, so ``decode(encode(s)) == s`` still holds for every ``s``.
* Special tokens ``<|bos|>``, ``<|endoftext|>`` (end of sequence) and ``<|pad|>`` take ids 0..2.
  Encoding adds none of them (like Qwen2's tokenizer); the rollout appends eos to a response.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"


def build_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Returns a byte-level tokenizer in which each of ``words`` (and " " + word) is one token.

    Args:
        words: task words, e.g. :meth:`vapo_lab.tasks.arith.ArithTask.vocabulary`; order fixes
            their ids, so the same list always gives the same tokenizer. Words must not contain
            whitespace (the space-prefixed variant is added here).

    Returns:
        a fast tokenizer with bos/eos/pad set, padding on the right (set ``padding_side="left"``
        for batched generation), and no clean-up of spaces on decode (it would break round trips).

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
