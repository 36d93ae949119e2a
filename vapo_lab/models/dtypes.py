"""The parameter dtypes a model may load in (``model.dtype``), by name."""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
