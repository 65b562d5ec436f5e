"""``python3 -m glcomp.format > glcomp/runtime/js/format/manifest_schema.js``: the browser runtime's copy
of the manifest schema."""

from glcomp.format.manifest import js_module

print(js_module(), end="")
