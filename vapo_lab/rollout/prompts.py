"""Problems to prompt token ids: the one encoding the trainer, the critic's pretraining and
evaluation share."""

from __future__ import annotations

from typing import Any


def encode_prompts(tokenizer: Any, problems: list[Any], chat_template: str) -> list[list[int]]:
    """Returns the prompt token ids (chat template applied when asked and available)."""
    out = []
    for p in problems:
        if chat_template == "auto" and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": p.prompt}], add_generation_prompt=True, tokenize=True
            )
        else:
            ids = tokenizer(p.prompt, add_special_tokens=True)["input_ids"]
        out.append(list(ids))
    return out
