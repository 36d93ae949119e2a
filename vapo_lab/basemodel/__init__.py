"""The embedded default's base model: the tiny model pre-trained on noisy traces, built once and
cached."""

from vapo_lab.basemodel.build import BaseModel, build_base, build_base_for

__all__ = ["BaseModel", "build_base", "build_base_for"]
