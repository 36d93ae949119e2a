"""Design probes of task=arithfree (issue 47; docs/cpu-task-design.md). Run from a folder outside the work tree:

  python probe.py base   [overrides...]   the base's held-out table at the eval settings and at top_p 1
  python probe.py critic [--algo A] [--drop C ...] [overrides...]
                                          the step-1 critic and advantages of a run, without updating

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


def _cfg(algo, drop, overrides):
    from vapo_lab.config.compose import compose_config

    return compose_config(algo=algo, drop=drop, overrides=["tracking=none", *overrides]).cfg


def _percentiles(xs):
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return {"p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9), "min": xs[0], "max": xs[-1]}


def base(args):
    from vapo_lab.basemodel.freerecipe import summarize
    from vapo_lab.rollout.prompts import encode_prompts
    from vapo_lab.trainer.scoring import RewardScorer
    from vapo_lab.trainer.setup import checked_policy, make_sampling, prepare_process, task_for

    cfg = _cfg(None, [], args.overrides)
    device = prepare_process(cfg)
    task = task_for(cfg)
    policy, tok, _, path = checked_policy(cfg, task, device, print, None)
    sampling = make_sampling(cfg, policy, tok, path, task)
    scorer = RewardScorer(task, tok, 1.0, 0.0, None)
    problems = list(task.eval)
    out = {"base": str(path), "k": args.k}
    for top_p in (0.7, 1.0):
        gen = torch.Generator().manual_seed(args.seed)
        s = sampling.generate(encode_prompts(tok, problems, cfg.model.chat_template), args.k, 1.0, top_p, gen).cpu()
        rep = [p for p in problems for _ in range(args.k)]
        _, correct, texts = scorer(s, rep)
        lengths = s.lengths.tolist()
        by = lambda xs: [xs[i * args.k:(i + 1) * args.k] for i in range(len(problems))]
        table = summarize(task, problems, by(texts), by(lengths))
        per_stratum_lengths = defaultdict(list)
        by_fraction = defaultdict(lambda: [0, 0])
        for p, text, n, ok in zip(rep, texts, lengths, correct.tolist()):
            per_stratum_lengths[task.stratum(p)].append(n)
            per_stratum_lengths["all"].append(n)
            mode, worked = task.classify(text, p)
            frac = worked / p.meta["n_digits"]
            bucket = "0" if mode == "direct" else "full" if mode == "full" else (
                "<1/2" if frac < 0.5 else ">=1/2")
            for key in (f"{task.stratum(p)}|{bucket}", f"all|{bucket}"):
                by_fraction[key][0] += int(ok)
                by_fraction[key][1] += 1
        # what the guess would give with a perfect scratchpad: the share of problems whose direct answer is right
        direct_ok = defaultdict(list)
        for p in problems:
            direct_ok[task.stratum(p)].append(task.min_columns(p) == 0)
            direct_ok["all"].append(task.min_columns(p) == 0)
        out[f"top_p={top_p}"] = {
            "table": table,
            "lengths": {k: _percentiles(v) for k, v in per_stratum_lengths.items()},
            "acc_by_worked_fraction": {k: {"acc": v[0] / v[1], "n": v[1]} for k, v in sorted(by_fraction.items())},
            "truncated": float(s.truncated.float().mean()),
        }
        out["direct_answer_right_share"] = {k: sum(v) / len(v) for k, v in direct_ok.items()}
        out["problems_per_stratum"] = {k: len(v) for k, v in direct_ok.items()}
        print(f"== top_p {top_p}")
        for key, row in table.items():
            print(f"{key:8s} acc {100 * row['acc']:5.1f}  len {row['length']:6.1f}  "
                  + "  ".join(f"{m} {100 * row.get('share_' + m, 0):4.1f}%/{100 * row.get('acc_' + m, float('nan')):5.1f}"
                              for m in ("direct", "partial", "full", "other")))
        print({k: v for k, v in out[f"top_p={top_p}"]["lengths"].items()})
        print({k: (round(100 * v["acc"], 1), v["n"]) for k, v in out[f"top_p={top_p}"]["acc_by_worked_fraction"].items()})
    Path(args.out).write_text(json.dumps(out, indent=1))


def critic(args):
    from vapo_lab.trainer.advantages import compute_advantages
    from vapo_lab.trainer.collect import collect
    from vapo_lab.trainer.trainer import Trainer

    cfg = _cfg(args.algo, args.drop, [f"output_dir={args.runs}", *args.overrides])
    tr = Trainer(cfg, log=print)
    rows = []
    for _ in range(args.batches):
        batch, _ = collect(cfg, tr.sampling, tr.data, tr.scorer, tr.gen_rollout, tr.world)
        tr._model_outputs(batch)
        compute_advantages(cfg, batch, tr.world)
        texts = [tr.tokenizer.decode(ids[:n].tolist(), skip_special_tokens=True)
                 for ids, n in zip(batch.rows.response_ids, batch.lengths.tolist())]
        for i, (p, text) in enumerate(zip(batch.problems, texts)):
            n = int(batch.lengths[i])
            mode, worked = tr.task.classify(text, p)
            v, g, a = batch.values[i, :n], batch.mc_returns[i, :n], batch.advantages[i, :n]
            rows.append({"mode": mode, "stratum": tr.task.stratum(p), "reward": float(batch.scores[i]),
                         "length": n, "v0": float(v[0]), "v1": float(v[1]) if n > 1 else float("nan"),
                         "bias_all": float((v - g).mean()), "bias_first8": float((v[:8] - g[:8]).mean()),
                         "bias_last": float(v[-1] - g[-1]),
                         "adv0": float(a[0]), "adv_mean": float(a.mean()),
                         "lam": float(batch.lam_policy[i]) if batch.lam_policy is not None else None})
    summary = {}
    for key in ["all", "direct", "partial", "full", "other"]:
        sel = [r for r in rows if key == "all" or r["mode"] == key]
        if not sel:
            continue
        mean = lambda f: round(statistics.fmean(r[f] for r in sel if r[f] == r[f]), 4)
        summary[key] = {"n": len(sel), **{f: mean(f) for f in ("reward", "length", "v0", "v1", "bias_all",
                                                               "bias_first8", "bias_last", "adv0", "adv_mean")}}
        print(key, summary[key])
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows,
                                          "critic_init": cfg.critic.init,
                                          "pretrain": bool(cfg.critic.pretrain.enabled)}, indent=1))


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
