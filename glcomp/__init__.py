"""glcomp: compile neural networks into GLSL ES shaders that train them on any WebGL GPU.

Front-end -> IR -> passes -> kernel plan -> GLSL -> bundle -> runtime.
"""

import os

from glcomp import (
    ir,  # noqa: F401  (populates the op registry)
    nn,
    onnx,  # ONNX import: the onnx package itself is imported only by glcomp.onnx.load
    optim,
)
from glcomp._version import __version__ as __version__  # the one place (pyproject reads it too)
from glcomp.compiler import compile, trace
from glcomp.errors import GlcompError
from glcomp.functions import (
    abs,
    arange,
    argmax,
    bmm,
    chunk,
    clamp,
    clip,
    cuda,
    device,
    double,
    erf,
    exp,
    flatten,
    float32,
    float64,
    full,
    full_like,
    int32,
    int64,
    log,
    log_softmax,
    long,
    masked_fill,
    matmul,
    mean,
    no_grad,
    ones,
    ones_like,
    pow,
    rand,
    rand_like,
    randn,
    randn_like,
    relu,
    reshape,
    sigmoid,
    softmax,
    split,
    sqrt,
    squeeze,
    sum,
    tanh,
    transpose,
    tril,
    triu,
    unsqueeze,
    zeros,
    zeros_like,
)
from glcomp.ir.graph import Graph
from glcomp.ir.tensor import MinMax, Tensor, cat, maximum, minimum, stack, where
from glcomp.nn.init import manual_seed
from glcomp.program import Program
from glcomp.variants import VariantSet, compile_variants, load_variants


def load(directory: "str | os.PathLike[str]") -> Program:
    """Load a saved bundle directory as a Program, as `glcomp.compile` returns it, starting from
    the saved state (weights, buffers, optimizer state, step counters, learning rate):
    ``glcomp.load(d).runtime("gl")`` runs the loaded shaders without compiling again, and
    ``.runtime("reference")`` the saved IR graphs. The bundle is validated first (GlcompError
    naming the file at fault); nothing in it is executed and no symbolic link in it is followed."""
    from glcomp.format.bundle import load_bundle

    return Program.from_bundle(load_bundle(directory))


__all__ = [
    "GlcompError",
    "Graph",
    "MinMax",
    "Program",
    "Tensor",
    "VariantSet",
    "abs",
    "arange",
    "argmax",
    "bmm",
    "cat",
    "chunk",
    "clamp",
    "clip",
    "compile",
    "compile_variants",
    "cuda",
    "device",
    "double",
    "erf",
    "exp",
    "flatten",
    "float32",
    "float64",
    "full",
    "full_like",
    "int32",
    "int64",
    "load",
    "load_variants",
    "log",
    "log_softmax",
    "long",
    "manual_seed",
    "masked_fill",
    "matmul",
    "maximum",
    "mean",
    "minimum",
    "nn",
    "no_grad",
    "ones",
    "ones_like",
    "onnx",
    "optim",
    "pow",
    "rand",
    "rand_like",
    "randn",
    "randn_like",
    "relu",
    "reshape",
    "sigmoid",
    "softmax",
    "split",
    "sqrt",
    "squeeze",
    "stack",
    "sum",
    "tanh",
    "trace",
    "transpose",
    "tril",
    "triu",
    "unsqueeze",
    "where",
    "zeros",
    "zeros_like",
]
