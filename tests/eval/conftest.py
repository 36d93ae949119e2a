"""A tiny base model and a vapo-lab run directory around it, built once for the harness tests."""

import json
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

# a base model built in about 3 s: 1 layer of width 32, 3-digit problems, 8 held out
TINY_BASE = dict(
    max_digits=3,
    n_train=64,
    n_eval=8,
    hidden_size=32,
    num_layers=1,
    intermediate_size=64,
    steps=20,
    batch_size=8,
    eval_samples=1,
)
# the same task and model as config overrides (what the run's config.yaml records)
TINY_RUN = [
    "task.options.max_digits=3",
    "task.n_train=64",
    "task.n_eval=8",
    "model.arch.hidden_size=32",
    "model.arch.num_layers=1",
    "model.arch.intermediate_size=64",
    "rollout.max_new_tokens=12",
    "rollout.eval_samples=2",
    "tracking=none",
    "seed=3",
]
RUN_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A run ``runs/tiny`` with policy checkpoints at steps 2 and 4 (4 = the base, perturbed)."""
    from vapo_lab.basemodel.build import build_base
    from vapo_lab.config.compose import compose_config
    from vapo_lab.models.load import load_model_and_tokenizer
    from vapo_lab.runs.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("eval")
    base = build_base(root / "base", **TINY_BASE)
    cfg = compose_config(overrides=TINY_RUN, check=False).cfg
    model, _ = load_model_and_tokenizer(base.path)
    run = root / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": RUN_ID, "tracking_uri": "none"}))
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    save_checkpoint(run / "checkpoints", 2, {"policy": model}, {"note": "test"})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # step 4's weights differ from step 2's
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    save_checkpoint(run / "checkpoints", 4, {"policy": model}, {"note": "test"})
    return SimpleNamespace(
        root=root, runs=root / "runs", run=run, base=base.path, cfg=cfg, run_id=RUN_ID
    )
