"""Tests for vapo_lab.models.tokenizer: exact round trips, task words as single tokens,
save/load."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from vapo_lab.models.tokenizer import BOS, EOS, PAD, build_tokenizer
from vapo_lab.tasks.arith import ArithTask

AIME = Path("/work/shared/data/aime24.jsonl")
TEXTS = [
    "",
    " ",
    "plain ascii, with  two spaces\tand a tab\nand a newline\r\n",
    "emoji 😀👍🏽 and Chinese 中文测试, accents é ü ß, math ∑ √ ∞ \\frac{1}{2}",
    "\x00 control \x7f bytes",
    "x3_7x2_1 ax1_3 x41_1 z1_9c1_1",  # task words glued to other text, and one out of range
]


@pytest.fixture(scope="module")
def task():
    return ArithTask(seed=0, n_train=50, n_eval=10)


@pytest.fixture(scope="module")
def tokenizer(task):
    return build_tokenizer(task.vocabulary())


def _aime_problem() -> str:
    if AIME.is_file():
        return json.loads(AIME.read_text().splitlines()[0])["problem"]
    # the same kind of text where the shared data is absent
    return "Let $x,y$ be real with $\\log_x(y^x)=10$. Find $xy$. Ünïcödé — “quotes”."


@pytest.mark.parametrize("text", TEXTS + [_aime_problem()])
def test_round_trip_of_arbitrary_text(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.bos_token_id not in ids and tokenizer.eos_token_id not in ids  # none added


def test_round_trip_of_task_text(tokenizer, task):
    for p in task.train + task.eval:
        text = p.prompt + task.trace(p)
        assert tokenizer.decode(tokenizer(text).input_ids) == text
        # prompt and response encode separately to the same ids as together
        assert (
            tokenizer(text).input_ids
            == tokenizer(p.prompt).input_ids + tokenizer(task.trace(p)).input_ids
        )


def test_task_words_are_single_tokens(tokenizer, task):
    for word in task.vocabulary():
        assert len(tokenizer(" " + word).input_ids) == 1, word
        assert len(tokenizer(word).input_ids) == 1, word
    ids = tokenizer("x1_4 x2_2 + y1_3 y2_9 =").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["x1_4", " x2_2", " +", " y1_3", " y2_9", " ="]
    # \boxed{ is one token; the answer digits and } are one byte token each
    assert len(tokenizer(" \\boxed{643}").input_ids) == 1 + 3 + 1


def test_special_tokens(tokenizer):
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (BOS, EOS, PAD)
    assert [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id] == [0, 1, 2]
    ids = tokenizer("a").input_ids + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a"
    assert tokenizer.decode(ids) == "a" + EOS


def test_same_words_same_tokenizer(task, tokenizer):
    assert build_tokenizer(task.vocabulary()).get_vocab() == tokenizer.get_vocab()
    with pytest.raises(ValueError, match="repeat"):
        build_tokenizer(["a1_1", "a1_1"])
    with pytest.raises(ValueError, match="whitespace"):
        build_tokenizer(["a b"])


def test_save_and_load_give_the_same_encoding(tokenizer, task, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert len(loaded) == len(tokenizer)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (0, 1, 2)
    for text in TEXTS + [task.train[0].prompt + task.trace(task.train[0])]:
        assert loaded(text).input_ids == tokenizer(text).input_ids
        assert loaded.decode(loaded(text).input_ids) == text
