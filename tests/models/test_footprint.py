"""Tests for vapo_lab.models.counts, .footprint and .shapes: counts worked by hand and counted
on real HF modules, the published figures (ZeRO, Qwen2.5), and how a run's phases add up."""

import json
from dataclasses import replace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

from vapo_lab.errors import ConfigError
from vapo_lab.models.activations import (
    chunked_logprob_bytes,
    qwen2_forward_bytes,
    qwen2_layer_activation_bytes,
    qwen2_pass_activation_bytes,
)
from vapo_lab.models.counts import (
    actor_params,
    critic_params,
    embedding_params,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    layer_params,
    non_embedding_params,
    sharded,
    state_bytes_per_param,
)
from vapo_lab.models.footprint import (
    GB,
    Setup,
    estimate,
    nccl_groups,
    shard_ranks,
    smallest_world,
)
from vapo_lab.models.shapes import KNOWN_ARCHS, Shape, known_arch, read_shape
from vapo_lab.models.value import ValueModel

# h 8, L 2, 2 query heads and 1 kv head of d 4, SwiGLU width 16, 10 tokens
SMALL = Shape(
    hidden_size=8,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    vocab_size=10,
    tie_word_embeddings=True,
    max_position_embeddings=64,
)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # a tied weight counts once


# -- parameters ----------------------------------------------------------------------------------
def test_parameter_counts_of_a_small_shape_by_hand():
    # q 8x8 + 8 bias = 72; k = v = 8x4 + 4 = 36; o 8x8 = 64 (no bias); MLP 3 x 8x16 = 384;
    # norms 2x8 = 16
    assert layer_params(SMALL) == 72 + 36 + 36 + 64 + 384 + 16 == 608
    # embeddings 10x8 = 80, 2 layers, final norm 8; tied: no lm_head
    assert actor_params(SMALL) == 80 + 2 * 608 + 8 == 1304
    assert actor_params(replace(SMALL, tie_word_embeddings=False)) == 1304 + 80
    # the critic: the backbone + Linear(8, 1) = 9
    assert critic_params(SMALL) == 80 + 2 * 608 + 8 + 9 == 1313
    assert non_embedding_params(SMALL) == 2 * 608 + 8


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("head_dim", [None, 6])
def test_counts_equal_a_real_qwen2_built_from_its_config(tied, head_dim):
    extra = {"head_dim": head_dim} if head_dim else {}
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        **extra,
    )
    shape = Shape.from_hf_config(config.to_dict())
    assert shape.head_dim == (head_dim or 4) and shape.qkv_bias
    torch.manual_seed(0)
    assert _count(Qwen2ForCausalLM(config)) == actor_params(shape)
    # the critic vapo-lab trains: ValueModel over the decoder, a scalar head
    assert _count(ValueModel(Qwen2Model(config), config.hidden_size)) == critic_params(shape)


def test_the_embedded_model_has_the_count_the_plan_gives():
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.plan import model_shape
    from vapo_lab.models.tiny import build_tiny_model
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks.arith import ArithTask

    shape, _ = model_shape(compose_config().cfg)
    model = build_tiny_model(build_tokenizer(ArithTask(seed=0, n_train=4, n_eval=4).vocabulary()))
    # "1.10M in all" (vapo_lab/models/tiny.py)
    assert _count(model) == actor_params(shape) == 1_101_312
    assert shape.vocab_size == model.config.vocab_size == 2827


def test_qwen25_counts_match_the_published_figures():
    # model cards (huggingface.co/Qwen/Qwen2.5-*): total and non-embedding parameters, in billions,
    # to their last digit (the cards round some and cut others: 7B's 7.6156 is "7.61", 0.5B's
    # 0.3579 "0.36")
    cards = {"Qwen2.5-0.5B": (0.49, 0.36), "Qwen2.5-1.5B": (1.54, 1.31), "Qwen2.5-7B": (7.61, 6.53)}
    for name, (total, non_embedding) in cards.items():
        shape = KNOWN_ARCHS[name]
        assert abs(actor_params(shape) / 1e9 - total) < 0.01, name
        assert abs(non_embedding_params(shape) / 1e9 - non_embedding) < 0.01, name
    assert actor_params(KNOWN_ARCHS["Qwen2.5-7B"]) == 7_615_616_512
    q32 = known_arch("Qwen2.5-32B")
    # the bf16 checkpoint's model.safetensors.index.json: total_size 65,527,752,704 bytes
    # = 2 x parameters
    assert actor_params(q32) * 2 == 65_527_752_704
    assert actor_params(q32) == 32_763_876_352
    # its card says 32.5B total, 31.0B non-embedding: rounded down; ours are within 1% of both
    assert abs(actor_params(q32) / 32.5e9 - 1) < 0.01
    assert abs(non_embedding_params(q32) / 31.0e9 - 1) < 0.01


def test_read_shape_reads_a_local_config_json(tmp_path):
    config = {
        "model_type": "qwen2",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "intermediate_size": 27648,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert read_shape(tmp_path) == KNOWN_ARCHS["Qwen2.5-32B"]
    with pytest.raises(ConfigError, match="no config.json"):
        read_shape(tmp_path / "missing")
    with pytest.raises(ConfigError, match="did you mean Qwen2.5-32B"):
        known_arch("Qwen2.5-32b")


# -- training state: ZeRO ------------------------------------------------------------------------
def test_zero_paper_figures():
    # Rajbhandari et al. 2020, §3.1: mixed-precision Adam holds 2 + 2 + 12 = 16 bytes per parameter,
    # "a 1.5B model ... at least 24 GB"; Figure 1: Psi = 7.5B needs 120 GB, and fully sharded
    # (P_os+g+p) over N_d = 64 GPUs 1.9 GB each
    per_param = sum(state_bytes_per_param("fsdp", "bfloat16"))
    assert per_param == 16
    assert per_param * 1.5e9 / GB == 24
    assert per_param * 7.5e9 / GB == 120
    assert sharded(per_param * 7.5e9, 64) / GB == pytest.approx(1.875)
    assert round(sharded(per_param * 7.5e9, 64) / GB, 1) == 1.9


def test_master_weights_are_float32_on_every_strategy():
    # models.precision: float32 parameters, gradients and AdamW m, v whatever the compute dtype
    for strategy in ("single", "fsdp"):
        for dtype in ("float32", "bfloat16"):
            assert state_bytes_per_param(strategy, dtype) == (4, 4, 8)


def test_kv_cache_by_hand():
    q32 = KNOWN_ARCHS["Qwen2.5-32B"]
    # K and V, 64 layers, 8 kv heads of 128, bf16: 2 x 64 x 8 x 128 x 2 = 256 KiB a token
    assert kv_bytes_per_token(q32) == 262_144
    assert kv_bytes_per_sequence(q32, 20992) == 262_144 * 20992


# -- a run ---------------------------------------------------------------------------------------
PAPER = Setup(
    world=128,
    strategy="fsdp",
    dtype="bfloat16",
    micro_tokens=8 * 20992,
    responses_per_step=8192,
    prompt_tokens=512,
    max_new_tokens=20480,
    gradient_checkpointing=True,
    mini_batch_size=512,
    engine="vllm",
    tensor_parallel_size=1,
    engine_memory=0.5 * 80e9,
    logprob_chunk=441,
)


def test_paper_setup_adds_up():
    q32 = KNOWN_ARCHS["Qwen2.5-32B"]
    fp = estimate(q32, PAPER)
    trained = 32_763_876_352 + 31_985_313_793
    assert fp.critic_params == 31_985_313_793
    assert fp.sequence == 20992 and fp.responses_per_rank == 64
    # a mini-batch is a random draw of 512 of the 8192 responses: a rank's share averages 4 but can
    # reach all its 64, so a pass can fill its whole budget of 8 x 20,992 tokens
    assert fp.pass_tokens == 167_936 and fp.micro_batch == 8
    assert (fp.weights, fp.gradients, fp.optimizer) == (
        4 * trained / 128,
        4 * trained / 128,
        8 * trained / 128,
    )
    assert fp.state == 16 * trained / 128
    # the pass's response tokens 8 x 20,480 = 163,840 through the chunked LM head
    assert fp.logprob == chunked_logprob_bytes(163_840, 152064, 5120, 441, 2) == 6_754_110_464
    # a pass: 8 rows of 512 + 20,480 tokens, checkpointed, bf16 copies of the shards (FSDP2's
    # "cast"): the tensors autograd keeps (qwen2_pass_activation_bytes, by hand in
    # tests/bench/test_plan_check.py)
    assert fp.actor_activations == qwen2_pass_activation_bytes(
        q32, 8, 512, 20480, True, "lm", 2, False, "packed", 441, "cast"
    )
    assert fp.critic_activations == qwen2_pass_activation_bytes(
        q32, 8, 512, 20480, True, "value", 2, False, "packed", 441, "cast"
    )
    assert fp.actor_activations > fp.logprob
    layer = layer_params(q32)
    assert fp.gathered == (32_763_876_352 - 64 * layer + 2 * layer) * 2
    assert fp.train_peak == fp.state + fp.gathered + fp.actor_activations
    # vLLM: its weights (bf16) and one sequence must fit its share of 40 GB: they do not
    assert fp.engine_weights == 2 * 32_763_876_352 and fp.sequences_at_once == 0
    assert fp.rollout_peak == fp.state + 40e9
    assert not fp.fits(80e9)
    assert tokens_per_step(fp) == (8192 * 20480, 8192 * 20992)


def tokens_per_step(fp):
    return fp.generated_tokens, fp.step_tokens


def test_smallest_world_is_the_first_divisor_that_fits():
    q32 = KNOWN_ARCHS["Qwen2.5-32B"]
    one = replace(PAPER, micro_tokens=20992, engine_memory=0.9 * 80e9)
    fp = estimate(q32, one)
    # rollout: 16 B x 64.75B params / N + vLLM's 72 GB <= 80 GB  =>  N >= 129.5; the first divisor
    # of the 512 prompts at or above it: 256
    n_min = 16 * (fp.actor_params + fp.critic_params) / (80e9 - 72e9)
    assert 129 < n_min < 130
    assert smallest_world(q32, one, 80e9) == 130
    assert smallest_world(q32, one, 80e9, divides=512) == 256
    # with vLLM at its least (weights + one sequence, 71.0 GB): N >= 115.5, so 128 of 512
    assert smallest_world(q32, one, 80e9, divides=512, engine_at_minimum=True) == 128
    # 8 sequences of 21k tokens a pass never fit 80 GB: their activations alone exceed it. Only
    # where a rank holds 3 responses or fewer (N >= 8192 / 3, 2731) is its pass small enough
    assert smallest_world(q32, PAPER, 80e9, divides=512, engine_at_minimum=True) is None
    assert smallest_world(q32, PAPER, 80e9, engine_at_minimum=True) == 2731


def test_a_cuda_rank_holds_its_context_and_nccl_buffers_and_one_rank_has_no_nccl():
    """On CUDA every phase's need carries 0.7 GB of CUDA context, + 1 GB an NCCL communicator from
    2 ranks (+ 1 GB more for vLLM's tensor-parallel group over 2): a tiny model then fits 1 GB at
    N = 1 and at no N above, which the search finds though ``need`` grows from 1 to 2."""
    setup = Setup(
        world=1, strategy="fsdp", dtype="float32", micro_tokens=64, responses_per_step=4,
        prompt_tokens=8, max_new_tokens=8, gradient_checkpointing=False, cuda=True,
    )  # fmt: skip
    for world, tp, reserve in ((1, 1, 0.7e9), (2, 1, 1.7e9), (2, 2, 2.7e9)):
        engine = {"engine": "vllm", "engine_memory": 0.1e9} if tp > 1 else {}
        at = replace(setup, world=world, tensor_parallel_size=tp, **engine)
        fp = estimate(SMALL, at)
        assert fp.need == pytest.approx(max(ph.need(1.0) for ph in fp.phases) + reserve)
    assert estimate(SMALL, replace(setup, cuda=False)).reserve == 0.0
    assert estimate(SMALL, setup).fits(1e9)
    assert not estimate(SMALL, replace(setup, world=2)).fits(1e9)
    assert smallest_world(SMALL, setup, 1e9, divides=4) == 1
    assert smallest_world(SMALL, setup, 1e9) == 1


def test_hsdp_shards_the_state_over_a_node_and_adds_its_mesh_groups():
    """trainer.mesh=hsdp on the paper's 16 nodes of 8: each node holds a replica, so a rank holds
    1/8 of the training state, not 1/128, and two more NCCL communicators (the mesh's shard and
    replicate groups); its share of the batch is the same 1/128."""
    q32 = KNOWN_ARCHS["Qwen2.5-32B"]
    trained = 32_763_876_352 + 31_985_313_793
    nodes = replace(PAPER, ranks_per_node=8, cuda=True)
    flat, hsdp = estimate(q32, nodes), estimate(q32, replace(nodes, mesh="hsdp"))
    assert shard_ranks(nodes) == 128 and shard_ranks(replace(nodes, mesh="hsdp")) == 8
    assert flat.state == 16 * trained / 128
    # 16 B x 64.75B params / 8 = 129.5 GB a rank before any activation: hsdp cannot hold the
    # paper's models on 80 GB GPUs, which is why it is not the default on many nodes
    assert hsdp.state == 16 * trained / 8 == pytest.approx(129.5e9, rel=1e-3)
    assert hsdp.reference == flat.reference == 0.0
    assert hsdp.responses_per_rank == flat.responses_per_rank == 64
    assert nccl_groups(128, 1, 8) == [
        "the trainer's ranks", "HSDP's shard group", "HSDP's replicate group",
    ]  # fmt: skip
    assert hsdp.reserve - flat.reserve == pytest.approx(2e9)
    # one process and the flat layout count no mesh groups
    assert nccl_groups(128, 1, 128) == nccl_groups(128, 1) == ["the trainer's ranks"]
    # the fewest ranks that fit is a flat layout's: more hsdp nodes never shrink a rank's state
    one = replace(nodes, micro_tokens=20992, engine_memory=0.9 * 80e9)
    assert smallest_world(q32, replace(one, mesh="hsdp"), 80e9) == smallest_world(
        q32, one, 80e9
    ) == 165  # fmt: skip


def test_builtin_sampler_under_fsdp_keeps_a_replica_and_its_kv_cache():
    tiny = replace(SMALL, max_position_embeddings=4096)
    setup = Setup(
        world=2,
        strategy="fsdp",
        dtype="float32",
        micro_tokens=4 * 500,
        responses_per_step=600,
        prompt_tokens=100,
        max_new_tokens=400,
        gradient_checkpointing=False,
    )
    fp = estimate(tiny, setup)
    assert fp.replica == 4 * actor_params(tiny)
    # 300 responses a rank; the sampler decodes at most 256 rows at once
    assert fp.responses_per_rank == 300 and fp.sequences_at_once == 256
    # + the fast decoder's fused float32 copies, q/k/v and gate/up:
    # 2 layers x (8·(2·4 + 2·1·4) + 2·8·16) x 4 B = 3,072 B
    assert fp.sampler_copy == 2 * (8 * (8 + 8) + 2 * 8 * 16) * 4 == 3072
    assert fp.rollout_peak == fp.state + 3072 + 256 * kv_bytes_per_sequence(tiny, 500, 4)
    # single: the policy samples itself, unsharded state, one process
    single = estimate(tiny, replace(setup, strategy="single"))
    assert single.replica == 0 and single.state == 16 * (actor_params(tiny) + critic_params(tiny))
    assert single.responses_per_rank == 600


def test_an_evaluation_rank_samples_its_share_of_the_pairs():
    # 30 problems x 32 samples over 8 fsdp ranks: ceil(960 / 8) = 120 responses a rank, all in the
    # built-in sampler's batch (<= 256). Split by problem, as before, ranks 0-6 sampled
    # ceil(30 / 8) = 4 problems = 128 responses and rank 7 sampled 2 = 64
    tiny = replace(SMALL, max_position_embeddings=4096)
    setup = Setup(
        world=8,
        strategy="fsdp",
        dtype="float32",
        micro_tokens=4 * 500,
        responses_per_step=64,
        prompt_tokens=100,
        max_new_tokens=400,
        gradient_checkpointing=False,
        eval_responses=30 * 32,
    )
    fp = estimate(tiny, setup)
    assert (fp.eval_requests_per_engine, fp.eval_at_once) == (120, 120)
    evaluation = {ph.name: ph for ph in fp.phases}["evaluation"]
    kv = kv_bytes_per_sequence(tiny, 500, 4)
    assert evaluation.tensors == fp.state + fp.sampler_copy + 120 * kv
    # one wave of 400 steps, each reading the float32 weights and 120 sequences' KV cache at an
    # average context of 100 + 400 / 2 tokens
    step = (4 * actor_params(tiny) + 120 * kv_bytes_per_sequence(tiny, 1, 4) * 300) / 2.01e12
    assert fp.eval_seconds == pytest.approx(400 * step, rel=1e-12)
    # 2 problems x 4 samples on 3 ranks: ceil(8 / 3) = 3 a rank (by problem: 4, 4 and none)
    assert estimate(tiny, replace(setup, world=3, eval_responses=2 * 4)).eval_at_once == 3
    # no held-out set: no evaluation time
    assert estimate(tiny, replace(setup, eval_responses=0)).eval_seconds == 0.0


def test_the_builtin_sampler_decodes_in_float32_on_cpu_and_in_bfloat16_copies_on_a_gpu():
    # on CPU it decodes with the float32 masters (or their float32 replica under fsdp): replica
    # and KV cache at 4 B a value, not the bf16 compute dtype's 2
    tiny = replace(SMALL, max_position_embeddings=4096)
    setup = Setup(
        world=2,
        strategy="fsdp",
        dtype="bfloat16",
        micro_tokens=2000,
        responses_per_step=8,
        prompt_tokens=100,
        max_new_tokens=400,
        gradient_checkpointing=False,
    )
    fp = estimate(tiny, setup)
    # 2 layers x (K and V) x 1 kv head x d 4 x 4 B x 500 tokens
    assert fp.kv_per_sequence == 2 * 2 * 1 * 4 * 4 * 500
    assert fp.replica == 4 * actor_params(tiny)
    assert fp.rollout_peak == fp.state + fp.sampler_copy + 4 * fp.kv_per_sequence
    # on a GPU (sample_bytes 2): a bfloat16 copy of every weight while it samples, and a bfloat16
    # KV cache, half the float32 one
    gpu = estimate(tiny, replace(setup, sample_bytes=2))
    assert gpu.kv_per_sequence == 2 * 2 * 1 * 4 * 2 * 500
    assert gpu.sampler_copy == 2 * actor_params(tiny) and gpu.replica == fp.replica
    assert gpu.rollout_peak == gpu.state + 2 * actor_params(tiny) + 4 * gpu.kv_per_sequence


# the paper's scale as conf/scale/paper.yaml ships it: vLLM over tp 4 at 0.8 of an 80 GB GPU,
# the state offloaded while it samples, 313 steps
SHIPPED = replace(
    PAPER,
    micro_tokens=20992,
    tensor_parallel_size=4,
    engine_memory=0.8 * 80e9,
    offload=True,
    reward_model=True,
    value_pretraining=True,
    eval_responses=30 * 32,
    ranks_per_node=8,
    total_steps=313,
    save_every=10,
    headroom=1.3,
)


def test_every_phase_of_the_paper_scale_is_counted():
    q32 = KNOWN_ARCHS["Qwen2.5-32B"]
    fp = estimate(q32, SHIPPED)
    actor, critic = fp.actor_params, fp.critic_params
    phases = {ph.name: ph for ph in fp.phases}
    assert list(phases) == [
        "rollout",
        "model outputs",
        "update",
        "reward-model build",
        "value pretraining",
        "evaluation",
    ]
    state = 16 * (actor + critic) / 128
    # rollout: the state in host memory, vLLM's 64 GB awake
    assert (phases["rollout"].tensors, phases["rollout"].engine) == (0.0, 64e9)
    # the engine sleeps from the end of sampling to the next push: no share in the passes
    for name in ("model outputs", "update", "reward-model build", "value pretraining"):
        assert phases[name].engine == 0.0
    # model outputs: state + gathered + the larger no-grad pass (1 row of 512 + 20,480 tokens)
    fwd = [
        qwen2_forward_bytes(q32, 1, 512, 20480, head, 2, "packed", 441, "cast")
        for head in ("lm", "value")
    ]
    assert phases["model outputs"].tensors == state + fp.gathered + max(fwd)
    assert phases["update"].tensors == fp.train_peak
    # the critic's start: the policy's float32 shards (4 B x actor / 128), a critic-shaped model's
    # state (16 B x critic / 128), its gathered root + 2 layers in bf16, a checkpointed pass
    layer = layer_params(q32)
    start = 4 * actor / 128 + 16 * critic / 128 + (critic - 62 * layer) * 2
    assert phases["reward-model build"].tensors == start + fp.critic_activations
    # evaluation: the state back on the GPU beside the woken engine: 8.09 x 1.3 + 64 = 74.52 GB
    assert (phases["evaluation"].tensors, phases["evaluation"].engine) == (state, 64e9)
    assert fp.need == phases["evaluation"].need(1.3) == pytest.approx(1.3 * state + 64e9)
    assert round(fp.need / 1e7) == 7452 and fp.fits(80e9)
    # evaluation: 30 x 32 pairs over 128 ranks, ceil(7.5) = 8 a rank, 32 an engine of tp 4, all
    # at once (34 fit): one wave of 20,480 steps of (32.76B x 2 B / 4 + 32 x 2·64·8·128·2 B / 4 x
    # (512 + 20,480 / 2) tokens) / (3.35 TB/s x 0.6)
    assert (fp.eval_requests_per_engine, fp.eval_at_once) == (32, 32)
    step = (actor * 2 / 4 + 32 * 2 * 64 * 8 * 128 * 2 / 4 * (512 + 10240)) / (3.35e12 * 0.6)
    assert fp.eval_seconds == pytest.approx(20480 * step, rel=1e-12)
    assert round(fp.eval_seconds) == 397
    # the paper's unit: 8192 responses / 512 a mini-batch = 16 updates a step, 313 steps
    assert (fp.updates_per_step, fp.total_updates) == (16, 5008)
    # a save: 12 B x (actor + critic), 777 GB; a node's host: 8 ranks' pinned state + rank 0's
    # float32 (V, h) embedding as the cache writer streams it
    assert fp.checkpoint_bytes == 12 * (actor + critic)
    assert fp.host_per_node == 8 * state + 4 * embedding_params(q32)


def test_an_engine_that_stays_awake_counts_in_every_phase():
    q32 = KNOWN_ARCHS["Qwen2.5-32B"]
    fp = estimate(q32, replace(SHIPPED, engine_sleeps=False))
    assert all(ph.engine == 64e9 for ph in fp.phases)
    # the reward-model build at 0.8: a critic's pass beside vLLM's share is more than 80 GB
    assert not fp.fits(80e9)
    assert fp.largest_phase.name in ("update", "reward-model build")


def test_a_no_grad_pass_by_hand():
    # SMALL (h 8, L 2, heads 2/1 of d 4, i 16, V 10) under autocast in float32 (p = r = 4, no
    # casts), 1 row of 3 prompt + 2 response tokens: n = 5
    layer = qwen2_layer_activation_bytes(SMALL, 1, 3, 2, 4)
    rope = 5 * 2 * 4 * 4  # n x 2 tables x d x 4 B
    stream = 2 * 4 * 8 * 5  # the residual stream in and out
    value = qwen2_forward_bytes(SMALL, 1, 3, 2, "value", 4)
    assert value == rope + max(stream + layer, 4 * 8 * 5 + 4 * 5)
    lm = qwen2_forward_bytes(SMALL, 1, 3, 2, "lm", 4, logprob_chunk=2)
    assert lm == rope + max(stream + layer, 4 * 8 * 5 + chunked_logprob_bytes(2, 10, 8, 2, 4))
    # no larger than a training pass, which keeps every layer
    assert value <= qwen2_pass_activation_bytes(SMALL, 1, 3, 2, False, "value", 4)
