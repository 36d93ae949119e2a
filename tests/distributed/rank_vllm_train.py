"""One rank of a run over FSDP2 on gloo with vLLM sampling (the CPU stand-in,
tests/rollout/fake_vllm.py), in OUT_DIR (its caches too): writes its metrics and how its models
were built. grpo: a KL term to a reference; vapo: a critic from a reward model the ranks build,
then value-pretrained.

Usage (torchrun): rank_vllm_train.py ALGO MODEL_DIR OUT_DIR [--whole] [--set KEY=VALUE ...];
--whole builds every rank's models whole and shards them afterwards (the path before sharded
construction); --set adds overrides (the rank count is torchrun's).
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

import fake_vllm  # noqa: E402

from tests.distributed.ranks import leave  # noqa: E402
from vapo_lab.config.compose import compose_config  # noqa: E402
from vapo_lab.config.plan import plan_run  # noqa: E402
from vapo_lab.distributed.fsdp import is_sharded  # noqa: E402
from vapo_lab.trainer import caches, phases, setup, update  # noqa: E402
from vapo_lab.trainer import trainer as trainer_module  # noqa: E402
from vapo_lab.trainer.trainer import Trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("algo", choices=["grpo", "vapo"])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--whole", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="an override, e.g. task.n_eval=1")
    a = ap.parse_args()
    fake_vllm.install()
    built_sharded = []
    original = setup.load_policy

    def load_policy(model, task, log, progress, world, device=None, sharded=False, threads=None):
        built_sharded.append(sharded)
        whole = sharded and not a.whole
        return original(model, task, log, progress, world, device, whole, threads)

    setup.load_policy = load_policy
    # every pass and update must run with the engine asleep (its memory is the training's then)
    engines, awake = [], set()
    original_build = setup.build_parts

    def build_parts(*args, **kwargs):
        parts = original_build(*args, **kwargs)
        engines.append(parts.sampling.engine)
        return parts

    def asleep_in(name, method):
        def run(*args, **kwargs):
            if engines and not engines[-1]._asleep:
                awake.add(name)
            return method(*args, **kwargs)

        return run

    setup.build_parts = trainer_module.build_parts = build_parts
    phases.Phases.model_outputs = asleep_in("model outputs", phases.Phases.model_outputs)
    update.Descent.step = asleep_in("an optimiser step", update.Descent.step)
    # the fake engine's memory ledger, its largest figure in each (phase, part) of the run
    ledger: dict[str, float] = {}
    context = ["start"]

    def within(name, method):
        def run(*args, **kwargs):
            context.append(name)
            try:
                return method(*args, **kwargs)
            finally:
                context.pop()

        return run

    def noting(part, method):
        def run(*args, **kwargs):
            if engines:
                key = f"{context[-1]}: {part}"
                held = sum(engines[-1].llm.device_bytes().values())
                ledger[key] = max(ledger.get(key, 0.0), held)
            return method(*args, **kwargs)

        return run

    caches.CriticStart._reward_model = within(
        "reward-model build", caches.CriticStart._reward_model
    )
    caches.CriticStart._pretrain = within("value pretraining", caches.CriticStart._pretrain)
    Trainer.train_step = within("step", Trainer.train_step)
    Trainer.evaluate = within("evaluation", Trainer.evaluate)
    fake_vllm.LLM.generate = noting("sampling", fake_vllm.LLM.generate)
    phases.Phases.model_outputs = noting("model outputs", phases.Phases.model_outputs)
    update.Descent.step = noting("update", update.Descent.step)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    os.chdir(a.out)  # the caches (.vapo_cache) are this run's own
    critic = (
        ["critic.rm_steps=2", "critic.rm_batch=16", "critic.pretrain.steps=2"]
        if a.algo == "vapo"
        else []
    )
    cfg = compose_config(
        algo=a.algo,
        overrides=[
            *critic,
            "rollout=vllm",
            "model=hf",
            f"model.path={a.model}",
            "task.options.max_digits=3",
            "task.n_train=64",
            "task.n_eval=8",
            "rollout.responses_per_step=16",
            "rollout.group_size=4",
            "rollout.max_new_tokens=12",
            "rollout.eval_samples=1",
            "trainer.mini_batch_size=8",
            "trainer.max_tokens_per_micro_batch=64",
            "trainer.total_steps=2",
            "trainer.eval_every=2",
            "trainer.save_every=2",
            "trainer.threads=1",
            "trainer.strategy=fsdp",
            f"trainer.nproc_per_node={os.environ['WORLD_SIZE']}",
            "trainer.device=cpu",
            "tracking=none",
            f"output_dir={a.out}/runs",
            "run_name=run",
            "model.chat_template=none",
            *a.set,
        ],
    ).cfg
    trainer = Trainer(cfg, log=lambda text: None)
    result = trainer.train()
    rank = int(os.environ["RANK"])
    Path(a.out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "asked_sharded": built_sharded,
                "policy_sharded": is_sharded(trainer.policy),
                "ref_sharded": is_sharded(trainer.ref),
                "critic_sharded": is_sharded(trainer.critic),
                "engine_awake_in": sorted(awake),
                "ledger": ledger,
                "plan": {
                    ph.name: ph.engine
                    for ph in plan_run(cfg, fake_vllm.DEVICE_BYTES).footprint.phases
                },
                "metrics": [
                    {k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))}
                    for m in result.metrics
                ],
            }
        )
    )
    leave()


if __name__ == "__main__":
    main()
