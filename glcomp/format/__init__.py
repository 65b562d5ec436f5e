"""The bundle format, shared by the code generator and every runtime (it imports no part of
either): `Bundle` and the format's version (format.bundle), reading and writing bundle
directories (format.store), the manifest's JSON Schema and validation (format.manifest), the
program.json schema and checks (format.program), whether program.json describes the shaders
(format.agreement), untrusted shaders (format.shaders), JSON and
safetensors parsing (format.parse), the packing rule (format.packing) and the small JSON Schema
interpreter that both this package and the browser runtime use (format.jsonschema). See
docs/bundle-format.md."""

from glcomp.format.jsonschema import Validator, state_name_ok
from glcomp.format.manifest import (
    DEFAULT_ENTRY_BUDGET,
    DEFAULT_LOOP_BUDGET,
    DEFAULT_TEXTURE_BUDGET,
    EXACT_FORMATS,
    FORMAT,
    MAX_SIDE,
    PROGRAM_FILE,
    TEXEL_BYTES,
    VERSIONS,
    check_layout,
    manifest_schema,
    stored_name,
    texel_bytes,
    texel_span,
    texture_bytes,
    texture_format,
    validate_manifest,
)

__all__ = [
    "DEFAULT_ENTRY_BUDGET",
    "DEFAULT_LOOP_BUDGET",
    "DEFAULT_TEXTURE_BUDGET",
    "EXACT_FORMATS",
    "FORMAT",
    "MAX_SIDE",
    "PROGRAM_FILE",
    "TEXEL_BYTES",
    "VERSIONS",
    "Validator",
    "check_layout",
    "manifest_schema",
    "state_name_ok",
    "stored_name",
    "texel_bytes",
    "texel_span",
    "texture_bytes",
    "texture_format",
    "validate_manifest",
]
