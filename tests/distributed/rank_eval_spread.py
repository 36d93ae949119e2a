"""One of N gloo ranks running the trainer's held-out evaluation of the embedded default (its
shipped base model, the built-in sampler) on the held-out problems numbered PICKS, k samples
each: writes OUT/rank<r>.json with its generate call (prompts, n), the problem (its place in
PICKS), verdict and length of each row it scored, and the metrics the ranks gathered.

Usage (torchrun): rank_eval_spread.py OUT PICKS K, PICKS e.g. 3,5
"""

import json
import os
import sys
from pathlib import Path

from tests.distributed.ranks import leave
from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.seeds import heldout_seed
from vapo_lab.trainer.evaluation import evaluate
from vapo_lab.trainer.setup import build_parts


def main() -> None:
    out, k = Path(sys.argv[1]).resolve(), int(sys.argv[3])
    picks = [int(i) for i in sys.argv[2].split(",")]
    os.chdir(out)  # its caches, if any, are the test's own
    ranks = int(os.environ["WORLD_SIZE"])
    config = typed(
        compose_config(
            overrides=[
                "tracking=none",
                f"rollout.eval_samples={k}",
                "trainer.threads=1",
                "trainer.device=cpu",
                "trainer.strategy=fsdp",
                f"trainer.nproc_per_node={ranks}",
                # the step's prompts must divide among the ranks (no step runs here)
                f"rollout.responses_per_step={8 * ranks}",
                f"trainer.mini_batch_size={8 * ranks}",
            ]
        ).cfg
    )
    parts = build_parts(config, log=lambda text: None)
    # not task.n_eval, which keys the base model (the shipped one is the default's)
    parts.task.eval = [list(parts.task.eval)[i] for i in picks]
    index = {id(p): i for i, p in enumerate(parts.task.eval)}
    calls, rows = [], []

    def generate(prompts, n, temperature, top_p, generator):
        calls.append([len(prompts), n])
        return parts.sampling.generate(prompts, n, temperature, top_p, generator)

    def score(samples, answered):
        scores, correct, texts = parts.scorer(samples, answered)
        for p, ok, length in zip(answered, correct.tolist(), samples.lengths.tolist()):
            rows.append([index[id(p)], ok, length])
        return scores, correct, texts

    metrics = evaluate(
        generate,
        parts.tokenizer,
        parts.task,
        score,
        config.rollout,
        config.model.chat_template,
        heldout_seed(config.seed, 0),
        parts.world,
    )
    record = {"calls": calls, "rows": rows, "metrics": metrics}
    (out / f"rank{parts.world.rank}.json").write_text(json.dumps(record))
    leave()


if __name__ == "__main__":
    main()
