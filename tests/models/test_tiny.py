"""Tests for vapo_lab.models.tiny and .load: size, structured init, save/load, errors."""

import pytest
import torch

from vapo_lab.errors import ConfigError
from vapo_lab.models.load import load_model_and_tokenizer
from vapo_lab.models.tiny import build_tiny_model
from vapo_lab.models.tokenizer import build_tokenizer
from vapo_lab.tasks.arith import ArithTask


@pytest.fixture(scope="module")
def task():
    return ArithTask(seed=0, n_train=20, n_eval=4)


@pytest.fixture(scope="module")
def tokenizer(task):
    return build_tokenizer(task.vocabulary())


def test_parameter_count_is_about_one_million(tokenizer):
    model = build_tiny_model(tokenizer)
    # per layer: q 128x128+128, k and v 128x64+64, o 128x128, MLP 3x128x352, two norms of 128
    per_layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 352 + 2 * 128
    # embeddings tied with the output layer, plus the final norm
    expected = 4 * per_layer + len(tokenizer) * 128 + 128
    assert sum(p.numel() for p in model.parameters()) == expected
    assert 0.9e6 < expected < 1.3e6
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_structured_init_shares_type_position_and_digit_parts(tokenizer):
    emb = build_tiny_model(tokenizer).get_input_embeddings().weight.detach()

    def e(word):
        return emb[tokenizer.convert_tokens_to_ids(word)]

    # x3_7 - x3_2 = digit(7) - digit(2) = y5_7 - y5_2 = "7" - "2" (the plain answer digits)
    torch.testing.assert_close(e("x3_7") - e("x3_2"), e("y5_7") - e("y5_2"), atol=1e-6, rtol=0)
    torch.testing.assert_close(e("x3_7") - e("x3_2"), e("7") - e("2"), atol=1e-6, rtol=0)
    # x3_7 - y3_7 = type(x) - type(y) = x9_1 - y9_1; x3_7 - x13_7 = position(3) - position(13)
    torch.testing.assert_close(e("x3_7") - e("y3_7"), e("x9_1") - e("y9_1"), atol=1e-6, rtol=0)
    torch.testing.assert_close(e("x3_7") - e("x13_7"), e("z3_0") - e("z13_0"), atol=1e-6, rtol=0)
    torch.testing.assert_close(e(" z4_0"), e("z4_0"), atol=1e-6, rtol=0)  # bare and spaced alike
    assert not torch.allclose(e("x3_7"), e("x3_2"))
    # three parts of norm 0.1/√3·√128 each, orthogonal (position) or nearly so: the norm of a
    # N(0, 0.1²) vector in 128 dimensions, 0.1·√128 = 1.13, as for the other tokens
    norms = emb[tokenizer.convert_tokens_to_ids(["x3_7", "y1_0", "z9_4", "c5_1"])].norm(dim=1)
    assert torch.all((norms > 0.9) & (norms < 1.4)), norms
    assert 0.9 < emb[tokenizer.convert_tokens_to_ids(["a", "Q"])].norm(dim=1).mean() < 1.4


def test_position_matching_head_attends_to_the_same_column(tokenizer, task):
    # at init, layer 0 head 0 at the word of column k (c_k while z_k is next) puts most of its
    # attention on x_k, y_k and c_k, in a 30-digit problem whose prompt has 60 digits
    model = build_tiny_model(tokenizer)
    model.set_attn_implementation("eager")
    problems = ArithTask(seed=0, n_train=400, n_eval=0).train
    problem = next(p for p in problems if p.meta["n_digits"] >= 30)
    ids = tokenizer(problem.prompt + task.trace(problem)).input_ids
    tokens = [t.strip() for t in tokenizer.convert_ids_to_tokens(ids)]
    with torch.no_grad():
        attention = model(torch.tensor([ids]), output_attentions=True).attentions[0][0, 0]
    for column in (2, 17, 29):
        query = tokens.index(f"c{column}_{task.trace(problem).split(f' c{column}_')[1][0]}")
        same = [
            i
            for i, t in enumerate(tokens[: query + 1])
            if t[:1] in "xyzc" and t[1:].split("_")[0] == str(column)
        ]
        assert attention[query, same].sum() > 0.8, (column, attention[query, same])


def test_same_seed_same_weights(tokenizer):
    torch.manual_seed(123)
    before = torch.rand(1)
    a, b = build_tiny_model(tokenizer, seed=1), build_tiny_model(tokenizer, seed=1)
    torch.manual_seed(123)
    assert torch.rand(1) == before  # the caller's RNG is untouched
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.lm_head.weight, build_tiny_model(tokenizer, seed=2).lm_head.weight)


def test_save_and_load_give_identical_logits(tokenizer, task, tmp_path):
    model = build_tiny_model(tokenizer, seed=3).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model_and_tokenizer(tmp_path)
    p = task.train[0]
    ids = torch.tensor([loaded_tokenizer(p.prompt + task.trace(p)).input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    assert loaded.config.eos_token_id == tokenizer.eos_token_id


def test_load_errors_name_the_bad_value(tmp_path):
    with pytest.raises(ConfigError, match="model.path=.*no config.json"):
        load_model_and_tokenizer(tmp_path / "missing")
    with pytest.raises(ConfigError, match="model.dtype='float8'"):
        load_model_and_tokenizer(tmp_path, dtype="float8")
