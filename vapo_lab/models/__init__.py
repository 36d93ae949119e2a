"""Policy models: the embedded tokenizer and tiny Qwen2 model, and loading any local checkpoint."""

from vapo_lab.models.load import load_model_and_tokenizer
from vapo_lab.models.tiny import build_tiny_model
from vapo_lab.models.tokenizer import build_tokenizer

__all__ = ["build_tiny_model", "build_tokenizer", "load_model_and_tokenizer"]
