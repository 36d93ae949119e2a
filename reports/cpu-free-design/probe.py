"""Design probes of task=arithfree (issue 47; docs/cpu-task-design.md). Run from a folder outside
the work tree (its ``.vapo_cache`` holds the base and the critic's caches):

  python probe.py base   [overrides...]   the base's held-out table at top_p 0.7 and at top_p 1
  python probe.py critic [--algo A] [--drop C ...] [overrides...]
                                          the step-1 critic and advantages of a run, no update

``base``: samples ``--k`` responses per held-out problem with the trainer's own sampler at
temperature 1 and top_p 0.7 (the paper's evaluation) and at top_p 1.0, and prints, overall and per
digit-count stratum: accuracy, mode shares (direct / partial / full), accuracy of each mode, mean
length and length percentiles; and accuracy by the fraction of columns worked.

``critic``: builds the run exactly as ``vapo-lab train`` would (base, reward model, value
pretraining when on, all from the cache), collects ``--batches`` rollout batches of the initial
policy and computes values and advantages as step 1 would (no update). It prints, per response
mode: the reward, the critic's value after the first token V(s_1) (the value of the branch the
first token chose) and at the prompt V(s_0), the mean bias V(s_t) - G_t over the response's
tokens and over its first 8 tokens, and the advantage (as the update sees it, whitened) at the
first token and over all tokens. JSON of every number goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

MODES = ("direct", "partial", "full", "other")
ROW_MEANS = (
    "reward",
    "length",
    "v0",
    "v1",
    "bias_all",
    "bias_first8",
    "bias_last",
    "adv0",
    "adv_mean",
)


def _config(algo, drop, overrides):
    """The typed config of a run (``vapo-lab train``'s composition, no tracking)."""
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed

    composed = compose_config(algo=algo, drop=drop, overrides=["tracking=none", *overrides])
    return typed(composed.cfg)


def _percentiles(xs):
    xs = sorted(xs)

    def pick(q):
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9), "min": xs[0], "max": xs[-1]}


def _bucket(mode, worked, n_digits):
    """The share of columns a response worked: 0 (direct), <1/2, >=1/2 or full."""
    if mode in ("direct", "full"):
        return "0" if mode == "direct" else "full"
    return "<1/2" if worked / n_digits < 0.5 else ">=1/2"


def base(args):
    from vapo_lab.basemodel.freerecipe import summarize
    from vapo_lab.trainer.setup import build_parts

    # the run's task, base policy (from the cache), sampler and verifier, as the trainer's
    parts = build_parts(_config(None, [], args.overrides), print)
    task, sampling = parts.task, parts.sampling
    problems = list(task.eval)
    out = {"base": str(parts.policy_path), "k": args.k}
    # what the guess would give with a perfect scratchpad: the share of problems whose direct
    # answer is right
    direct_ok = defaultdict(list)
    for p in problems:
        direct_ok[task.stratum(p)].append(task.min_columns(p) == 0)
        direct_ok["all"].append(task.min_columns(p) == 0)
    for top_p in (0.7, 1.0):
        gen = torch.Generator().manual_seed(args.seed)
        s = sampling.generate(sampling.encode(problems), args.k, 1.0, top_p, gen).cpu()
        rep = [p for p in problems for _ in range(args.k)]
        _, correct, texts = parts.scorer(s, rep)
        lengths = s.lengths.tolist()

        def by(xs):
            return [xs[i * args.k : (i + 1) * args.k] for i in range(len(problems))]

        table = summarize(task, problems, by(texts), by(lengths))
        per_stratum_lengths = defaultdict(list)
        by_fraction = defaultdict(lambda: [0, 0])
        for p, text, n, ok in zip(rep, texts, lengths, correct.tolist()):
            per_stratum_lengths[task.stratum(p)].append(n)
            per_stratum_lengths["all"].append(n)
            bucket = _bucket(*task.classify(text, p), p.meta["n_digits"])
            for key in (f"{task.stratum(p)}|{bucket}", f"all|{bucket}"):
                by_fraction[key][0] += int(ok)
                by_fraction[key][1] += 1
        res = out[f"top_p={top_p}"] = {
            "table": table,
            "lengths": {k: _percentiles(v) for k, v in per_stratum_lengths.items()},
            "acc_by_worked_fraction": {
                k: {"acc": v[0] / v[1], "n": v[1]} for k, v in sorted(by_fraction.items())
            },
            "truncated": float(s.truncated.float().mean()),
        }
        out["direct_answer_right_share"] = {k: sum(v) / len(v) for k, v in direct_ok.items()}
        out["problems_per_stratum"] = {k: len(v) for k, v in direct_ok.items()}
        print(f"== top_p {top_p}")
        for key, row in table.items():
            modes = "  ".join(
                f"{m} {100 * row.get('share_' + m, 0):4.1f}%"
                f"/{100 * row.get('acc_' + m, float('nan')):5.1f}"
                for m in MODES
            )
            print(f"{key:8s} acc {100 * row['acc']:5.1f}  len {row['length']:6.1f}  {modes}")
        print(res["lengths"])
        print(
            {
                k: (round(100 * v["acc"], 1), v["n"])
                for k, v in res["acc_by_worked_fraction"].items()
            }
        )
    Path(args.out).write_text(json.dumps(out, indent=1))


def _rows(batch, task, tokenizer):
    """Per response of ``batch`` (values and advantages filled in): its mode and the numbers."""
    texts = [
        tokenizer.decode(ids[:n].tolist(), skip_special_tokens=True)
        for ids, n in zip(batch.rows.response_ids, batch.lengths.tolist())
    ]
    rows = []
    for i, (p, text) in enumerate(zip(batch.problems, texts)):
        n = int(batch.lengths[i])
        mode, _ = task.classify(text, p)
        v, g, a = batch.values[i, :n], batch.mc_returns[i, :n], batch.advantages[i, :n]
        rows.append(
            {
                "mode": mode,
                "stratum": task.stratum(p),
                "reward": float(batch.scores[i]),
                "length": n,
                "v0": float(v[0]),
                "v1": float(v[1]) if n > 1 else float("nan"),
                "bias_all": float((v - g).mean()),
                "bias_first8": float((v[:8] - g[:8]).mean()),
                "bias_last": float(v[-1] - g[-1]),
                "adv0": float(a[0]),
                "adv_mean": float(a.mean()),
                "lam": float(batch.lam_policy[i]) if batch.lam_policy is not None else None,
            }
        )
    return rows


def critic(args):
    from vapo_lab.trainer.advantages import compute_advantages
    from vapo_lab.trainer.trainer import running

    config = _config(args.algo, args.drop, [f"output_dir={args.runs}", *args.overrides])
    rows = []
    # started as `vapo-lab train` starts a run: the critic from the caches (built on first use)
    with running(config, log=print) as tr:
        c, phases = tr.config, tr.phases
        for _ in range(args.batches):
            # step 1's phases up to its advantages, without the updates
            batch, _ = phases.rollout(
                c.rollout,
                c.algo.dynamic_sampling,
                tr.data,
                tr.gen_rollout,
                tr.policy,
                [tr.critic, tr.ref],
                [tr.actor_opt, tr.critic_opt],
            )
            phases.model_outputs(batch, tr.policy, tr.critic, tr.ref)
            compute_advantages(c.algo, c.gae, c.kl, c.rollout.n_samples, batch, tr.world)
            phases.push(tr.policy)  # the engine (vLLM) slept after sampling: wake it
            rows += _rows(batch, tr.task, tr.tokenizer)
    summary = {}
    for key in ["all", *MODES]:
        sel = [r for r in rows if key == "all" or r["mode"] == key]
        if not sel:
            continue

        def mean(f):
            return round(statistics.fmean(r[f] for r in sel if r[f] == r[f]), 4)

        summary[key] = {"n": len(sel), **{f: mean(f) for f in ROW_MEANS}}
        print(key, summary[key])
    out = {
        "summary": summary,
        "rows": rows,
        "critic_init": config.critic.init,
        "pretrain": bool(config.critic.pretrain.enabled),
    }
    Path(args.out).write_text(json.dumps(out, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["base", "critic"])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--algo", default=None)
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--runs", default="probe_runs")
    ap.add_argument("--out", default="probe.json")
    args, args.overrides = ap.parse_known_args(argv)  # the rest: Hydra overrides
    {"base": base, "critic": critic}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
