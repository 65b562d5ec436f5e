#!/usr/bin/env bash
# Installs everything, then runs lint and the test suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m ruff check glcomp tests examples benchmarks
python3 -m ruff format --check glcomp tests examples benchmarks
python3 -m pytest -q -p no:cacheprovider "$@"
