"""Building a causal LM or a value model already sharded, so that no rank ever holds it whole.

As torchtitan does: the model is built from its ``config.json`` on the meta device, sharded with
FSDP2, allocated with ``to_empty``, its non-persistent buffers computed by its own
``initialize_weights``, then each rank's slices of the safetensors are read into its float32
shards (``torch.distributed.checkpoint`` with ``HuggingFaceStorageReader``). Tied weights are read
once; a missing, misshapen or duplicated key is refused in one line. ``save_sharded_value_model``
writes ``ValueModel.save``'s layout a parameter at a time. Memory measured: docs/distributed.md,
Sharded construction from a checkpoint.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationConfig

from vapo_lab.distributed.fsdp import full_parameters, is_sharded, shard
from vapo_lab.distributed.world import World
from vapo_lab.errors import CheckpointError, ConfigError
from vapo_lab.models.dtypes import DTYPES
from vapo_lab.models.load import load_causal_lm
from vapo_lab.models.precision import MASTER, fsdp_policy, set_compute
from vapo_lab.models.streaming import SafetensorsWriter
from vapo_lab.models.value import HEAD_FILE, ValueModel

INDEX = "model.safetensors.index.json"
VALUE_JSON = "value_model.json"  # as ValueModel.save names it
SOURCES = ("value_model", "causal_lm")  # where load_sharded_value_model starts a critic from


def load_sharded_causal_lm(
    path: str | Path,
    world: World,
    device: torch.device,
    compute_dtype_name: str = "float32",
    trust_remote_code: bool = False,
) -> nn.Module:
    """Returns the causal LM saved in directory ``path`` (config.json and safetensors, one file or
    several, bf16, fp16 or fp32), sharded over ``world`` with FSDP2, in eval mode.

    Each rank holds float32 shards on ``device``, computing in ``compute_dtype_name``
    (``model.dtype``). With one process and no process group the model is loaded whole with
    ``from_pretrained`` and moved to ``device``, not sharded.

    Raises:
        ConfigError: ``path`` has no config.json or no .safetensors file, or the dtype is unknown.
        CheckpointError: the checkpoint lacks some of the model's weights, has them in another
            shape, holds one key in two files, or its index names a missing file.
    """
    path = Path(path)
    files = _check(path, compute_dtype_name)
    if not world.initialized:
        return (
            set_compute(load_causal_lm(path, "float32", trust_remote_code), compute_dtype_name)
            .to(device)
            .eval()
        )
    config = AutoConfig.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=MASTER, trust_remote_code=trust_remote_code
        )
    set_compute(model, compute_dtype_name)  # a dtype change on meta: nothing allocated
    if (path / "generation_config.json").is_file():  # from_pretrained reads it too (eos, pad ids)
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    arch = type(model).__name__  # before FSDP2 renames the class (FSDPQwen2ForCausalLM)
    shard(model, world, device, fsdp_policy(model))
    model.to_empty(device=device)
    _init_buffers(model, arch)
    _fill(model, path, files, arch)
    return model.eval()


def load_sharded_value_model(
    path: str | Path,
    world: World,
    device: torch.device,
    compute_dtype_name: str = "float32",
    source: str = "value_model",
    trust_remote_code: bool = False,
) -> ValueModel:
    """Returns the value model (critic) saved in, or started from, directory ``path``, sharded over
    ``world`` with FSDP2 as ``load_sharded_causal_lm`` shards a causal LM, in eval mode.

    ``source="value_model"``: a directory ``ValueModel.save`` wrote. ``source="causal_lm"``: a
    causal LM's directory (the policy's), whose transformer (``model.*`` keys) becomes the backbone
    under a zero head, as ``ValueModel.from_causal_lm`` makes it. ``trust_remote_code`` applies to
    ``causal_lm`` only. Without a process group it loads whole, not sharded.

    Raises:
        ConfigError: ``source`` is unknown, or as ``load_sharded_causal_lm``.
        CheckpointError: a value model's head files are missing or misshapen, or as
            ``load_sharded_causal_lm`` (missing or misshapen backbone weights).
    """
    path = Path(path)
    files = _check(path, compute_dtype_name)
    head = _head_state(path, source)
    if not world.initialized:
        whole = (
            ValueModel.load(path)
            if source == "value_model"
            else ValueModel.from_causal_lm(load_causal_lm(path, "float32", trust_remote_code))
        )
        return set_compute(whole, compute_dtype_name).to(device).eval()
    critic, prefix = _meta_value_model(path, source, trust_remote_code)
    set_compute(critic, compute_dtype_name)  # a dtype change on meta: nothing allocated
    arch = f"{type(critic.backbone).__name__} (value model)"  # before FSDP2 renames the class
    shard(critic, world, device, fsdp_policy(critic))
    critic.to_empty(device=device)
    _init_buffers(critic.backbone, arch)
    _fill(critic, path, files, arch, lambda name: _backbone_key(name, prefix))
    _set_head(critic, head)
    return critic.eval()


def _head_state(path: Path, source: str) -> dict[str, Tensor] | None:
    """Returns the head's state dict a value model directory holds (None for ``causal_lm``: a zero
    head); raises ConfigError for an unknown ``source``, CheckpointError for a missing head file."""
    if source not in SOURCES:
        raise ConfigError(
            f"source={source!r} is not a value model source: use one of {', '.join(SOURCES)}"
        )
    if source == "causal_lm":
        return None
    missing = [f for f in (HEAD_FILE, VALUE_JSON) if not (path / f).is_file()]
    if missing:
        raise CheckpointError(
            f"{path} has no {' or '.join(missing)}, so it is not a value model directory "
            "(ValueModel.save writes them): give a directory ValueModel.save wrote, or load "
            "a causal LM's directory with source='causal_lm'"
        )
    return torch.load(path / HEAD_FILE, weights_only=True)  # tensors only: runs no code


def _meta_value_model(
    path: Path, source: str, trust_remote_code: bool
) -> tuple[ValueModel, str | None]:
    """Returns (the value model built on the meta device, the prefix of the backbone's keys in the
    files: the causal LM's name for its transformer, ``model``; None for a value model's files)."""
    config = AutoConfig.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.device("meta"):
        if source == "value_model":  # as ValueModel.load: AutoModel, the json's hidden size
            hidden = json.loads((path / VALUE_JSON).read_text())["hidden_size"]
            return ValueModel(AutoModel.from_config(config, dtype=MASTER), hidden), None
        lm = AutoModelForCausalLM.from_config(
            config, dtype=MASTER, trust_remote_code=trust_remote_code
        )
        critic = ValueModel.from_causal_lm(lm)  # its very code: a deep copy on meta copies no data
    decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
    return critic, next(n for n, m in lm.named_modules() if m is decoder)


def _backbone_key(name: str, prefix: str | None) -> str | None:
    """Returns the files' key of the value model's state dict ``name``: the backbone's own name
    under ``prefix`` (``backbone.norm.weight`` -> ``model.norm.weight``), None for the head's."""
    if not name.startswith("backbone."):
        return None
    own = name.removeprefix("backbone.")
    return f"{prefix}.{own}" if prefix else own


@torch.no_grad()
def _set_head(critic: ValueModel, head: dict[str, Tensor] | None) -> None:
    """Sets the sharded head from its whole state dict ``head`` (None: zeros, as
    ``ValueModel.__init__``); each rank keeps its slice, with no collective."""
    from torch.distributed.tensor import distribute_tensor

    problems = []
    for name, p in critic.head.named_parameters():
        whole = torch.zeros(p.shape) if head is None else head.get(name)
        if whole is None or whole.shape != p.shape:
            problems.append(
                f"{name} is {'missing' if whole is None else tuple(whole.shape)}, "
                f"the head's is {tuple(p.shape)}"
            )
            continue
        p.copy_(
            distribute_tensor(
                whole.to(p.device, p.dtype), p.device_mesh, p.placements, src_data_rank=None
            )
        )
    if problems:
        raise CheckpointError(
            f"{HEAD_FILE} does not fit the value model: {'; '.join(problems)}. Re-save it "
            "with ValueModel.save"
        )


def save_sharded_value_model(critic: ValueModel, path: str | Path, world: World) -> None:
    """Writes ``critic`` to directory ``path`` in ``ValueModel.save``'s layout; every rank calls
    this (a barrier ends it). A sharded critic is gathered parameter by parameter and rank 0
    streams each to disk as it comes (``models.streaming``), never holding the whole model: the
    backbone to one float32 ``model.safetensors`` with its config.json, as ``save_pretrained``
    writes them for a transformer without key conversions or tied weights (Qwen2, Llama); the head
    to ``value_head.pt``. A critic not sharded is saved with ``ValueModel.save`` on rank 0."""
    path = Path(path)
    if not is_sharded(critic):
        if world.main:
            critic.save(path)
        world.barrier()
        return
    _stream(critic, path, world.main)
    world.barrier()


def _stream(critic: ValueModel, path: Path, main: bool) -> None:
    """Gathers ``critic``'s parameters one at a time (a collective each, on every rank) and, on
    rank 0 (``main``), writes each as it comes, then the persistent buffers, the config and the
    head, replacing a sharded save's files left at ``path``."""
    from torch.distributed.fsdp import FSDPModule

    for m in critic.modules():
        # a pass leaves the root gathered (FSDP2's default), its parameters then the compute-dtype
        # copies: back to the float32 shards (local, no collective), which are the weights
        if isinstance(m, FSDPModule):
            m.reshard()
    persistent = critic.state_dict(keep_vars=True).keys()  # names only: no gather
    buffers = [(n, b) for n, b in critic.named_buffers() if n in persistent]
    entries = [
        (n.removeprefix("backbone."), t.dtype, tuple(t.shape))
        for n, t in [*critic.named_parameters(), *buffers]
        if n.startswith("backbone.")
    ]
    writer = None
    if main:
        path.mkdir(parents=True, exist_ok=True)
        # an index would win over our file
        for stale in [path / INDEX, *path.glob("model-*-of-*.safetensors")]:
            stale.unlink(missing_ok=True)
        # as save_pretrained marks it
        writer = SafetensorsWriter(path / "model.safetensors", entries, {"format": "pt"})
    head: dict[str, Tensor] = {}
    for name, t in [*full_parameters(critic), *((n, b.detach()) for n, b in buffers)]:
        if writer is not None:
            if name.startswith("backbone."):
                writer.write(name.removeprefix("backbone."), t)
            elif name.startswith("head."):
                head[name.removeprefix("head.")] = t.to("cpu", copy=True)
        del t  # only one whole parameter at a time
    if writer is None:
        return
    writer.close()
    # save_pretrained's two changes, not on the live model
    config = copy.deepcopy(critic.backbone.config)
    config.dtype = str(entries[0][1]).removeprefix("torch.")
    config.architectures = [type(critic.backbone).__name__.removeprefix("FSDP")]
    config.save_pretrained(path)
    torch.save(head, path / HEAD_FILE)
    (path / VALUE_JSON).write_text(json.dumps({"hidden_size": critic.head.in_features}))


def _check(path: Path, compute_dtype_name: str) -> list[Path]:
    """Returns the safetensors files of ``path`` (raising ConfigError / CheckpointError as
    ``load_sharded_causal_lm`` documents)."""
    if compute_dtype_name not in DTYPES:
        raise ConfigError(
            f"model.dtype={compute_dtype_name!r} is not supported. Set model.dtype to one of "
            f"{', '.join(DTYPES)}."
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.path={str(path)!r} is not a model directory (no config.json there). "
            "Set model.path to a local checkpoint directory saved with save_pretrained."
        )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        others = sorted(
            p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")
        )
        raise ConfigError(
            f"model.path={str(path)!r} has no .safetensors weights"
            + (f" (only {', '.join(others)})" if others else "")
            + ": the sharded load reads safetensors only. Re-save the model there with "
            "save_pretrained (transformers writes safetensors), or set model.path to one that "
            "has them."
        )
    if (path / INDEX).is_file():
        named = set(json.loads((path / INDEX).read_text())["weight_map"].values())
        missing = sorted(n for n in named if not (path / n).is_file())
        if missing:
            raise CheckpointError(
                f"{path / INDEX} names {', '.join(missing)}, missing from {path}: "
                "copy the whole checkpoint directory"
            )
    return files


@torch.no_grad()
def _init_buffers(model: nn.Module, arch: str) -> None:
    """Computes ``model``'s non-persistent buffers (no checkpoint holds them; ``to_empty`` left
    garbage) as ``from_pretrained`` does: ``initialize_weights``, with every parameter and
    persistent buffer marked as loaded (transformers' flag), so that only the rest is set.

    Raises:
        CheckpointError: a buffer left unset (a model whose ``_init_weights`` misses it).
    """
    non_persistent = {}
    for owner_name, owner in model.named_modules():
        for name in owner._non_persistent_buffers_set:
            buf = owner._buffers.get(name)
            if buf is not None:
                non_persistent[f"{owner_name}.{name}".lstrip(".")] = buf
                # a module marked initialised is skipped whole: unmark the owners of such buffers
                owner.__dict__.pop("_is_hf_initialized", None)
    unset = {id(b) for b in non_persistent.values()}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in unset:
            t._is_hf_initialized = True
    # a sentinel no initialisation writes, to tell a buffer left unset from one set
    for buf in non_persistent.values():
        buf.fill_(_sentinel(buf.dtype))
    model.initialize_weights()
    left = [n for n, b in non_persistent.items() if _still_sentinel(b)]
    if left:
        raise CheckpointError(
            f"{arch}'s initialize_weights left the non-persistent buffers "
            f"{', '.join(left)} unset, so the sharded load cannot compute them: "
            "load this model on one process (trainer.strategy=single)"
        )


def _sentinel(dtype: torch.dtype) -> float | int | bool:
    """NaN for floating point, the smallest integer for integers (booleans: False, not checked)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return False if dtype == torch.bool else torch.iinfo(dtype).min


def _still_sentinel(buf: torch.Tensor) -> bool:
    if buf.dtype.is_floating_point or buf.dtype.is_complex:
        return bool(buf.isnan().any())
    return buf.dtype != torch.bool and bool((buf == _sentinel(buf.dtype)).any())


@torch.no_grad()
def _fill(
    model: nn.Module,
    path: Path,
    files: list[Path],
    arch: str,
    in_file: Callable[[str], str | None] = lambda name: name,
) -> None:
    """Reads the checkpoint's safetensors into ``model``'s sharded state dict, each rank its own
    slices (``torch.distributed.checkpoint.load``, ``HuggingFaceStorageReader``). ``in_file`` gives
    the file's key of a state dict name (None: the files do not hold it, and it is left as it is):
    DCP matches the state dict it is given to the files by key, so the dict passed to it is keyed
    with the file's names, its values the model's own shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    reader = dcp.HuggingFaceStorageReader(str(path))
    # the files' JSON headers: names, shapes, dtypes
    saved = reader.read_metadata().state_dict_metadata
    state = get_model_state_dict(model)  # DTensors: each rank's shards, aliasing the parameters
    wanted, problems = {}, []
    for names in _aliases(model, state):
        # the file's key: the model's name
        keys = {k: n for n in names if (k := in_file(n)) is not None}
        if not keys:
            continue
        found = [k for k in keys if k in saved]
        if not found:
            problems.append(f"{' = '.join(keys)} is missing")
            continue
        key = found[0]  # tied weights: one parameter, read once
        shard_of = state[keys[key]]
        if tuple(saved[key].size) != tuple(shard_of.shape):
            problems.append(
                f"{key} is {tuple(saved[key].size)}, the model's is {tuple(shard_of.shape)}"
            )
        elif len({tuple(c.offsets) for c in saved[key].chunks}) < len(saved[key].chunks):
            # one key twice at one place (a stale file beside the checkpoint's), not DCP's slices
            problems.append(f"{key} is in more than one of {', '.join(f.name for f in files)}")
        wanted[key] = shard_of
    if problems:
        listed = "; ".join(problems[:5]) + (
            f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        )
        raise CheckpointError(
            f"{path} does not fit {arch} built from its config.json: {listed}. "
            "The sharded load reads checkpoints whose keys are the model's own names (as "
            "save_pretrained writes them): load this one on one process (trainer.strategy=single)"
        )
    # in place into the shards; each file's slice is converted to float32 as it is copied
    dcp.load(wanted, storage_reader=reader)
    # the documented way back into the module (a copy onto itself where the state dict aliases it)
    set_model_state_dict(model, state)


def _aliases(model: nn.Module, state: dict) -> list[list[str]]:
    """Returns the state dict's names grouped by the tensor they name: tied weights are one group
    (``[model.embed_tokens.weight, lm_head.weight]``, in module order), every other name its own."""
    by_tensor: dict[int, list[str]] = {}
    for name, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        if name in state:
            by_tensor.setdefault(id(t), []).append(name)
    grouped = {n for names in by_tensor.values() for n in names}
    return list(by_tensor.values()) + [[n] for n in state if n not in grouped]
