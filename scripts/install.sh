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
# A distribution's own Python (Debian 12) marks itself externally managed; glcomp's
# dependencies are plain wheels, so install beside the system packages there.
if python3 -c 'import sys, sysconfig, pathlib; sys.exit(not (pathlib.Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists())'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
python3 -m pip --version >/dev/null 2>&1 || { apt-get install -y -qq python3-pip >/dev/null; }
python3 -m pip install -q --disable-pip-version-check -e ".[test,examples,browser]"
