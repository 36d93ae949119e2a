"""What vapo-lab runs inside vLLM's worker and around its platform: the worker extension the
weight push calls (``WeightLoader``, named to vLLM by ``worker_extension_cls``), and the repairs
of two faults of vLLM's CPU build (a tied lm_head left stale by a reload, a killed tensor-parallel
group's shared memory). Why each: docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn


class WeightLoader:
    """vLLM worker extension (``worker_extension_cls``): the methods ``push_weights`` calls by name.

    vLLM mixes this class into its worker, so ``self`` is the worker and ``get_model()`` its model.
    """

    def vapo_reload_weights(self, weights: Iterable[tuple[str, Tensor]]) -> list[str]:
        """Writes ``weights`` ((HF name, tensor) pairs, consumed as they come) through vLLM's
        in-place reload; returns the vLLM names of the model's parameters none of them wrote.

        The reload rebuilds each layer in checkpoint format once all its weights have arrived, runs
        the platform's post-processing (the CPU platform repacks linear weights for its kernels)
        and copies the result into the live storage (CUDA graphs keep their pointers). A layer that
        got nothing keeps its old weights: vLLM only warns, so the names are returned to check.
        """
        model = self.get_model()  # type: ignore[attr-defined]
        load, loaded = model.load_weights, set()

        def recorded(pairs: Iterable[tuple[str, Tensor]]) -> set[str]:
            names = load(pairs)
            loaded.update(names)
            return names

        model.load_weights = recorded  # the reload calls the model's own loader: see what it wrote
        try:
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        finally:
            del model.load_weights
        if getattr(getattr(self, "device", None), "type", None) == "cpu":
            _repack_tied(model)
        return sorted({name for name, _ in model.named_parameters()} - loaded)

    def vapo_seed(self, seed: int) -> None:
        """Seeds the generators an unseeded request draws from (the engine is in-process, so
        they are this process's torch generators)."""
        torch.manual_seed(seed)


def _repack_tied(model: nn.Module) -> None:
    """Re-packs the layers that share a weight with a layer before them (a tied lm_head).

    vLLM's CPU platform computes each linear layer from a copy of its weight packed for its GEMM
    kernels after loading (``dispatch_cpu_unquantized_gemm``, kept in the layer's ``cpu_linear``).
    The in-place reload re-packs every layer it writes, but a tied lm_head is written through the
    embeddings' weight and not re-packed: it would go on computing the logits from the weights of
    the engine's build (vLLM 0.32's CPU build; a GPU keeps no such copy). Seen as a mean |log-prob
    gap| of 0.95 against the policy's own after a push.
    """
    owners: dict[int, nn.Module] = {}
    for module in model.modules():
        weight, method = module._parameters.get("weight"), getattr(module, "quant_method", None)
        if weight is None or method is None:
            continue
        if id(weight) in owners:
            method.process_weights_after_loading(module)
        owners.setdefault(id(weight), module)


def clear_stale_shm(ranks: Iterable[int], shm: Path = Path("/dev/shm")) -> list[str]:
    """Removes the shared-memory segments of the tensor-parallel group of ``ranks`` that no live
    process maps; returns a line for each removed.

    vLLM's CPU build passes a group's tensors through /dev/shm segments named by the group alone
    (``-tp:0-[0-1]-cpushm_0``: under the external launcher its instance name is empty), created
    exclusively and removed at a clean exit. A rank killed (SIGKILL, the OOM killer, a node's
    time limit) leaves them, and every later engine of that group on the machine then fails to
    start ("create shm in SHMManager failed. errno: 17"), the resumed run among them.
    """
    group = f"-[{'-'.join(str(r) for r in ranks)}]-cpushm"
    found = sorted(p for p in shm.glob("*cpushm*") if group in p.name)
    if not found:
        return []
    mapped = _mapped_files()
    removed = []
    for path in found:
        if str(path) not in mapped:
            path.unlink(missing_ok=True)
            removed.append(
                f"removed {path}, left by an engine that did not exit (no process maps it)"
            )
    return removed


def _mapped_files() -> set[str]:
    """Returns the files that some process of this machine maps (from /proc/<pid>/maps)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # a process that ended, or another user's
            continue
        mapped.update(line.split(maxsplit=5)[-1] for line in text.splitlines() if "/" in line)
    return mapped
