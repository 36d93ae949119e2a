"""The streaming safetensors writer: what it writes reads back, tensor for tensor, with safetensors'
own reader; a tensor out of turn or left out is refused."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vapo_lab.models.streaming import SafetensorsWriter


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(7, 3, generator=g),
        "model.norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(5, 3, generator=g).half(),
        "step": torch.tensor(12, dtype=torch.int64),  # 0-d
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def test_what_it_writes_reads_back_exactly(tmp_path):
    tensors = _tensors()
    entries = [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    with SafetensorsWriter(tmp_path / "m.safetensors", entries, {"format": "pt"}) as w:
        for name, t in tensors.items():
            w.write(name, t)
    back = load_file(tmp_path / "m.safetensors")
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    with safe_open(tmp_path / "m.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_a_tensor_out_of_turn_or_left_out_is_refused(tmp_path):
    tensors = _tensors()
    entries = [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    w = SafetensorsWriter(tmp_path / "a.safetensors", entries)
    with pytest.raises(ValueError, match="the header's next entry is \\('model.embed_tokens"):
        w.write("model.norm.weight", tensors["model.norm.weight"])
    w = SafetensorsWriter(tmp_path / "b.safetensors", entries)
    with pytest.raises(ValueError, match="float32.*header's next entry.*bfloat16"):
        w.write("model.embed_tokens.weight", tensors["model.embed_tokens.weight"])
        w.write("model.norm.weight", tensors["model.norm.weight"].float())
    w = SafetensorsWriter(tmp_path / "c.safetensors", entries)
    w.write("model.embed_tokens.weight", tensors["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="5 tensor\\(s\\) never written"):
        w.close()
