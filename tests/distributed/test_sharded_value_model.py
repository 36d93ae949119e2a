"""A value model built sharded (meta device, FSDP2, each rank's slices read from the safetensors) is
the value model one process makes, and one saved from its shards is the one ``ValueModel.save``
writes: on 2 gloo ranks (tests/distributed/rank_sharded_value_model.py, one torchrun for every
case), for a random Qwen2 with tied and untied embeddings,

(a) started from a causal LM's directory: ``ValueModel.from_causal_lm(from_pretrained(dir))``, every
    parameter and buffer exactly, the values to 1e-6;
(b) from a ``ValueModel.save`` directory with a nonzero head: ``ValueModel.load(dir)`` exactly;
(c) saved from its shards: ``ValueModel.load`` of what was written is the gathered shards exactly,
    and load -> save -> load gives back the weights it started from.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.distributed.world import single
from vapo_lab.errors import CheckpointError, ConfigError
from vapo_lab.models.precision import fsdp_policy
from vapo_lab.models.sharded import load_sharded_value_model, save_sharded_value_model
from vapo_lab.models.value import ValueModel

from .conftest import torchrun

SCRIPT = Path(__file__).with_name("rank_sharded_value_model.py")
# as the rank script's
IDS = torch.tensor([[1, 7, 42, 150, 151, 299, 3, 0], [5, 5, 300, 12, 64, 128, 255, 9]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])

# name: (tie_word_embeddings, dtype of the causal LM's file)
MODELS = {"tied-bf16": (True, torch.bfloat16), "untied-fp32": (False, torch.float32)}


def save_lm(path: Path, tied: bool, dtype: torch.dtype) -> Path:
    """Saves a random Qwen2 causal LM of ~82k parameters (vocab 301: rows split 151 + 150 over 2
    ranks)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=301,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    Qwen2ForCausalLM(cfg).to(dtype).save_pretrained(path)
    return path


def from_lm(path: Path) -> ValueModel:
    """What the trainer makes today on one process of a causal LM's directory."""
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    return ValueModel.from_causal_lm(lm).eval()


def save_vm(path: Path, lm: Path) -> Path:
    """Saves ``lm``'s value model with a random nonzero head (and the head's bias nonzero too)."""
    torch.manual_seed(1)
    vm = from_lm(lm)
    with torch.no_grad():
        vm.head.weight.normal_()
        vm.head.bias.fill_(0.25)
    vm.save(path)
    return path


def whole(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters(remove_duplicate=False))


def assert_same_params(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys()
    for n, p in ref.items():
        assert torch.equal(got[n], p), n


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every model of MODELS saved as a causal LM and as a value model, then (a), (b), (c) in one
    torchrun of 2 ranks; returns {name: (lm dir, value model dir, out dir)}, and the ranks'
    results."""
    root = tmp_path_factory.mktemp("sharded_vm")
    dirs = {}
    for name, spec in MODELS.items():
        lm = save_lm(root / name, *spec)
        dirs[name] = (lm, save_vm(root / f"{name}-vm", lm))
    torchrun(2, SCRIPT, str(root), *(str(d) for pair in dirs.values() for d in pair))
    return root, dirs, torch.load(root / "out.pt", weights_only=True)


def check_sharded(got: dict, ref: ValueModel, compute: str = "None") -> None:
    """The shards gathered are ``ref``'s parameters exactly and every rank's buffers its buffers;
    float32 shards, tagged with the compute dtype, head beside the backbone, eval mode."""
    assert_same_params(got["params"], whole(ref))
    ref_buffers = dict(ref.named_buffers())
    assert len(ref_buffers) == 2  # rotary inv_freq, original_inv_freq: no checkpoint holds them
    for rank_buffers in got["buffers"]:
        assert rank_buffers.keys() == ref_buffers.keys()
        for n, b in ref_buffers.items():
            assert torch.equal(rank_buffers[n], b), n
    assert got["sharded"] and not got["training"]
    assert got["shard_dtypes"] == got["local_dtypes"] == ["torch.float32"]
    assert got["head_device"] == "cpu" and got["compute"] == compute


def check_values(got: dict, ref: ValueModel) -> None:
    """Every rank's values and backbone hidden states are ``ref``'s to 1e-6."""
    positions = (MASK.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref_values = ref(IDS, MASK)
        ref_hidden = ref.backbone(
            input_ids=IDS, attention_mask=MASK, position_ids=positions
        ).last_hidden_state
    for values, hidden in zip(got["values"], got["hidden"], strict=True):
        assert torch.allclose(values, ref_values, rtol=0, atol=1e-6)
        assert torch.allclose(hidden, ref_hidden, rtol=0, atol=1e-6)


def check_read(got: dict, ref: ValueModel) -> None:
    """Each rank read only its slices of the backbone: together every element once, and nothing else
    (not an untied lm_head's; the head is not in the safetensors)."""
    total = sum(p.numel() for p in ref.backbone.parameters())
    assert sum(got["read"]) == total
    assert all(0.4 * total < r < 0.6 * total for r in got["read"])


@pytest.mark.parametrize("name", list(MODELS))
def test_a_critic_from_a_causal_lm_is_from_causal_lm_of_from_pretrained(two_ranks, name):
    _, dirs, out = two_ranks
    ref = from_lm(dirs[name][0])
    got = out[f"{name}/causal_lm"]
    check_sharded(got, ref)
    check_values(got, ref)
    check_read(got, ref)
    # the head starts at zero, as from_causal_lm's
    assert not got["params"]["head.weight"].any() and not got["params"]["head.bias"].any()


@pytest.mark.parametrize("name", list(MODELS))
def test_a_critic_from_a_value_model_dir_is_value_model_load(two_ranks, name):
    _, dirs, out = two_ranks
    ref = ValueModel.load(dirs[name][1]).eval()
    assert ref.head.weight.abs().sum() > 0 and torch.equal(ref.head.bias, torch.tensor([0.25]))
    got = out[f"{name}/value_model"]
    check_sharded(got, ref)
    check_values(got, ref)
    check_read(got, ref)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_critic_saved_from_its_shards_loads_as_the_shards(two_ranks, name):
    root, dirs, out = two_ranks
    # the last saved after a bf16 pass that left the root gathered (in bf16): its float32 shards
    # all the same
    for saved, key in (
        (root / f"{name}-from-lm", "causal_lm"),
        (root / f"{name}-resaved", "value_model"),
        (root / f"{name}-after-pass", "reloaded"),
    ):
        # ValueModel.save's layout: the same files, keys, dtype and config fields
        written = dirs[name][1]
        assert sorted(p.name for p in saved.iterdir()) == sorted(p.name for p in written.iterdir())
        with (
            safe_open(saved / "model.safetensors", "pt") as f,
            safe_open(written / "model.safetensors", "pt") as g,
        ):
            assert sorted(f.keys()) == sorted(g.keys()) and f.metadata() == g.metadata() == {
                "format": "pt"
            }
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
        config, ref_config = (json.loads((d / "config.json").read_text()) for d in (saved, written))
        # dtype float32, architectures Qwen2Model, every other field as saved
        assert config == ref_config
        loaded = ValueModel.load(saved)
        assert_same_params(whole(loaded), out[f"{name}/{key}"]["params"])
    # load -> save -> load: the value model it started from, and loaded sharded again, the same
    ref = ValueModel.load(dirs[name][1])
    assert_same_params(whole(ValueModel.load(root / f"{name}-resaved")), whole(ref))
    check_sharded(out[f"{name}/reloaded"], ref, compute="torch.bfloat16")
    check_read(out[f"{name}/reloaded"], ref)
    # the bf16 policy is live: the pass ran in bf16 (8 mantissa bits), so it rounds the float32
    # values
    with torch.no_grad():
        fp32 = ref.eval()(IDS, MASK)
    assert all(not torch.equal(v, fp32) for v in out[f"{name}/reloaded"]["values"])


@pytest.mark.parametrize("source", ["causal_lm", "value_model"])
def test_one_process_loads_whole_and_saves_with_value_model_save(tmp_path, source):
    lm = save_lm(tmp_path / "lm", tied=True, dtype=torch.bfloat16)
    path = save_vm(tmp_path / "vm", lm) if source == "value_model" else lm
    critic = load_sharded_value_model(
        path, single(), torch.device("cpu"), "bfloat16", source=source
    )
    assert not is_sharded(critic) and not critic.training
    assert fsdp_policy(critic).param_dtype == torch.bfloat16  # tagged: computes in bf16
    ref = from_lm(lm) if source == "causal_lm" else ValueModel.load(path)
    assert {p.dtype for p in critic.parameters()} == {torch.float32}
    assert_same_params(whole(critic), whole(ref))
    save_sharded_value_model(critic, tmp_path / "saved", single())
    assert_same_params(whole(ValueModel.load(tmp_path / "saved")), whole(ref))


def test_an_unknown_source_is_one_line(tmp_path):
    lm = save_lm(tmp_path / "lm", tied=True, dtype=torch.float32)
    with pytest.raises(
        ConfigError,
        match=r"source='policy' is not a value model source: use one of "
        r"value_model, causal_lm",
    ):
        load_sharded_value_model(lm, single(), torch.device("cpu"), source="policy")


def test_a_causal_lm_dir_read_as_a_value_model_says_which_source(tmp_path):
    lm = save_lm(tmp_path / "lm", tied=True, dtype=torch.float32)
    with pytest.raises(
        CheckpointError, match="has no value_head.pt or value_model.json.*source='causal_lm'"
    ):
        load_sharded_value_model(lm, single(), torch.device("cpu"), source="value_model")
