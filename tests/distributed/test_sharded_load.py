"""A model built sharded (meta device, FSDP2, then each rank's slices read from the safetensors) is
the model ``from_pretrained`` loads: every parameter gathered whole and every buffer (the rotary
``inv_freq``, which no checkpoint holds) equal exactly, the logits to 1e-6, on 2 gloo ranks
(tests/distributed/rank_sharded_load.py), for tied and untied embeddings, fp32 and bf16 files, and
a checkpoint split over two files. Each rank reads only its slices. The slow test measures the
set-up's peak memory on each of 2 ranks against one process's (docs/distributed.md).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.distributed.world import World, single
from vapo_lab.errors import CheckpointError, ConfigError
from vapo_lab.models.precision import fsdp_policy
from vapo_lab.models.sharded import load_sharded_causal_lm

from .conftest import REPO, torchrun

SCRIPT = Path(__file__).with_name("rank_sharded_load.py")
# as the rank script's
IDS = torch.tensor([[1, 7, 42, 150, 151, 299, 3, 0], [5, 5, 300, 12, 64, 128, 255, 9]])

# name: (tie_word_embeddings, dtype on disk, max_shard_size for save_pretrained)
CHECKPOINTS = {
    "tied-fp32": (True, torch.float32, None),
    "tied-bf16": (True, torch.bfloat16, None),
    "untied-fp32": (False, torch.float32, None),
    "untied-bf16": (False, torch.bfloat16, None),
    # ~405 kB of float32 over shards of at most 250 kB: two files and model.safetensors.index.json
    "untied-fp32-two-files": (False, torch.float32, "250KB"),
}


def save_tiny(
    path: Path, tied: bool, dtype: torch.dtype, max_shard_size: str | None = None
) -> Path:
    """Saves a random Qwen2 of ~82k parameters (vocab 301: rows split 151 + 150 over 2 ranks,
    uneven)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=301,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    model = Qwen2ForCausalLM(cfg).to(dtype)
    model.save_pretrained(path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return path


def reference(path: Path) -> torch.nn.Module:
    """The one-process load the trainer makes today: from_pretrained in float32."""
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, local_files_only=True
    ).eval()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every checkpoint of CHECKPOINTS saved, then loaded sharded in one torchrun of 2 ranks."""
    root = tmp_path_factory.mktemp("sharded")
    dirs = {name: save_tiny(root / name, *spec) for name, spec in CHECKPOINTS.items()}
    torchrun(2, SCRIPT, "equal", str(root / "out.pt"), *map(str, dirs.values()))
    out = torch.load(root / "out.pt", weights_only=True)
    return {name: (d, out[str(d)]) for name, d in dirs.items()}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_two_ranks_load_what_from_pretrained_loads(two_ranks, name):
    path, got = two_ranks[name]
    tied, dtype, max_shard = CHECKPOINTS[name]
    if max_shard:
        assert (
            len(list(path.glob("*.safetensors"))) == 2
            and (path / "model.safetensors.index.json").is_file()
        )
    ref = reference(path)
    ref_params = dict(ref.named_parameters(remove_duplicate=False))
    assert got["params"].keys() == ref_params.keys()
    for n, p in ref_params.items():
        assert torch.equal(got["params"][n], p), n
    # non-persistent buffers (rotary inv_freq, original_inv_freq) on every rank, none left garbage
    ref_buffers = dict(ref.named_buffers())
    assert len(ref_buffers) == 2
    for rank_buffers in got["buffers"]:
        assert rank_buffers.keys() == ref_buffers.keys()
        for n, b in ref_buffers.items():
            assert torch.equal(rank_buffers[n], b), n
    with torch.no_grad():
        ref_logits = ref(IDS).logits
    for logits in got["logits"]:
        assert torch.allclose(logits, ref_logits, rtol=0, atol=1e-6)
    # tied weights stay one parameter; float32 master shards whatever the file's dtype; eval mode
    assert got["tied"] == tied
    assert got["shard_dtypes"] == got["local_dtypes"] == ["torch.float32"]
    assert not got["training"]
    # each rank read only its rows: together every element once (the tied lm_head not at all)
    total = sum(p.numel() for p in ref.parameters())
    assert sum(got["read"]) == total
    assert all(0.4 * total < r < 0.6 * total for r in got["read"])


def test_one_process_is_from_pretrained_unsharded(tmp_path):
    path = save_tiny(tmp_path / "m", tied=True, dtype=torch.bfloat16)
    model = load_sharded_causal_lm(path, single(), torch.device("cpu"), "bfloat16")
    assert not is_sharded(model) and not model.training
    assert fsdp_policy(model).param_dtype == torch.bfloat16  # tagged: computes in bf16
    ref = reference(path)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.dtype == torch.float32 and torch.equal(p, q), n


def test_bf16_compute_keeps_float32_shards_and_casts_in_the_passes(tmp_path, group):
    path = save_tiny(tmp_path / "m", tied=False, dtype=torch.bfloat16)
    model = load_sharded_causal_lm(path, group, torch.device("cpu"), "bfloat16")
    assert is_sharded(model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():
        logits = model(IDS).logits
        fp32 = reference(path)(IDS).logits
    # FSDP2's policy is live: the pass ran in bf16 (8 mantissa bits), so it rounds the float32
    # logits
    assert logits.dtype == torch.bfloat16
    assert not torch.equal(logits.float(), fp32)


def test_a_directory_without_safetensors_is_one_line(tmp_path):
    path = save_tiny(tmp_path / "m", tied=True, dtype=torch.float32)
    torch.save(load_file(path / "model.safetensors"), path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()
    for world in (single(), World(0, 2, 0, True)):  # refused before any process group is used
        with pytest.raises(
            ConfigError, match=r"has no \.safetensors weights \(only pytorch_model\.bin\)"
        ) as e:
            load_sharded_causal_lm(path, world, torch.device("cpu"))
        assert "\n" not in str(e.value)


def test_missing_and_misshapen_weights_are_named_at_once(tmp_path, group):
    path = save_tiny(tmp_path / "m", tied=False, dtype=torch.float32)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.norm.weight"]
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:300]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        load_sharded_causal_lm(path, group, torch.device("cpu"))
    msg = str(e.value)
    assert "lm_head.weight is (300, 64), the model's is (301, 64)" in msg
    assert "model.norm.weight is missing" in msg
    assert "\n" not in msg


def test_a_key_in_two_files_is_refused(tmp_path, group):
    path = save_tiny(tmp_path / "m", tied=True, dtype=torch.float32)
    tensors = load_file(path / "model.safetensors")
    save_file(
        {"model.norm.weight": tensors["model.norm.weight"]},
        path / "stale.safetensors",
        metadata={"format": "pt"},
    )
    with pytest.raises(
        CheckpointError,
        match="model.norm.weight is in more than one of model.safetensors, stale.safetensors",
    ):
        load_sharded_causal_lm(path, group, torch.device("cpu"))


# ~316M parameters (exact count asserted below), saved once in bf16 (0.63 GB on disk, 1.26 GB as
# float32)
BIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
BIG_PARAMS = 315_982_848


@pytest.mark.slow
def test_each_rank_sets_up_with_about_half_the_memory(tmp_path):
    path = tmp_path / "big"
    # built in a child process, so that this one does not keep its pages
    subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import torch; from transformers import Qwen2Config, Qwen2ForCausalLM; "
                "torch.manual_seed(0); "
                f"m = Qwen2ForCausalLM(Qwen2Config(**{BIG!r})); "
                f"assert sum(p.numel() for p in m.parameters()) == {BIG_PARAMS}, "
                "sum(p.numel() for p in m.parameters()); "
                f"m.to(torch.bfloat16).save_pretrained({str(path)!r})"
            ),
        ],
        check=True,
        cwd=REPO,
        timeout=600,
    )
    one = subprocess.run(
        [sys.executable, str(SCRIPT), "rss", str(tmp_path / "one.pt"), str(path), "--single"],
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    torchrun(2, SCRIPT, "rss", str(tmp_path / "two.pt"), str(path), timeout=600)
    one, two = (torch.load(tmp_path / f, weights_only=True) for f in ("one.pt", "two.pt"))
    (solo,), ranks = one["ranks"], two["ranks"]
    ratios = [r["delta_kib"] / solo["delta_kib"] for r in ranks]
    anon = [r["anon_delta_kib"] / solo["anon_delta_kib"] for r in ranks]
    print(json.dumps({"one_process": solo, "ranks": ranks, "ratios": ratios, "anon_ratios": anon}))
    # each rank holds half the parameters (rows split 2 ways), together all of them
    assert solo["params"] == sum(r["params"] for r in ranks) == BIG_PARAMS
    assert all(abs(r["params"] / BIG_PARAMS - 0.5) < 0.01 for r in ranks)
    # the same weights: per-parameter float64 sums, summed over shards in another order
    for n, s in one["sums"].items():
        assert two["sums"][n] == pytest.approx(s, rel=1e-9, abs=1e-6), n
    # the goal is 1/N = 0.5 of the set-up's memory on each of N = 2 ranks: ru_maxrss also counts the
    # pages of the mmap'd safetensors a process has read (file-backed, reclaimable), the whole file
    # for from_pretrained, a little more than half of it for a rank (measured 0.57); the tensors
    # alone (anonymous memory) are the float32 model against its half (measured 0.505)
    assert all(x <= 0.6 for x in ratios), ratios
    assert all(x <= 0.55 for x in anon), anon
