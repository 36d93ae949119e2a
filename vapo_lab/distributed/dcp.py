"""Torch distributed checkpoints (DCP) that load without running code from the files.

Each rank writes its shards into one folder, and a load re-shards them for any world size. DCP's
own reader unpickles ``.metadata`` and ``torch.load``s non-tensor entries in full, so either could
run code from a file someone hands over: here the metadata unpickler admits only DCP's metadata
classes (and torch sizes, dtypes, layouts and paths), entries load with ``weights_only=True``,
and anything else is refused in one line (:class:`~vapo_lab.errors.CheckpointError`).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

from vapo_lab.errors import CheckpointError

# the modules whose classes a DCP .metadata file may name (and torch.Size, torch dtypes)
_SAFE_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint._extension",
)
_SAFE_BUILTINS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _SAFE_MODULES or (module, name) in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module.startswith("torch._utils") and name == "_rebuild_tensor_v2":
            raise pickle.UnpicklingError(f"a tensor in checkpoint metadata ({module}.{name})")
        raise pickle.UnpicklingError(f"{module}.{name} is not a checkpoint metadata class")


def _reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            file = Path(self.path) / ".metadata"
            try:
                metadata = _MetadataUnpickler(io.BytesIO(file.read_bytes())).load()
            except (pickle.UnpicklingError, AttributeError, EOFError, OSError) as e:
                self.refusal = (
                    f"refusing to load {file}: {e} (vapo-lab writes only DCP metadata there); "
                    "use a checkpoint written by vapo-lab"
                )
                raise CheckpointError(self.refusal) from e
            from torch.distributed.checkpoint.metadata import StorageMeta

            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    reader = SafeReader(str(path))
    reader.refusal = None
    return reader


def _planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as e:
                raise CheckpointError(
                    f"refusing a checkpoint entry {fqn}: it holds Python objects beyond "
                    "tensors and plain containers"
                ) from e
            # as DefaultLoadPlanner: into the nested dict the caller holds
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return SafePlanner()


def save_sharded(path: Path, state: dict[str, Any]) -> None:
    """Writes ``state`` (state dicts of sharded modules, tensors, numbers) to the folder ``path``,
    each rank its shards; a collective."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(path))


def load_sharded(path: Path, state: dict[str, Any]) -> None:
    """Loads the folder ``path`` into ``state``'s tensors in place, re-sharded as they are now; a
    collective."""
    import torch.distributed.checkpoint as dcp

    reader = _reader(path)
    try:
        dcp.load(state, storage_reader=reader, planner=_planner())
    # DCP wraps a rank's error in its CheckpointException (a BaseException)
    except BaseException as e:
        if reader.refusal:
            raise CheckpointError(reader.refusal) from e
        raise
