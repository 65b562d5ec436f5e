#!/usr/bin/env bash
# Installs glcomp and what its tests need: Mesa's software OpenGL (EGL, llvmpipe) for the GL
# runtime, glslang for shader validation, Chromium for the browser runtime, then the package.
set -euo pipefail
need=()
for pkg in libegl1 libegl-mesa0 libgl1-mesa-dri libgles2 glslang-tools chromium xvfb; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# Another apt or dpkg (unattended-upgrades on a fresh machine, say) may hold the dpkg lock: wait
# for it, at most GLCOMP_DPKG_WAIT seconds (default 120), instead of failing at once.
apt_get() {
  local deadline=$((SECONDS + ${GLCOMP_DPKG_WAIT:-120})) log status
  log=$(mktemp)
  while true; do
    status=0
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$((deadline > SECONDS ? deadline - SECONDS : 0))" "$@" 2>"$log" || status=$?
    if [ "$status" -eq 0 ] || ! grep -qiE "could not get lock|unable to acquire|is another process using it" "$log"; then
      cat "$log" >&2; rm -f "$log"; return "$status"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      cat "$log" >&2; rm -f "$log"
      echo "install.sh: the dpkg lock was still held after ${GLCOMP_DPKG_WAIT:-120} s (another apt-get or dpkg is running); try again when it has finished, or set GLCOMP_DPKG_WAIT" >&2
      return "$status"
    fi
    echo "install.sh: waiting for the dpkg lock (another apt-get or dpkg is running)..." >&2
    sleep "${GLCOMP_DPKG_POLL:-5}"
  done
}
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  apt_get update -qq
  apt_get install -y -qq "${need[@]}" >/dev/null
fi
# A distribution's own Python (Debian 12) marks itself externally managed; glcomp's
# dependencies are plain wheels, so install beside the system packages there.
if python3 -c 'import sys, sysconfig, pathlib; sys.exit(not (pathlib.Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists())'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
python3 -m pip --version >/dev/null 2>&1 || { SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"; apt_get install -y -qq python3-pip >/dev/null; }
python3 -m pip install -q --disable-pip-version-check -e ".[test,examples,browser,federated]"
