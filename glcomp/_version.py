"""glcomp's version, in this one place: pyproject.toml reads it (``[tool.setuptools.dynamic]``),
``glcomp.__version__`` is it, and the browser runtime's npm package (packages/glcomp-js) must
carry the same (tests/test_package.py checks)."""

__version__ = "0.1.0"
