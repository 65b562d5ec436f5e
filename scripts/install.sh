#!/usr/bin/env bash
# Installs glcomp and what its tests need: Mesa's software OpenGL (EGL, llvmpipe) for the GL
# runtime, glslang for shader validation, Chromium for the browser runtime, then the package.
set -euo pipefail
need=()
for pkg in libegl1 libegl-mesa0 libgl1-mesa-dri libgles2 glslang-tools chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -e ".[test,examples,browser]"
