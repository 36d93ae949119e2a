"""The fast decoder's step replayed as a CUDA graph (``rollout.cuda_graphs``, issue 48): the same
kernels as the eager static step, so the same logits (within bfloat16's rounding, should a library
pick another kernel under capture), tokens and log-probs, through compaction's recaptures. NOT run
here: no GPU; `scripts/gpu-acceptance.sh` step a runs them (`pytest -m gpu`). The eager static
step itself is tested on CPU (tests/rollout/test_sampler_loop.py)."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.test_sampler import VOCAB, _qwen
from vapo_lab.rollout import sampler as sampler_module
from vapo_lab.rollout.decoder import FastDecoder
from vapo_lab.rollout.sampler import sample

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]


@torch.no_grad()
def test_the_graph_replays_the_eager_static_step_through_recaptures():
    model = _qwen().cuda()
    torch.manual_seed(4)
    ids = torch.randint(3, VOCAB, (3, 5), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False
    ids[~mask] = 0
    new = torch.randint(3, VOCAB, (6, 12), device="cuda")
    eager = FastDecoder(model, 3, 32, dtype=torch.bfloat16, static=True)
    graph = FastDecoder(model, 3, 32, dtype=torch.bfloat16, graphs=True)
    assert graph.graphs and not eager.graphs
    torch.testing.assert_close(eager.prefill(ids, mask), graph.prefill(ids, mask), atol=0, rtol=0)
    eager.repeat(2), graph.repeat(2)
    for j in range(12):
        tokens = new[: eager.k.shape[1], j]
        a, b = eager.step(tokens), graph.step(tokens).clone()  # b: the graph's output, reused
        torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=0)
        if j in (3, 7):  # compaction: a smaller batch, captured anew
            keep = torch.arange(0, eager.k.shape[1], 2, device="cuda")
            eager.select(keep), graph.select(keep)
    assert graph.graph_error is None and graph.graphs
    assert int(graph._t) == int(eager._t) == graph.length == 17


def test_the_sampler_with_graphs_samples_what_the_eager_static_step_samples(monkeypatch):
    model = _qwen().cuda()

    def run(graphs):
        return sample(
            model, PROMPTS, n=4, max_new_tokens=40, temperature=0.9, top_p=0.95, eos_id=[1, 2],
            pad_id=0, generator=torch.Generator().manual_seed(5), graphs=graphs,
        )  # fmt: skip

    with_graphs = run(True)
    monkeypatch.setattr(
        sampler_module,
        "make_decoder",
        lambda *a, **kw: FastDecoder(a[0], a[1], a[2], dtype=kw.get("dtype"), static=True),
    )
    eager = run(False)
    assert with_graphs.finished.any()
    assert torch.equal(with_graphs.response_ids, eager.response_ids)
    torch.testing.assert_close(with_graphs.logprobs, eager.logprobs, atol=1e-3, rtol=0)
