#!/usr/bin/env bash
# The pip-install route, as a user takes it: build the sdist from the tracked sources, build the
# wheel from that sdist (so the sdist is known to be complete), install the wheel (not editable)
# into a fresh virtual environment and run a compile + train step on both runtimes, the
# `glcomp` command and one browser-free example from outside the repository.
# No network: the wheel is installed with --no-deps into a venv made with
# --system-site-packages, which sees the dependencies already installed here (numpy, moderngl,
# ...); the check below makes sure `import glcomp` is the wheel's copy, not the editable one.
# Then scripts/test_npm.sh checks the browser runtime's npm package (npm pack, TypeScript).
# Opt-outs: GLCOMP_WHEEL_EXAMPLE=0 (no example training), GLCOMP_NPM_TEST=0 (no npm package).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/glcomp-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS

# 1. sdist from the files git tracks or would (a copy: the build writes egg-info and build/ where it runs).
mkdir -p "$work/src" "$work/dist"
git ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 cp --parents -t "$work/src")
(cd "$work/src" && "$python" -c 'import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))' "$work/dist") >"$work/sdist.log" 2>&1 || { cat "$work/sdist.log"; exit 1; }
sdist=$(ls "$work"/dist/glcomp-*.tar.gz)

# 2. the wheel from the unpacked sdist.
mkdir -p "$work/from-sdist"
tar -xzf "$sdist" -C "$work/from-sdist"
(cd "$work"/from-sdist/glcomp-* && "$python" -c 'import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))' "$work/dist") >"$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; exit 1; }
wheel=$(ls "$work"/dist/glcomp-*.whl)
echo "built $(basename "$sdist") and $(basename "$wheel") in $((SECONDS - start)) s"

# 3. a fresh venv, the wheel installed without its dependencies (they come from the system).
"$python" -m venv --system-site-packages --without-pip "$work/venv"
"$python" -m pip --python "$work/venv/bin/python" install -q --disable-pip-version-check --no-deps --no-index "$wheel" 2>/dev/null ||
  { "$python" -m venv --system-site-packages "$work/venv" && "$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-index "$wheel"; }
echo "installed into a fresh venv at $((SECONDS - start)) s"

# 4. from outside the repository: the installed copy, its data files, the quick start.
mkdir -p "$work/run"
cp examples/digits_cnn.py "$work/run/"
cd "$work/run"
(cd "$repo" && git ls-files --cached --others --exclude-standard glcomp) >"$work/tracked"
"$work/venv/bin/python" - "$work/venv" "$work/tracked" <<'PY'
import importlib.metadata
import pathlib
import sys

import numpy as np

import glcomp
from glcomp import nn, optim

venv = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(glcomp.__file__).resolve()
assert venv in where.parents, f"imported {where}, not the wheel installed in {venv}"
root = where.parent
assert glcomp.__version__ == importlib.metadata.version("glcomp"), glcomp.__version__
assert (root / "py.typed").is_file(), "py.typed is missing"
for data in ("runtime/js/glcomp.js", "pages/demo.html", "format/manifest.schema.json"):
    assert (root / data).is_file(), f"{data} is missing from the wheel"
assert list((root / "codegen" / "families").glob("*.j2")), "the GLSL templates are missing"
# Every module and data file of the source tree (the runtime's modules and pages, the schemas,
# the templates, every subpackage) is in the installed copy.
tracked = pathlib.Path(sys.argv[2]).read_text().splitlines()
missing = [f for f in tracked if "__pycache__" not in f and not (root.parent / f).is_file()]
assert not missing, f"missing from the wheel: {missing}"
import glcomp.transforms  # noqa: E402,F401  (a subpackage, imported from the wheel)

# The README's quick start, smaller.
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
prog = glcomp.compile(model, {"x": (8, 16)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2))
rng = np.random.default_rng(0)
x, y = rng.random((8, 16), dtype=np.float32), rng.integers(0, 4, 8)
ref, gl = prog.runtime("reference"), prog.runtime("gl")
assert np.abs(gl.predict(x=x) - ref.predict(x=x)).max() < 1e-4
losses = [gl.train_step(x=x, y=y) for _ in range(30)]
assert losses[-1] < losses[0], losses
gl.save("ckpt")
again = glcomp.load("ckpt").runtime("gl")
np.testing.assert_allclose(again.predict(x=x), gl.predict(x=x), rtol=1e-5, atol=1e-6)
gl.save_weights("weights.safetensors")
print(f"glcomp {glcomp.__version__} from {root}: loss {losses[0]:.3f} -> {losses[-1]:.3f} on {gl.info()['renderer']}")
PY
"$work/venv/bin/glcomp" --version
# One browser-free example, as the README's quick start runs it (a few steps; GLCOMP_WHEEL_EXAMPLE=0
# leaves it out).
if [ "${GLCOMP_WHEEL_EXAMPLE:-1}" = 1 ]; then
  "$work/venv/bin/glcomp" train digits_cnn.py --steps 5 --out digits >"$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
  test -f digits/weights.safetensors && test -f digits/bundle/manifest.json
  echo "glcomp train digits_cnn.py from outside the repository: $(grep -m1 -o 'test accuracy: [0-9.]*%' "$work/train.log")"
fi
echo "wheel test passed in $((SECONDS - start)) s"
# The browser runtime's npm package: declarations, npm pack, install, import (GLCOMP_NPM_TEST=0 skips).
if [ "${GLCOMP_NPM_TEST:-1}" = 1 ]; then
  t=$SECONDS
  bash "$repo/scripts/test_npm.sh"
  echo "npm package test passed in $((SECONDS - t)) s"
fi
