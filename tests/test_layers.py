"""The layering of pyproject.toml's import contracts holds (CI also runs `lint-imports`)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter is not installed (the dev extra)")
def test_import_contracts_are_kept():
    done = subprocess.run(["lint-imports", "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout
