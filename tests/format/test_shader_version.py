"""Every shader of a bundle begins with its target's #version (glcomp.format.shaders.check_shaders;
glcomp.js's checkShaders the same): an emptied fragment shader in shaders.json, stored again under
its new sha256, loaded before (tests/format/test_bundle_fuzz.py found it)."""

from __future__ import annotations

import pytest

import glcomp
from glcomp import nn
from glcomp.errors import GlcompError
from glcomp.format.shaders import check_shaders


@pytest.mark.parametrize("target", ["webgl1", "webgl2"])
def test_a_shader_must_begin_with_the_targets_version(target: str) -> None:
    bundle = glcomp.compile(nn.Linear(3, 2), {"x": (2, 3)}, target=target).bundle()
    manifest, shaders = bundle.manifest, dict(bundle.shaders)
    check_shaders(manifest, shaders)  # as generated
    frag = next(iter(manifest["programs"].values()))["fragment"]
    other = "300 es" if target == "webgl1" else "100"
    for bad in ("", shaders[frag].replace(manifest["target"]["glsl_version"], other, 1), " " + shaders[frag]):
        with pytest.raises(GlcompError, match=rf"{frag}\]: must begin with #version"):
            check_shaders(manifest, shaders | {frag: bad})
