"""The value model (critic) and the outcome reward model: a causal-LM backbone with a scalar head.

The reward model predicts the verifier's outcome at the last response token, the critic V(s_t) at
every token; a critic started from the reward model (the paper's choice) is right only at the end
of a response, the value bias that value pretraining removes (VAPO §3.1, §4.1).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

HEAD_FILE = "value_head.pt"


def wide(x: Tensor) -> Tensor:
    """Returns ``x`` in float32 when it is a narrower float (bf16, fp16), else as it is: log-probs
    and values are at least float32, and float64 stays (the rank-equality tests run in it)."""
    return x.float() if x.element_size() < 4 else x


class ValueModel(nn.Module):
    """Backbone (an HF base model, e.g. Qwen2Model) + a linear head: hidden state -> scalar."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_causal_lm(cls, lm: nn.Module) -> ValueModel:
        """Returns a value model on a deep copy of ``lm``'s transformer, with a zero head."""
        import copy

        backbone = copy.deepcopy(lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model)
        return cls(backbone, lm.config.hidden_size)._head_like_backbone()

    @classmethod
    def random_like(cls, lm: nn.Module, seed: int = 0) -> ValueModel:
        """Returns a value model with ``lm``'s architecture and freshly initialised weights."""
        from transformers import AutoModel

        with torch.random.fork_rng():
            torch.manual_seed(seed)
            backbone = AutoModel.from_config(lm.config)
        first = next(lm.parameters())
        return cls(
            backbone.to(first.device, first.dtype), lm.config.hidden_size
        )._head_like_backbone()

    def _head_like_backbone(self) -> ValueModel:
        """Returns the model with its head moved to the backbone's device and dtype (a new head is
        float32 on the CPU, which would fail beside a bf16 or CUDA backbone)."""
        first = next(self.backbone.parameters())
        self.head.to(first.device, first.dtype)
        return self

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Returns one scalar per position, (B, L), for the padded batch ``input_ids`` (B, L)."""
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions
        ).last_hidden_state
        # a new tensor, not a view of the head's output: FSDP2 hooks its backward on the output
        return wide(self.head(hidden).squeeze(-1)).clone()

    def save(self, path: str | Path) -> None:
        """Writes the backbone (save_pretrained) and the head to ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        torch.save(self.head.state_dict(), path / HEAD_FILE)
        (path / "value_model.json").write_text(json.dumps({"hidden_size": self.head.in_features}))

    @classmethod
    def load(cls, path: str | Path) -> ValueModel:
        """Returns the value model saved at ``path``."""
        from transformers import AutoModel

        path = Path(path)
        backbone = AutoModel.from_pretrained(path, use_safetensors=True)
        hidden = json.loads((path / "value_model.json").read_text())["hidden_size"]
        model = cls(backbone, hidden)
        model.head.load_state_dict(torch.load(path / HEAD_FILE, weights_only=True))
        return model._head_like_backbone()
