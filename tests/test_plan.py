"""`vapo-lab plan` and the refusal of `train` for a run its devices cannot hold
(vapo_lab.config.plan)."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.config.compose import compose_config
from vapo_lab.config.plan import device_memory, fit_problems, plan_run
from vapo_lab.models.activations import qwen2_pass_activation_bytes
from vapo_lab.models.shapes import Shape

runner = CliRunner()
WIDE = {"COLUMNS": "300"}
# the paper's scale before it was planned: 8 sequences of 20,992 tokens a micro-batch, a 32B vLLM
# engine on one GPU given half of it, the training state resident while it samples
PAPER_8X16 = [
    "scale=paper",
    "trainer.strategy=fsdp",
    "trainer.nproc_per_node=8",
    "trainer.nodes=16",
    "trainer.max_tokens_per_micro_batch=167936",
    "rollout.vllm.tensor_parallel_size=1",
    "rollout.vllm.gpu_memory_utilization=0.5",
    "trainer.offload_during_rollout=false",
]
QWEN25_32B = {
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


def _rows(output: str) -> dict[str, list[str]]:
    """Returns the plan table's rows (not a terminal: tab-separated) by quantity."""
    return {
        cells[0]: cells[1:] for line in output.splitlines() if len(cells := line.split("\t")) == 3
    }


def test_plan_of_the_paper_setup_on_128_gpus():
    result = runner.invoke(app, ["plan", *PAPER_8X16], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    assert rows["parameters: actor"][0] == "32.76B (32,763,876,352)"
    assert rows["parameters: critic"][0] == "31.99B (31,985,313,793)"
    assert rows["tokens per sequence s"][0] == "20,992"
    assert rows["tokens a pass"][0] == "167,936"
    # 16 B x (32.76B + 31.99B) / 128 = 8.09 GB: 4 + 4 + 8
    assert [rows[k][0] for k in ("weights", "gradients", "optimizer state")] == [
        "2.02 GB",
        "2.02 GB",
        "4.05 GB",
    ]
    assert rows["KV cache per sequence"][0] == "5.50 GB"
    # state 8.09 + gathered 5.06 + a checkpointed pass of 8 x 20,992 tokens
    # (qwen2_pass_activation_bytes): 209.18 GB, x 1.3 for the allocator = 271.94 GB, + the CUDA
    # context 0.7 and the 128 ranks' NCCL communicator 1.0
    assert rows["phase: update (checkpointing on)"][1].endswith(": 209.18 GB")
    assert rows["phase: update (checkpointing on)"][0] == "271.94 GB"
    assert rows["CUDA context + NCCL buffers"][0] == "1.70 GB"
    assert rows["need a GPU"][0] == "273.64 GB"
    assert rows["  sequences decoded at once"][0] == "0 of 64 requests"
    assert "fits 80 GB GPUs at N = 128: no" in result.output
    assert "fewest GPUs that fit: none" in result.output
    assert "estimated step at N = 128: never (no sequence fits)" in result.output
    assert (
        "to fit, fix with one or more of: trainer.max_tokens_per_micro_batch=41984 "
        "(the update then fits; 167936 tokens a pass now); "
        "rollout.vllm.gpu_memory_utilization >= 0.89"
    ) in result.output


def test_plan_of_the_paper_scale_as_shipped_fits_and_names_a_step_under_an_hour():
    result = runner.invoke(app, ["plan", "scale=paper"], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    # 128 GPUs, vLLM over tp 4 at 0.8 of a GPU, the state offloaded while it samples
    assert rows["phase: rollout"][0] == "64.00 GB"
    # the engine sleeps from sampling's end to the next push: the phase it shares with the state
    # is evaluation, 16 B x 64.75B / 128 = 8.09 GB x 1.3 (allocator headroom) + 64 GB; a GPU
    # also holds the CUDA context 0.7 and two NCCL communicators of 1.0 (the 128 ranks, tp 4)
    assert rows["phase: evaluation"][0] == "74.52 GB" and rows["need a GPU"][0] == "77.22 GB"
    assert rows["CUDA context + NCCL buffers"][0] == "2.70 GB"
    # the paper's 5,000 gradient updates: 313 rollout steps of 8192 / 512 = 16 updates
    assert rows["gradient updates"][0] == "5,008 (16 a step)"
    # 12 B x 64.75B: float32 weights and AdamW's m and v of actor and critic
    assert rows["checkpoint a save"][0].startswith("776.99 GB")
    # each of 8 ranks' state pinned (8 x 8.09 GB) + rank 0's float32 (V, h) embedding, 3.11 GB
    assert rows["host memory a node"][0] == "67.86 GB"
    # an evaluation: AIME's 30 problems x 32 samples = 960 pairs over 128 ranks, ceil(7.5) = 8 a
    # rank, 32 an engine of tp 4, all at once (34 fit): one wave of 20,480 decoding steps, each
    # reading 16.38 GB of weights + 32 x 2·64·8·128·2 B / 4 x (512 + 10,240) tokens = 22.55 GB of
    # KV cache at 2.01 TB/s: 19.4 ms x 20,480 = 6.6 min. Split by problem, as before, one engine
    # got 4 problems, 128 requests: 4 waves of 34 at once, 27.4 min, while 24 of 32 engines idled
    assert rows["time: an evaluation"][0] == "6.6 min"
    assert (
        "collective_timeout_min 120 against a rollout's upper bound 54.8 min and an evaluation's "
        "6.6 min (ranks wait for the slowest engine): enough"
    ) in result.output
    # (0.8 x 80 GB - 32.76B x 2 B / 4) / (2·64·8·128·2 B x 20,992 / 4) = (64 - 16.38) / 1.376 GB: 34
    assert rows["  sequences decoded at once"][0] == "34 of 256 requests"
    assert "fits 80 GB GPUs at N = 128: yes" in result.output
    assert "smallest setting whose step takes under an hour: N = 256 (estimated" in result.output


def test_plan_of_the_embedded_default_fits():
    result = runner.invoke(app, ["plan"], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    assert rows["parameters: actor"][0] == "1.10M (1,101,312)"
    assert "fits 80 GB GPUs at N = 1: yes" in result.output
    assert "fewest GPUs that fit: 1" in result.output


def test_plan_reads_a_local_config_json_and_the_gpu_size(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_32B))
    result = runner.invoke(
        app,
        [
            "plan",
            "--gpu-memory-gb",
            "141",
            "--prompt-tokens",
            "256",
            *PAPER_8X16,
            f"model.path={tmp_path}",
            "trainer.max_tokens_per_micro_batch=20992",
        ],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    assert (
        f"Resource plan: {tmp_path}/config.json, fsdp over N = 128 ranks, bfloat16, 141 GB a GPU"
        in result.output
    )
    assert _rows(result.output)["tokens per sequence s"][0] == "20,736"


def test_plan_of_hf_without_a_shape_says_where_to_get_one():
    result = runner.invoke(app, ["plan", "model=hf", "model.dtype=bfloat16"], env=WIDE)
    assert result.exit_code == 1
    assert (
        "model.arch_name to one of Qwen2.5-0.5B, Qwen2.5-1.5B, Qwen2.5-7B, Qwen2.5-32B"
        in result.output
    )


def test_plan_still_refuses_invalid_configs():
    result = runner.invoke(app, ["plan", "trainer.nproc_per_node=2"], env=WIDE)
    assert result.exit_code == 1 and "needs trainer.strategy=fsdp" in result.output


# -- train refuses a run its devices cannot hold ---------------------------------------------------
def _boom(*args, **kwargs):
    raise AssertionError("compute started before the run was refused")


@pytest.fixture
def no_compute(monkeypatch, tmp_path):
    """An empty working directory in which building or loading a model fails the test."""
    import vapo_lab.basemodel.build
    import vapo_lab.trainer.setup

    for module, name in (
        (vapo_lab.trainer.setup, "load_policy"),
        (vapo_lab.trainer.setup, "build_base_for"),
        (vapo_lab.basemodel.build, "build_base"),
    ):
        monkeypatch.setattr(module, name, _boom)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the run needs "), result.output
    return lines[0]


def test_train_refuses_a_model_larger_than_the_host(no_compute, monkeypatch):
    monkeypatch.setattr("vapo_lab.config.plan._host_memory", lambda: 64e9)
    # h 16384 over 48 layers: ~39.6B parameters, 16 B each for the actor and as much for the critic
    result = runner.invoke(
        app,
        [
            "train",
            "tracking=none",
            "trainer.device=cpu",
            "model.arch.hidden_size=16384",
            "model.arch.num_layers=48",
        ],
        env=WIDE,
    )
    line = _one_line(result)
    assert "this host's RAM" in line and "model.gradient_checkpointing=true" in line
    assert "fix with one or more of: " in line and "`vapo-lab plan` shows the numbers" in line
    assert os.listdir(no_compute) == []


def test_train_refuses_when_the_host_is_small(no_compute, monkeypatch):
    monkeypatch.setattr("vapo_lab.config.plan._host_memory", lambda: 5e7)  # 0.05 GB
    result = runner.invoke(app, ["train", "tracking=none", "trainer.device=cpu"], env=WIDE)
    line = _one_line(result)
    # the embedded default needs 0.3 GB in its evaluation: fp32 state 35 MB + the built-in
    # sampler's float32 KV cache, 256 rows at once (of 256 problems x 4 samples) of s = 512 tokens
    # (the plan's prompt estimate, capped at the context) x 2·L 4·kv 2·d 32·4 B = 268 MB
    assert "the run needs 0.3 GB a rank (evaluation: " in line
    assert "each rank has 0.1 GB (this host's RAM)" in line
    assert "model.gradient_checkpointing=true" in line
    assert os.listdir(no_compute) == []


def test_the_embedded_default_fits_this_host():
    assert fit_problems(compose_config(overrides=["trainer.device=cpu"]).cfg) == []


def test_cpu_ranks_share_the_host(monkeypatch):
    monkeypatch.setattr("vapo_lab.config.plan._host_memory", lambda: 8e9)
    cfg = compose_config(
        overrides=["trainer.device=cpu", "trainer.strategy=fsdp", "trainer.nproc_per_node=2"]
    ).cfg
    assert device_memory(cfg) == (4e9, "this host's RAM of 8.0 GB, shared by 2 ranks", "cpu")


def test_a_gpu_run_is_measured_against_the_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(total_memory=80e9, name="a GPU"),
    )
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_32B))
    base = [*PAPER_8X16, f"model.path={tmp_path}", "task.train_path=train.jsonl"]
    [line] = fit_problems(compose_config(overrides=base).cfg)
    assert line.startswith(
        "the run needs 273.6 GB a rank (update 209.2 GB x 1.3: state 8.1 + activations 196.0 for "
        "a pass of 167936 tokens + gathered 5.1; rollout 48.1 GB"
    )
    assert "; + 1.7 GB CUDA context and NCCL)" in line
    assert "each rank has 80.0 GB (cuda:0, a GPU)" in line
    assert (
        "trainer.max_tokens_per_micro_batch=41984" in line
        and "rollout.vllm.gpu_memory_utilization >= 0.89" in line
    )
    # one sequence a pass and vLLM given what it needs: at 128 GPUs the rollout then needs the
    # state 8.09 GB x 1.3 (allocator headroom) + vLLM's 71.2 + the CUDA context 0.7 and the ranks'
    # NCCL communicator 1.0 = 83.4 GB, and the fix is 256 GPUs
    fixed = [
        *base,
        "trainer.max_tokens_per_micro_batch=20992",
        "rollout.vllm.gpu_memory_utilization=0.89",
    ]
    line = fit_problems(compose_config(overrides=fixed).cfg)[-1]
    assert line.startswith("the run needs 83.4 GB a rank") and "at least 256" in line
    fixed.append("trainer.nodes=32")
    # ... where one engine a GPU decodes its 32 sequences a few at a time: a rollout's bound is
    # 371 min, past the 120-minute collective timeout, so the run is refused until that is raised
    [line] = fit_problems(compose_config(overrides=fixed).cfg)
    assert line == (
        "trainer.collective_timeout_min=120 is below the plan's bound for one rollout, 371 min "
        "(ranks wait for the slowest engine in the first collective after sampling): set "
        "trainer.collective_timeout_min=382"
    )
    fixed.append("trainer.collective_timeout_min=382")
    assert fit_problems(compose_config(overrides=fixed).cfg) == []
    # 4.05 GB x 1.3 + 71.2 + 0.7 + 1.0
    need = plan_run(compose_config(overrides=fixed).cfg, 80e9).footprint.need
    assert need / 1e9 == pytest.approx(78.16, abs=0.005)
    # as shipped
    assert (
        fit_problems(
            compose_config(
                overrides=[f"model.path={tmp_path}", "scale=paper", "task.train_path=train.jsonl"]
            ).cfg
        )
        == []
    )


def test_an_evaluation_past_the_collective_timeout_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(total_memory=80e9, name="a GPU"),
    )
    # scale=small-gpu evaluated on 500 held-out problems x 32 samples over 8 ranks: 2000 a rank,
    # its engine decoding floor((40 - 3.09 GB of weights) / 0.25 GB a sequence) = 147 at once: 14
    # waves of 8192 steps of (3.09 GB + 147 x 28,672 B x (512 + 4096)) / 2.01 TB/s = 11.2 ms,
    # 1284 s = 21 min; the rollout takes 3 min. A 15-minute timeout would end the evaluation
    base = ["scale=small-gpu", "task.n_eval=500"]  # its shape from model.arch_name

    def problems(minutes: int) -> list[str]:
        overrides = [*base, f"trainer.collective_timeout_min={minutes}"]
        return fit_problems(compose_config(overrides=overrides, check=False).cfg)

    assert problems(15) == [
        "trainer.collective_timeout_min=15 is below the plan's bound for one evaluation, 21 min "
        "(ranks wait for the slowest engine in the first collective after sampling): set "
        "trainer.collective_timeout_min=32"
    ]
    assert problems(32) == []


# -- experiments/table1-small-gpu.yaml: the resources its header states --------------------------
# Qwen2.5-1.5B's published config.json (huggingface.co/Qwen/Qwen2.5-1.5B), the base of
# scale=small-gpu
QWEN25_1_5B = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
    "vocab_size": 151936,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}
SMALL_GPU_GRID = Path(__file__).resolve().parents[1] / "experiments" / "table1-small-gpu.yaml"


def test_table1_small_gpu_fits_the_gpus_its_header_states(tmp_path):
    from omegaconf import OmegaConf

    from vapo_lab.config.plan import fewest_ranks
    from vapo_lab.launch.grid import load_grid

    header = SMALL_GPU_GRID.read_text()
    assert "NOT RUN BY THIS PROJECT" in header and "--launcher slurm" in header
    assert "1 node of 8 GPUs" in header and "80 GB GPUs" in header
    # by hand, h 1536, L 28, 12 heads / 2 kv of d 128, i 8960, V 151936, tied:
    # a layer: q 1536² + 1536, k = v = 1536·256 + 256, o 1536², MLP 3·1536·8960, 2 norms 2·1536
    h, L, kv_d, i, V = 1536, 28, 2 * 128, 8960, 151936
    layer = (h * h + h) + 2 * (h * kv_d + kv_d) + h * h + 3 * h * i + 2 * h
    actor = V * h + L * layer + h  # embeddings (tied: no lm_head) + layers + final norm
    assert layer == 46_797_824 and actor == 1_543_714_304  # the model card's 1.54B
    critic = actor + h + 1  # the backbone + a value head Linear(h, 1)
    # fsdp over 8 ranks: 16 B/param (ZeRO: fp32 weights 4, gradients 4, AdamW m and v 8) / 8
    state = 16 * (actor + critic) / 8
    # rollout: the state + vLLM's share, 0.5 x 80 GB; needed: torch's tensors x 1.3 (allocator),
    # + a GPU's CUDA context (0.7 GB) and the 8 ranks' NCCL communicator (1 GB)
    reserve = 0.7e9 + 1e9
    rollout = state + 0.5 * 80e9
    need = 1.3 * state + 0.5 * 80e9 + reserve
    # update: state + the gathered FSDP root (embeddings + final norm) and 2 layers in bf16 + the
    # larger of the actor's and the critic's checkpointed pass of 17,408 tokens (the budget: 2
    # sequences of s = 512 + 8192) in bf16 copies of the shards, the tensors autograd keeps
    # (qwen2_pass_activation_bytes, worked by hand in tests/bench/test_plan_check.py), the actor's
    # with its chunked log-prob pass over 2 x 8192 response tokens in chunks of 2^28 / (4·V) = 441
    shape = Shape(
        hidden_size=h,
        num_layers=L,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        intermediate_size=i,
        vocab_size=V,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    )
    passes = [
        qwen2_pass_activation_bytes(
            shape, 2, 512, 8192, True, head, 2, False, "packed", 441, "cast"
        )
        for head in ("lm", "value")
    ]
    update = state + 2 * (V * h + h + 2 * layer) + max(passes)
    assert (state, rollout) == (6_174_860_290, 46_174_860_290) and round(
        update / 1e7
    ) == 1119  # 11.19 GB
    # DAPO has no critic: 16 B x actor / 8
    dapo = 16 * actor / 8 + 0.5 * 80e9
    assert dapo == 43_087_428_608
    dapo_need = 1.3 * 16 * actor / 8 + 0.5 * 80e9 + reserve

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_1_5B))
    specs = load_grid(SMALL_GPU_GRID, seeds=1).expand(
        [f"model.path={tmp_path}", "task.train_path=d.jsonl"]
    )
    assert len(specs) == 10
    for spec in specs:
        plan = plan_run(OmegaConf.create(spec.config), 80e9)
        fp, want = plan.footprint, (dapo_need if spec.algo == "dapo" else need)
        assert plan.setup.world == 8 and fp.fits(80e9)
        assert fp.actor_params == actor and fp.need == pytest.approx(want, rel=1e-12)
        if spec.algo != "dapo":
            assert (fp.critic_params, round(fp.train_peak)) == (critic, round(update))
        # at N = 1 the critic's cells need 1.3 x 2 x 24.7 + 40 > 80 GB; at N = 2, 1.3 x 24.7 + 40
        assert fewest_ranks(plan) == (1 if spec.algo == "dapo" else 2)
    # the header states these figures (to the plan's two decimals)
    assert (
        f"Needs {need / 1e9:.2f} GB a GPU at N = 8" in header
        and f"{dapo_need / 1e9:.2f} GB for DAPO" in header
    )
    assert "fewest GPUs" in header and "that fit: 2 (DAPO 1)" in header
    assert f"update phase\n#   {update / 1e9:.2f}" in header


def test_plan_of_scale_small_gpu_without_the_weights():
    result = runner.invoke(app, ["plan", "scale=small-gpu"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert _rows(result.output)["parameters: actor"][0] == "1.54B (1,543,714,304)"
    assert "fits 80 GB GPUs at N = 8: yes (needs 49.73 GB a GPU, in rollout" in result.output
    assert "fewest GPUs that fit: 2" in result.output


def test_plan_takes_this_machines_gpu_where_cuda_is_present(monkeypatch):
    # an H100 80GB reports ~85e9 bytes: the plan judges against what the pre-flight check will see
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    sizes = [85.0e9, 150.0e9]
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(total_memory=sizes[i], name="a GPU"),
    )
    result = runner.invoke(app, ["plan"], env=WIDE)
    assert ", 85 GB a GPU" in result.output.splitlines()[0]
    result = runner.invoke(app, ["plan", "--gpu-memory-gb", "40"], env=WIDE)
    assert ", 40 GB a GPU" in result.output.splitlines()[0]


# -- vLLM's share and what a GPU holds beyond torch's tensors (issue 61) ------------------------


def test_a_share_bound_is_rounded_toward_what_passes_the_check():
    from vapo_lab.models.footprint import share_bound

    assert share_bound(0.8685, upper=True) == 0.86 and share_bound(0.8685, upper=False) == 0.87
    # a bound already on the hundredth stays (0.29 x 100 is 28.999... in floating point)
    assert share_bound(0.29, upper=True) == 0.29 and share_bound(0.29, upper=False) == 0.29
    assert share_bound(0.001, upper=False) == 0.01 and share_bound(0.999, upper=True) == 0.99


def test_the_printed_upper_bound_of_vllm_s_share_is_rounded_down_and_passes_the_plan_s_check():
    """A GPU sized so that vLLM's share may reach exactly 0.8685: the plan prints 0.86 (rounded,
    0.87 would not fit), and a run set to the printed bound fits."""
    base = ["rollout=vllm"]
    fp = plan_run(compose_config(overrides=base).cfg, 80e9).footprint
    # the rest of the GPU: torch's tensors x 1.3 in the phases vLLM is awake in, + the CUDA
    # context (one rank, tp 1: no NCCL communicator)
    held = max(ph.tensors * 1.3 for ph in fp.phases if ph.engine) + 0.7e9
    gb = held / (1 - 0.8685) / 1e9
    result = runner.invoke(app, ["plan", *base, "--gpu-memory-gb", repr(gb)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert ", 0.86] at N = 1" in result.output
    for share, fits in (("0.86", True), ("0.87", False)):
        overrides = [*base, f"rollout.vllm.gpu_memory_utilization={share}"]
        assert (
            plan_run(compose_config(overrides=overrides).cfg, gb * 1e9).footprint.fits(gb * 1e9)
            is fits
        )
        result = runner.invoke(app, ["plan", *overrides, "--gpu-memory-gb", repr(gb)], env=WIDE)
        assert f"): {share} {'works' if fits else 'does not work'}" in result.output


def test_a_gpu_rank_holds_its_cuda_context_and_nccl_buffers_beyond_its_tensors():
    """0.7 GB of CUDA context a rank, and 1 GB for each NCCL communicator it is in (the trainer's
    ranks when several, vLLM's tensor-parallel group when it spans several); none on CPU."""
    cases = [
        (["rollout=vllm"], 0.7e9, "700.00 MB", "the CUDA context 0.70 GB: outside"),
        (
            ["rollout=vllm", "trainer.strategy=fsdp", "trainer.nproc_per_node=2"],
            1.7e9,
            "1.70 GB",
            "+ 1 NCCL communicator x 1.00 GB (the trainer's ranks)",
        ),
        (
            [
                "rollout=vllm",
                "trainer.strategy=fsdp",
                "trainer.nproc_per_node=2",
                "rollout.vllm.tensor_parallel_size=2",
            ],
            2.7e9,
            "2.70 GB",
            "+ 2 NCCL communicators x 1.00 GB (the trainer's ranks, vLLM's tensor-parallel group)",
        ),
    ]
    for overrides, reserve, shown, how in cases:
        cfg = compose_config(overrides=overrides).cfg
        fp = plan_run(cfg, 80e9).footprint
        largest = max(ph.need(1.3) for ph in fp.phases)
        assert fp.need == pytest.approx(largest + reserve, rel=1e-12)
        on_cpu = plan_run(cfg, 80e9, device="cpu").footprint
        assert on_cpu.need == max(ph.need(1.0) for ph in on_cpu.phases)
        rows = _rows(runner.invoke(app, ["plan", *overrides], env=WIDE).output)
        assert rows["CUDA context + NCCL buffers"][0] == shown
        assert how in rows["CUDA context + NCCL buffers"][1]


def test_the_plan_counts_an_hsdp_ranks_state_over_its_node():
    # 2 nodes x 8: flat shards the float32 weights over 16 ranks, hsdp over a node's 8
    over = ["scale=small-gpu", "trainer.nodes=2", "trainer.nproc_per_node=8"]
    flat = plan_run(compose_config(overrides=over, check=False).cfg, 80e9).footprint
    hsdp = plan_run(
        compose_config(overrides=[*over, "trainer.mesh=hsdp"], check=False).cfg, 80e9
    ).footprint
    trained = flat.actor_params + flat.critic_params
    assert flat.weights == pytest.approx(4 * trained / 16)
    assert hsdp.weights == pytest.approx(4 * trained / 8)
