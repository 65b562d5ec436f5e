"""Moved: the bundle format (reading, writing, shader checks, weights) lives in glcomp.format
(glcomp.format.store, .parse, .shaders, .manifest). This module re-exports its public names for
callers that still import them from here; the code generator itself imports none of them."""

from glcomp.format.manifest import *  # noqa: F403
from glcomp.format.manifest import PROGRAM_FILE, SHADERS_FILE, WEIGHTS_FILE, packed_shaders, shader_path  # noqa: F401
from glcomp.format.parse import *  # noqa: F403
from glcomp.format.shaders import *  # noqa: F403
from glcomp.format.store import *  # noqa: F403
