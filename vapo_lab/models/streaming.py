"""A safetensors file written one tensor at a time: the header first (every name, dtype and shape
is known before the data), then each tensor's bytes as it arrives, so the writer never holds more
than one tensor. Read back by ``safetensors.torch.load_file`` and ``from_pretrained`` alike."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from types import TracebackType

import torch
from torch import Tensor

# safetensors' dtype names (the format's specification)
DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class SafetensorsWriter:
    """Writes ``path`` from ``entries`` [(name, dtype, shape)], in their order, as ``write`` is
    called for each; ``close`` (or leaving the ``with``) checks that every one came."""

    def __init__(
        self,
        path: str | Path,
        entries: list[tuple[str, torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        self.expected: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        offset = 0
        for name, dtype, shape in entries:
            size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {
                "dtype": DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            self.expected.append((name, dtype, tuple(shape)))
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors pads it
        self.file = Path(path).open("wb")
        self.file.write(struct.pack("<Q", len(text)) + text)
        self.done = 0

    def write(self, name: str, tensor: Tensor) -> None:
        """Appends ``tensor``'s bytes: it must be the next entry, with its dtype and shape."""
        want = self.expected[self.done] if self.done < len(self.expected) else None
        got = (name, tensor.dtype, tuple(tensor.shape))
        if got != want:
            raise ValueError(f"wrote {got}, the header's next entry is {want}")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        self.file.write(flat.view(torch.uint8).numpy().tobytes())
        self.done += 1

    def close(self) -> None:
        """Closes the file, raising ValueError when an entry of the header was never written."""
        self.file.close()
        if self.done != len(self.expected):
            missing = [name for name, _, _ in self.expected[self.done :]]
            raise ValueError(f"{len(missing)} tensor(s) never written, e.g. {missing[:3]}")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.file.close()
