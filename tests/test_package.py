"""The package as people install it: one version everywhere, PEP 561 type hints, every package
and data file in the wheel, scripts/install.sh waiting for the dpkg lock. (The wheel itself is
built, installed into a fresh venv and run from outside the repository by scripts/test_wheel.sh,
a step of scripts/test.sh.)"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import time
import tomllib
from pathlib import Path

import glcomp

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NPM = ROOT / "packages" / "glcomp-js" / "package.json"


def _tracked(under: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", under],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


def test_the_version_is_in_one_place() -> None:
    from glcomp import _version

    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "glcomp._version.__version__"}
    assert glcomp.__version__ == _version.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {glcomp.__version__}" in changelog, "CHANGELOG.md has no section for this version"
    if NPM.exists():
        assert json.loads(NPM.read_text())["version"] == glcomp.__version__


def test_type_hints_are_shipped() -> None:
    assert (ROOT / "glcomp" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["glcomp"]


def test_every_package_and_data_file_is_in_the_wheel_list() -> None:
    """A package missing from pyproject's explicit list (or a data file no package-data pattern
    matches) would be left out of the wheel, and an installed glcomp would fail to import it."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    packages = set(setuptools["packages"])
    data = setuptools["package-data"]
    files = _tracked("glcomp")
    for path in files:
        if "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        if path.suffix == ".py":
            assert package in packages, (
                f"{path.relative_to(ROOT)}: package {package} is not in pyproject.toml"
            )
        else:
            patterns = data.get(package, [])
            assert any(fnmatch.fnmatch(path.name, p) for p in patterns), (
                f"{path.relative_to(ROOT)} matches no package-data pattern of {package}"
            )


def _fake_bin(tmp_path: Path, apt_script: str) -> dict[str, str]:
    """A PATH where dpkg says nothing is installed, apt-get runs `apt_script`, and python3 (the
    pip step) does nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "dpkg": "exit 1",
        "apt-get": apt_script,
        "python3": "exit 0",
        "sudo": 'exec "$@"',
        "id": "echo 0",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "GLCOMP_DPKG_POLL": "0.1"}


LOCKED = (
    'echo "$@" >> "{log}"\n'
    'n=$(wc -l < "{log}")\n'
    'if [ "$n" -le {busy} ]; then\n'
    '  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2\n'
    "  exit 100\n"
    "fi\n"
    "exit 0"
)


def test_install_sh_waits_for_the_dpkg_lock(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    env = _fake_bin(tmp_path, LOCKED.format(log=log, busy=3))
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 5 and calls[3].endswith("update -qq") and " install " in calls[4], calls
    assert "waiting for the dpkg lock" in done.stderr


def test_install_sh_gives_up_on_the_dpkg_lock_after_its_bound(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    env = _fake_bin(tmp_path, LOCKED.format(log=log, busy=10**6)) | {"GLCOMP_DPKG_WAIT": "1"}
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 100
    assert time.monotonic() - start < 10
    assert "still held after 1 s" in done.stderr


def test_install_sh_does_not_retry_other_failures(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    env = _fake_bin(
        tmp_path, f'echo "$@" >> "{log}"; echo "E: Unable to locate package chromium" >&2; exit 100'
    )
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 100 and "Unable to locate package" in done.stderr
    assert len(log.read_text().splitlines()) == 1


def test_the_npm_package_describes_the_runtime() -> None:
    """packages/glcomp-js: a public package named glcomp whose `exports` give the declarations and
    the runtime that copy-runtime.mjs copies from glcomp/runtime/js (scripts/test_npm.sh packs,
    installs and type-checks it)."""
    pkg = json.loads(NPM.read_text())
    assert pkg["name"] == "glcomp" and not pkg.get("private") and pkg["type"] == "module"
    assert pkg["exports"]["."] == {
        "types": "./glcomp.d.ts",
        "import": "./dist/glcomp.js",
        "default": "./dist/glcomp.js",
    }
    assert pkg["types"] == "./glcomp.d.ts" and "glcomp.d.ts" in pkg["files"] and "dist/" in pkg["files"]
    assert pkg["scripts"]["prepack"] == "node copy-runtime.mjs"
    dts = (NPM.parent / "glcomp.d.ts").read_text()
    exported = (ROOT / "glcomp" / "runtime" / "js" / "glcomp.js").read_text()
    names = [n.strip() for block in exported.split("export {")[1:] for n in block.split("}")[0].split(",")]
    missing = [n for n in names if n and f"export class {n}" not in dts and f"export const {n}" not in dts
               and f"export function {n}" not in dts]  # fmt: skip
    assert not missing, f"glcomp.d.ts does not declare {missing}"
