"""Tests for the commit a run records (``trainer.record.git_commit``): a checkout's HEAD, and in a
`git archive` copy (a pinned grid's code, no .git) the commit git wrote into vapo_lab/COMMIT."""

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from vapo_lab.trainer.record import PACKAGE, git_commit

REPO = PACKAGE.parent


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


needs_checkout = pytest.mark.skipif(
    not (REPO / ".git").exists(), reason="needs vapo-lab's git checkout"
)


@needs_checkout
def test_a_checkout_records_its_head():
    assert git_commit() == git("rev-parse", "HEAD")


@needs_checkout
def test_an_archived_copy_inside_another_repository_records_the_archived_commit(tmp_path):
    head = git("rev-parse", "HEAD")
    git("init", "-q", cwd=tmp_path)  # the copy sits in a repository that is not vapo-lab's
    archive = tmp_path / "src.tar"
    git("archive", "-o", str(archive), "HEAD", "vapo_lab")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "copy", filter="data")
    assert (tmp_path / "copy/vapo_lab/COMMIT").read_text().strip() == head
    recorded = subprocess.run(
        [
            sys.executable,
            "-c",
            "from vapo_lab.trainer.record import git_commit; print(git_commit())",
        ],
        cwd=tmp_path / "copy",
        env={"PYTHONPATH": str(tmp_path / "copy"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert recorded == head


def test_a_copy_without_either_records_unknown(tmp_path, monkeypatch):
    import vapo_lab.trainer.record as record

    monkeypatch.setattr(record, "PACKAGE", tmp_path / "vapo_lab")
    monkeypatch.setattr(record, "COMMIT_FILE", tmp_path / "vapo_lab/COMMIT")
    (tmp_path / "vapo_lab").mkdir()
    (tmp_path / "vapo_lab/COMMIT").write_text("$Format:%H$\n")  # a checkout: unexpanded by git
    assert record.git_commit() == "unknown"


def test_the_machine_names_the_cpu_its_kernels_and_the_versions():
    import platform

    import torch

    from vapo_lab.trainer.record import machine

    said = machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next(
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        )
        assert said.startswith(f"{model} (")
    assert f"({torch.backends.cpu.get_cpu_capability()})" in said
    assert said.endswith(f"torch {torch.__version__}, python {platform.python_version()}")


def test_a_run_records_its_machine_and_a_resumed_run_where_it_went_on(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    import vapo_lab.trainer.record as record
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [
        "run_name=r",
        f"output_dir={tmp_path / 'runs'}",
        "tracking=mlflow",
        f"tracking.uri={store}",
        f"tracking.spool_dir={tmp_path / 'spool'}",
    ]
    cfg = typed(compose_config(overrides=overrides).cfg)
    here = record.machine()
    first = record.RunRecord(cfg, {}, None, "test", None, None, log=print)
    first.open()
    first.close_on_error(KeyboardInterrupt(), 3)
    monkeypatch.setattr(record, "machine", lambda: "another CPU (AVX2), torch x, python y")
    again = record.RunRecord(cfg, {}, first.run_dir, "test", None, None, log=print)
    again.close("FINISHED", 5)
    assert again.run_id == first.run_id
    tags = MlflowClient(store).get_run(first.run_id).data.tags
    assert tags["machine"] == here  # the tag it started with stays
    assert tags["machine.resumed"] == "another CPU (AVX2), torch x, python y"
