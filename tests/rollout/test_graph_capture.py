"""The decode step's CUDA graph capture on CPU (issue 61): which device and stream it captures on,
what it does when the graph records nothing, and what a recapture costs. ``FakeCuda`` stands in
for torch.cuda's devices, streams and graphs; the replays on a GPU are
tests/rollout/test_cuda_graphs_gpu.py's."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from tests.rollout.test_sampler import VOCAB, _qwen
from vapo_lab.rollout.decoder import FastDecoder

MODEL_GPU = 1  # the model's device: not the current one, 0 (trainer.device=cuda:1)


class FakeStream:
    def __init__(self, device: int, default: bool = False) -> None:
        self.device, self.default = device, default

    def wait_stream(self, other: FakeStream) -> None:
        pass


class FakeCuda:
    """torch.cuda's current device and each device's current stream, kept as CUDA keeps them; a
    graph records the decoder's step only when, at ``capture_begin``, the current stream of the
    decoder's device (where its kernels go) is a side stream, the one capturing. Otherwise the step
    runs eagerly in the capture and the graph's replays do nothing, as on a GPU."""

    def __init__(self, decoder: FastDecoder, record: bool = True) -> None:
        self.decoder, self.record = decoder, record
        self.current = 0
        self.streams: dict[int, FakeStream] = {}
        self.calls: list[tuple] = []
        self.pools = itertools.count(1)
        self.default_capture_stream: FakeStream | None = None

    def install(self, monkeypatch) -> FakeCuda:
        for name in ("device", "stream", "current_stream", "synchronize", "empty_cache", "graph"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "Stream", self.new_stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda *a, **kw: FakeGraph(self))
        return self

    def _index(self, device) -> int:
        index = device.index if isinstance(device, torch.device) else device
        return self.current if index is None else int(index)

    @contextlib.contextmanager
    def device(self, device):
        before, self.current = self.current, self._index(device)
        try:
            yield
        finally:
            self.current = before

    def new_stream(self, device=None, priority: int = 0) -> FakeStream:
        return FakeStream(self._index(device))

    def current_stream(self, device=None) -> FakeStream:
        index = self._index(device)
        return self.streams.setdefault(index, FakeStream(index, default=True))

    @contextlib.contextmanager
    def stream(self, s: FakeStream):
        """torch.cuda.stream: the stream becomes its device's current one, and its device the
        current device."""
        before, previous = self.current, self.current_stream(s.device)
        self.current, self.streams[s.device] = s.device, s
        try:
            yield
        finally:
            self.current, self.streams[s.device] = before, previous

    def synchronize(self, device=None) -> None:
        self.calls.append(("synchronize",))

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache",))

    @contextlib.contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        """torch.cuda.graph: the device synchronised and the cache emptied, then the capture on
        ``stream`` or a capture stream made once on the current device."""
        self.synchronize()
        self.empty_cache()
        if stream is None:
            self.default_capture_stream = self.default_capture_stream or self.new_stream()
        with self.stream(stream or self.default_capture_stream):
            cuda_graph.capture_begin(pool=pool)
            try:
                yield
            finally:
                cuda_graph.capture_end()


class FakeGraph:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.recording, self.id = cuda, False, None

    def capture_begin(self, pool=None, capture_error_mode="global") -> None:
        cuda, d = self.cuda, self.cuda.decoder
        stream = cuda.current_stream()
        self.id = pool or next(cuda.pools)
        cuda.calls.append(("capture", cuda.current, stream.device, stream.default, pool))
        queued_on = cuda.current_stream(d.device.index)
        self.recording = cuda.record and queued_on is stream and not stream.default
        # a capture that records runs nothing: the step's effects on the state are undone at end
        self.state = [x.clone() for x in (d._t, d._next_pos, d.key_ok)]

    def capture_end(self) -> None:
        d = self.cuda.decoder
        if self.recording:
            for now, before in zip((d._t, d._next_pos, d.key_ok), self.state, strict=True):
                now.copy_(before)

    def replay(self) -> None:
        d = self.cuda.decoder
        self.cuda.calls.append(("replay", self.cuda.current))
        if self.recording:  # the recorded kernels write the static output in place
            d._logits.copy_(d._static_step(d._tokens))

    def pool(self):
        return self.id


def _decoders(model):
    """(eager static step, graph step on cuda:1): the second built on CPU, then moved in name."""
    eager = FastDecoder(model, 3, 32, static=True)
    graph = FastDecoder(model, 3, 32, static=True)
    graph.device, graph.graphs = torch.device("cuda", MODEL_GPU), True
    return eager, graph


@torch.no_grad()
def _run(eager: FastDecoder, graph: FastDecoder) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Prefill, repeat, 12 steps with two compactions: each step's (eager, graph) logits."""
    torch.manual_seed(4)
    ids = torch.randint(3, VOCAB, (3, 5))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False
    ids[~mask] = 0
    new = torch.randint(3, VOCAB, (6, 12))
    eager.prefill(ids, mask), graph.prefill(ids, mask)
    eager.repeat(2), graph.repeat(2)
    out = []
    for j in range(12):
        tokens = new[: eager.k.shape[1], j]
        out.append((eager.step(tokens), graph.step(tokens).clone()))
        if j in (3, 7):  # compaction: a smaller batch, captured anew
            keep = torch.arange(0, eager.k.shape[1], 2)
            eager.select(keep), graph.select(keep)
    return out


def test_the_graph_is_captured_and_replayed_on_the_model_s_device(monkeypatch):
    """With the model on cuda:1 and cuda:0 current, every capture runs on a side stream of cuda:1,
    so it records, and every step's logits are the eager step's (on cuda:0's stream, the graph
    would be empty and each step would return the first step's logits)."""
    eager, graph = _decoders(_qwen())
    cuda = FakeCuda(graph).install(monkeypatch)
    for a, b in _run(eager, graph):
        torch.testing.assert_close(b, a, atol=0, rtol=0)
    assert graph.graph_error is None and graph.graphs
    assert int(graph._t) == int(eager._t) == graph.length == 17  # 5 prompt tokens + 12 steps
    captures = [c for c in cuda.calls if c[0] == "capture"]
    assert len(captures) == 3  # after prefill, after each compaction
    # (current device, the capturing stream's device, a default stream?) at each capture
    assert {c[1:4] for c in captures} == {(MODEL_GPU, MODEL_GPU, False)}
    assert {c[1] for c in cuda.calls if c[0] == "replay"} == {MODEL_GPU}


def test_a_capture_that_records_nothing_is_refused_and_the_steps_run_eagerly(monkeypatch):
    """A graph whose first replay leaves its output unwritten is a failed capture: said once, the
    step and the rest run eagerly from the state before it (not the first step's logits again)."""
    eager, graph = _decoders(_qwen())
    FakeCuda(graph, record=False).install(monkeypatch)
    with pytest.warns(UserWarning, match="recorded nothing") as warned:
        steps = _run(eager, graph)
    assert len(warned) == 1
    for a, b in steps:
        torch.testing.assert_close(b, a, atol=0, rtol=0)
    assert not graph.graphs and "recorded nothing" in graph.graph_error
    assert int(graph._t) == int(eager._t) == graph.length == 17


def test_a_recapture_neither_synchronises_nor_empties_the_cache_and_reuses_the_pool(monkeypatch):
    """torch.cuda.graph synchronises the device and empties the allocator's cache on entry: every
    compaction's recapture would pay both. The captures take over the memory pool of the graph
    they replace instead."""
    eager, graph = _decoders(_qwen())
    cuda = FakeCuda(graph).install(monkeypatch)
    _run(eager, graph)
    assert not [c for c in cuda.calls if c[0] in ("synchronize", "empty_cache")]
    pools = [c[4] for c in cuda.calls if c[0] == "capture"]
    assert pools[0] is None and pools[1:] == [1, 1]  # the first graph's pool, shared
