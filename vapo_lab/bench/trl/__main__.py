"""Benchmarks one RL step through vapo-lab's trainer and through TRL, on CPU, interleaved.

``python -m vapo_lab.bench.trl`` runs it and prints its report, as ``vapo-lab bench trl`` does.
The driver also starts every worker by running this file by path with ``--worker KIND``: a TRL
env's interpreter, where vapo-lab is not installed, cannot run it by module name. So this file
imports nothing of vapo-lab before :func:`_import_vapo_lab` has made the package importable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def _drop_own_folder_from_path() -> None:
    """Takes this file's folder off sys.path, where Python put it first when running it by path.

    There, this package's modules (spec.py, run.py, ...) would be importable as top-level modules
    and could shadow installed ones of the same names in TRL or its dependencies.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def _import_vapo_lab() -> None:
    """Makes ``vapo_lab`` importable: installed in the main env; loaded from this tree in a TRL env.

    The package is loaded by file location, without putting the tree (or the main env) on
    sys.path, so a TRL env sees only its own packages.
    """
    if "vapo_lab" in sys.modules:
        return
    try:
        import vapo_lab  # noqa: F401
    except ImportError:
        package_dir = Path(__file__).resolve().parents[2]
        spec = importlib.util.spec_from_file_location(
            "vapo_lab", package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["vapo_lab"] = module
        spec.loader.exec_module(module)


def _worker_main(kind: str, model_dir: str, workdir: str, spec_json: str) -> None:
    """Runs the worker of ``kind`` until the driver stops it.

    The channel is opened before the side's module is imported, so that nothing the libraries
    print while loading can reach the pipe; our side needs the main env, so it is imported here.
    """
    from vapo_lab.bench.trl.protocol import Channel
    from vapo_lab.bench.trl.spec import BenchSpec

    spec = BenchSpec(**json.loads(spec_json))
    if kind.startswith("ours-"):
        channel = Channel()
        from vapo_lab.bench.trl.ours import serve_ours

        serve_ours(channel, kind.removeprefix("ours-"), model_dir, spec, workdir)
    elif kind.removesuffix("-nogc") in ("trl-ppo", "trl-grpo"):
        channel = Channel()
        from vapo_lab.bench.trl.theirs import serve_trl_grpo, serve_trl_ppo

        serve = serve_trl_ppo if kind.startswith("trl-ppo") else serve_trl_grpo
        serve(channel, model_dir, spec, workdir, gc_off=kind.endswith("-nogc"))
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark and prints its report (``python -m vapo_lab.bench.trl``), or a worker."""
    from vapo_lab.bench.trl.envs import ENVS, setup_trl_envs
    from vapo_lab.bench.trl.spec import BenchSpec

    parser = argparse.ArgumentParser(
        prog="python -m vapo_lab.bench.trl", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=BenchSpec.threads)
    parser.add_argument("--part", action="append", choices=sorted(ENVS))
    parser.add_argument("--trl-python")
    parser.add_argument("--trl-grpo-python")
    parser.add_argument("--setup", action="store_true")
    parser.add_argument("--worker")
    parser.add_argument("--model")
    parser.add_argument("--workdir")
    parser.add_argument("--spec")
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker, args.model, args.workdir, args.spec)
        return
    parts = args.part or ["ppo", "grpo"]

    def progress(text: str) -> None:
        print(text, file=sys.stderr)

    if args.setup:
        setup_trl_envs(parts, log=progress)
        return
    from vapo_lab.bench.trl.run import format_trl_benchmark, run_trl_benchmark

    result = run_trl_benchmark(
        steps=args.steps,
        warmup=args.warmup,
        parts=parts,
        trl_python=args.trl_python,
        trl_grpo_python=args.trl_grpo_python,
        spec=BenchSpec(threads=args.threads),
        log=progress,
    )
    print(format_trl_benchmark(result))


if __name__ == "__main__":
    _drop_own_folder_from_path()
    _import_vapo_lab()
    main()
