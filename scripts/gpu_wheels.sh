#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh installs on a lent GPU machine. Its image has Python 3.12,
# PyTorch, transformers, numpy, scipy, pyarrow and rich, but not pydantic, which dots/config.py
# validates params with, and nothing can be installed there from an index. Run this here (PyPI
# reachable), then name the folder in the device call's carry: carry [".gpu_wheels"].
#   bash scripts/gpu_wheels.sh        (about 3 MB: pydantic at this venv's version and what it needs)
# The rest of what the image lacks (MLflow, Prefect, DVC, boto3, math-verify, datasets) the
# check does not import: tests/test_gpu_check.py runs its commands with those blocked.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
VERSION=$($PY -c "import pydantic; print(pydantic.VERSION)")
rm -rf .gpu_wheels
$PY -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu_wheels "pydantic==$VERSION"
ls .gpu_wheels
