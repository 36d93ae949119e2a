"""Loading a policy and its tokenizer from a local directory, for the trainer and evaluation.

The embedded base model is saved with ``save_pretrained``, so it loads as a real Hugging Face
checkpoint does. Nothing is ever downloaded (``local_files_only=True``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from vapo_lab.errors import ConfigError
from vapo_lab.models.dtypes import DTYPES


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
    """Returns (causal LM in eval mode, tokenizer) from the local directories ``path`` and
    ``tokenizer_path`` (default ``path``), the model in ``dtype`` (``model.dtype``).

    Raises:
        ConfigError: a directory or its config.json is missing, or the dtype is unknown.
    """
    if dtype not in DTYPES:
        raise ConfigError(
            f"model.dtype={dtype!r} is not supported. "
            f"Set model.dtype to one of {', '.join(DTYPES)}."
        )
    path = Path(path)
    tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else path
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.path={str(path)!r} is not a model directory (no config.json there). "
            "Set model.path to a local checkpoint directory saved with save_pretrained."
        )
    if not tokenizer_path.is_dir():
        raise ConfigError(
            f"model.tokenizer_path={str(tokenizer_path)!r} does not exist. "
            "Set it to a local directory."
        )
    tokenizer = load_tokenizer(tokenizer_path, trust_remote_code)
    return load_causal_lm(path, dtype, trust_remote_code), tokenizer


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Returns the tokenizer saved in directory ``path``, its eos token as pad when it has none
    (base checkpoints often lack one, and batching needs one); checks nothing first."""
    tokenizer = AutoTokenizer.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    path: str | Path, dtype: str = "float32", trust_remote_code: bool = False
) -> PreTrainedModel:
    """Returns the causal LM saved in directory ``path`` (``dtype`` a key of ``DTYPES``), in eval
    mode; checks nothing first."""
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], local_files_only=True, trust_remote_code=trust_remote_code
    )
    model.eval()
    return model
