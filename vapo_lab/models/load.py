"""Loading a policy and its tokenizer from a local directory: the embedded model or a real one.

The embedded base model is saved with ``save_pretrained`` (see :mod:`vapo_lab.basemodel`), so the one
function below loads it and a real Hugging Face checkpoint alike (``model.path=/models/Qwen2.5-0.5B``).
Nothing is ever downloaded: ``local_files_only=True``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from vapo_lab.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str, option: str = "trainer.device") -> torch.device:
    """Returns the torch device ``name`` names (auto: CUDA when a GPU is visible, else CPU).

    Raises:
        ConfigError: a CUDA device is asked for and none is visible; ``option`` is how the user
            set it (``trainer.device``, ``--device``), named in the message with the fix.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        sep = " " if option.startswith("--") else "="
        raise ConfigError(f"{option}{sep}{name} but no CUDA GPU is visible: use {option}{sep}cpu")
    return torch.device(name)


def load_model_and_tokenizer(
    path: str | Path,
    dtype: str = "float32",
    tokenizer_path: str | Path | None = None,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Returns (causal LM, tokenizer) loaded with ``from_pretrained`` from local directories.

    Args:
        path: a directory with ``config.json`` and weights (``model.path``).
        dtype: ``float32``, ``bfloat16`` or ``float16`` (``model.dtype``).
        tokenizer_path: the tokenizer's directory when it is not ``path`` (``model.tokenizer_path``).
        trust_remote_code: passed to ``from_pretrained`` (``model.trust_remote_code``).

    Returns:
        the model in eval mode and its tokenizer; a tokenizer without a pad token gets its eos
        token as pad (base checkpoints often have none, and batching needs one).

    Raises:
        ConfigError: a directory or its config.json is missing, or the dtype is unknown.
    """
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r} is not supported. Set model.dtype to one of {', '.join(DTYPES)}.")
    path = Path(path)
    tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else path
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.path={str(path)!r} is not a model directory (no config.json there). "
            "Set model.path to a local checkpoint directory saved with save_pretrained."
        )
    if not tokenizer_path.is_dir():
        raise ConfigError(f"model.tokenizer_path={str(tokenizer_path)!r} does not exist. Set it to a local directory.")
    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], local_files_only=True, trust_remote_code=trust_remote_code
    )
    model.eval()
    return model, tokenizer
