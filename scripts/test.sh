#!/usr/bin/env bash
# Installs everything, then runs lint and the test suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# PyTorch is an optional cross-check (tests/test_torch_parity.py), never a runtime dependency.
python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m ruff check glcomp tests examples benchmarks
python3 -m ruff format --check glcomp tests examples benchmarks
# Tests run on every core (pytest-xdist); `--slow` runs the fuzzers with their large budget.
python3 -m pytest -q -p no:cacheprovider -n auto "$@"
