"""`Bundle`: a compiled program as data, and the format's name and the version saves write.

A bundle is manifest.json, shaders.json (every shader: an object of shader file name -> GLSL
source), weights.safetensors and program.json. Format version 4 stores each file but the manifest
under a name carrying its sha256; version 3, still loaded, under those plain names; versions 1
and 2 kept each shader in a file of its own under shaders/ (docs/bundle-format.md).
`Bundle.save` writes one and `load_bundle` reads one back, validating it (glcomp.format.store).
Nothing in a bundle is ever executed as Python. This module is the one home of `Bundle`: the
code generator builds them, the runtimes and `glcomp.load` read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format.manifest import FORMAT

VERSION = 4  # the format saves write (glcomp.format.store.write_bundle)

__all__ = ["FORMAT", "VERSION", "Bundle", "load_bundle"]


@dataclass
class Bundle:
    """A bundle in memory: its manifest (without ``files``), shaders, weights and program.json."""

    manifest: dict[str, Any]
    shaders: dict[str, str]  # shader file name (a key of shaders.json) -> source
    weights: dict[str, np.ndarray]
    # program.json: the IR graphs and what `glcomp.load` needs to rebuild the Program (plain
    # JSON data, see Program.to_json); None for bundles built by hand.
    program: dict[str, Any] | None = None

    def save(self, directory: str | Path) -> Path:
        """Write the bundle to `directory` atomically and in place (see
        glcomp.format.store.write_bundle, docs/saving.md): a bundle already there is replaced
        as a whole by one rename of its manifest, the directory itself and the other files in it
        are never touched, and a failed or killed save leaves the previous bundle as it was.
        Returns the directory."""
        from glcomp.format.store import write_bundle

        return write_bundle(self, Path(directory))

    def with_state(self, weights: dict[str, Any], lr: float) -> Bundle:
        """The same bundle holding other state: `weights` must hold every state and counter
        of this bundle in its shape (extra names are an error); `lr` is the learning rate."""
        states, counters = self.manifest["states"], self.manifest["counters"]
        want = {k: tuple(st["layout"]["shape"]) for k, st in states.items()} | {k: () for k in counters}
        if set(weights) != set(want):
            raise GlcompError(
                f"bundle state: missing {sorted(set(want) - set(weights))}, "
                f"unexpected {sorted(set(weights) - set(want))}"
            )
        new: dict[str, np.ndarray] = {}
        for k, shape in want.items():
            value = np.asarray(weights[k])
            if value.shape != shape:
                raise GlcompError(f"bundle state: {k!r} has shape {value.shape}, expected {shape}")
            new[k] = value.astype(np.int64 if k in counters else np.float32)
        manifest = dict(self.manifest)
        manifest["hyper"] = {**self.manifest["hyper"], "lr": float(lr)}
        manifest["counters"] = {k: int(new[k]) for k in counters}
        return Bundle(manifest, dict(self.shaders), new, self.program)


def load_bundle(directory: str | Path) -> Bundle:
    """Read and validate a bundle directory; raises GlcompError naming the fault."""
    from glcomp.format.store import read_bundle

    return read_bundle(Path(directory))
