"""Every shader the code generator emits for the test models is valid GLSL ES, checked by Khronos'
reference compiler (glslangValidator) rather than by the Mesa driver the GL tests run on: Mesa
accepts some things (a blank line before ``#version 300 es``, for one) that WebGL rejects.

glslangValidator picks GLSL ES from the ``#version`` line and the stage from the file extension.
It does not know WebGL 1's GL_EXT_draw_buffers, so that one line is blanked out before
validation; that such shaders declare the extension is checked here instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from glcomp import optim
from glcomp.codegen.bundle import build_bundle

VALIDATOR = "glslangValidator"
VARIANTS = ("default", "shrunk")  # shrunk: tensors split into texture pages, loops into nested loops
DRAW_BUFFERS = "#extension GL_EXT_draw_buffers : require"


@pytest.fixture(scope="session")
def validator() -> str:
    path = shutil.which(VALIDATOR)
    if path is None:
        pytest.fail(
            f"{VALIDATOR} is not installed: install glslang-tools (apt-get install glslang-tools), "
            "as CI does; the GLSL validation tests fail rather than skip without it",
            pytrace=False,
        )
    return path


def validate(validator: str, *paths: Path) -> tuple[int, str]:
    """Run glslangValidator on the files (each compiled on its own); exit code and output."""
    done = subprocess.run([validator, *map(str, paths)], capture_output=True, text=True, timeout=120)
    return done.returncode, (done.stdout + done.stderr).strip()


def check_dialect(name: str, source: str, dialect: str) -> list[str]:
    """Dialect rules glslangValidator cannot see on its own (it only knows what #version says)."""
    problems = []
    first = source.split("\n", 1)[0]
    code = re.sub(r"//[^\n]*", "", source)  # comments may mention anything
    want = "#version 300 es" if dialect == "webgl2" else "#version 100"
    if first != want:  # GLSL ES 3.00 requires #version on the very first line
        problems.append(f"{name}: first line is {first!r}, expected {want!r}")
    if dialect == "webgl1":
        for bad in (r"\btexelFetch\b", r"\blayout\s*\(", r"\btexture\s*\(", r"^\s*(in|out)\s"):
            if re.search(bad, code, re.MULTILINE):
                problems.append(f"{name}: GLSL ES 3.00 construct /{bad}/ in a WebGL 1 shader")
        writes_mrt = re.search(r"gl_FragData\[[1-9]", code) is not None
        if writes_mrt and DRAW_BUFFERS not in source:
            problems.append(f"{name}: writes several gl_FragData outputs without {DRAW_BUFFERS}")
    elif re.search(r"\b(gl_FragColor|gl_FragData|texture2D|attribute|varying)\b", code):
        problems.append(f"{name}: GLSL ES 1.00 construct in a WebGL 2 shader")
    return problems


def shader_files(bundle: Any, directory: Path) -> list[tuple[str, Path]]:
    """Write each shader of the bundle to `directory` under its own name (.frag / .vert)."""
    files = []
    for name, source in sorted(bundle.shaders.items()):
        assert name.endswith((".frag", ".vert")), name
        text = source.replace(DRAW_BUFFERS, "// " + DRAW_BUFFERS[1:])  # unknown to glslang; same lines
        path = directory / name
        path.write_text(text)
        files.append((name, path))
    return files


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_shaders_pass_glslang(
    validator: str, model_case: Any, dialect: str, variant: str, tmp_path: Path
):
    limits = model_case.shrunk if variant == "shrunk" else {}
    prog = model_case.compile(dialect, optim.Adam(lr=1e-2), **limits)
    bundle = build_bundle(prog)
    assert set(bundle.manifest["entries"]) == {"predict", "gradients", "train_step"}
    names = {p["fragment"] for p in bundle.manifest["programs"].values()} | {bundle.manifest["vertex_shader"]}
    assert names <= set(bundle.shaders)
    failures = []
    for name, source in sorted(bundle.shaders.items()):
        failures += check_dialect(name, source, dialect)
    files = shader_files(bundle, tmp_path)
    code, output = validate(validator, *(path for _, path in files))
    for name, path in files if code != 0 else []:  # one call for all; one per file to report
        code, output = validate(validator, path)
        if code != 0:
            numbered = "\n".join(
                f"{i + 1:4d}  {line}" for i, line in enumerate(path.read_text().splitlines())
            )
            failures.append(f"{name} (exit code {code}):\n{output}\n--- source ---\n{numbered}")
    assert not failures, f"{len(failures)} shader problem(s):\n\n" + "\n\n".join(failures)


def test_shrunk_limits_reach_split_code(model_case: Any):
    """The shrunk variant above really validates paged fetches and split loops."""
    prog = model_case.compile("webgl1", optim.Adam(lr=1e-2), **model_case.shrunk)
    bundle = build_bundle(prog)
    sources = "\n".join(bundle.shaders.values())
    assert re.search(r"for \(int \w+_o = 0;", sources), "no loop was split into nested loops"
    draws = [d for e in bundle.manifest["entries"].values() for d in e["draws"]]
    assert any(d["page_offset"] > 0 for d in draws), "no tensor was split into texture pages"


def test_validator_rejects_bad_shaders(validator: str, tmp_path: Path):
    """The check above can fail: glslangValidator reports errors with a non-zero exit code."""
    es3 = "#version 300 es\nprecision highp float;\nout vec4 o;\nvoid main() { o = vec4(1.0); }\n"
    cases = {
        "late_version.frag": "\n" + es3,
        "undeclared.frag": "#version 100\nprecision highp float;\nvoid main() { gl_FragColor = vec4(x); }\n",
        "es3_in_es1.frag": "#version 100\nprecision highp float;\nuniform sampler2D s;\n"
        "void main() { gl_FragColor = texelFetch(s, ivec2(0), 0); }\n",
    }
    for name, source in cases.items():
        path = tmp_path / name
        path.write_text(source)
        code, output = validate(validator, path)
        assert code != 0, f"{name} was accepted:\n{output}"
    good = tmp_path / "good.frag"
    good.write_text(es3)
    assert validate(validator, good)[0] == 0
