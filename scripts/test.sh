#!/usr/bin/env bash
# Installs everything, then runs lint and the test suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# PyTorch is an optional cross-check (tests/nn/test_torch_parity.py), never a runtime dependency.
python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m ruff check glcomp tests examples benchmarks
python3 -m ruff format --check glcomp tests examples benchmarks
# The browser runtime's lint: ESLint pinned in package.json / package-lock.json (eslint.config.js).
npm ci --no-audit --no-fund --loglevel=error
npx --no-install eslint glcomp/runtime/js glcomp/pages benchmarks/peers/*.js
[ "${GLCOMP_SKIP_WHEEL_TEST:-}" = 1 ] || bash scripts/test_wheel.sh  # sdist -> wheel -> fresh venv -> train, ~30-60 s
# Tests run on every core (pytest-xdist); `--slow` runs the fuzzers with their large budget, the
# heavier `slow_only` cases and llvmpipe's fully optimized shaders (tests/conftest.py).
python3 -m pytest -q -p no:cacheprovider -n auto "$@"
