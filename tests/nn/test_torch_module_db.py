"""torch's own module tests (``torch.testing._internal.common_modules.module_db``: 114 nn modules,
each with the sample constructor arguments and forward inputs torch tests it on) run through the
glcomp.nn counterpart of every module that has one, on the reference runtime.

For each sample: build torch's module and glcomp's from the same constructor arguments, copy the
torch module's parameters and buffers in (``load_state_dict``, strict), trace glcomp's with the
sample's forward inputs and compare the outputs with torch's (eval mode); for modules with
parameters and one output, also the gradients of sum(output * r) for a fixed random r. Each
sample either matches or is listed in `EXPECTED_FAILURES` with the GlcompError it must raise (a
configuration glcomp does not support): never a crash, never a wrong number. The modules without
a counterpart are `NOT_IN_GLCOMP`, checked against glcomp.nn so the list stays true."""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import glcomp
import glcomp.nn as gnn
from glcomp.errors import GlcompError

with warnings.catch_warnings():  # needs expecttest (the test extra pins it)
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_modules import module_db

RTOL, ATOL = 1e-4, 1e-5
# torch warns about its own fast paths (nested tensors) and deprecated sample arguments.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

# torch modules glcomp.nn has no class for (1-D/3-D variants, padding modules, rarer losses and
# normalisations, lazy modules, the full encoder-decoder Transformer).
NOT_IN_GLCOMP = frozenset(m.module_cls.__name__ for m in module_db) - set(dir(gnn))


def _samples() -> Iterator[tuple[str, Any, Any]]:
    torch.manual_seed(0)
    for info in module_db:
        name = info.module_cls.__name__
        if name in NOT_IN_GLCOMP:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            samples = info.module_inputs_func(
                info, device="cpu", dtype=torch.float32, requires_grad=False, training=False
            )
        for i, sample in enumerate(samples):
            yield f"{name}-{i}{'-' + sample.desc if sample.desc else ''}", info, sample


SAMPLES = {key: (info, sample) for key, info, sample in _samples()}

_UNBATCHED = r"input expected shape \(N, \w+, H, W\)"  # 2-D layers take batched (N, C, H, W) only
_NOT_NC = r"expects (input|logits) of shape \(N, C\)"  # losses over (N, C) scores only

# Samples of modules glcomp has, in configurations it refuses: a regular expression on the
# GlcompError each must raise, by sample name pattern (re.fullmatch).
EXPECTED_FAILURES: dict[str, str] = {
    r"(AdaptiveAvgPool2d-1|AvgPool2d-0|Conv2d-[23]|ConvTranspose2d-1)-no_batch_dim": _UNBATCHED,
    r"MaxPool2d-0-3d_input": _UNBATCHED,
    r"AvgPool2d-[456]-divisor.*": r"divisor_override other than torch's default",
    r"MaxPool2d-2-return_indices": r"return_indices other than torch's default",
    r"BatchNorm(1d-2|2d-1)-.*simple_average": r"momentum=None \(a cumulative average",
    r"BatchNorm(1d-6|2d-5)-zero_batch|LayerNorm-5-1d_empty.*": r"every dimension must be positive",
    # torch's sample inputs hold log(negative) = NaN (KLDivLoss takes log-probabilities)
    r"KLDivLoss-[0234678].*": r"holds NaN or infinite values",
    r"NLLLoss-\d+-(nd|higher_dim|3d)_(|reduction_sum|reduction_none|ignore_index)": _NOT_NC,
    r"NLLLoss-\d+-.*weights.*|CrossEntropyLoss-\d+-.*weights.*": r"class weights are not supported",
    r"BCELoss-[45]-.*weight.*": r"weight other than torch's default",
    r"BCEWithLogitsLoss-[45]-.*weights": r"weight and tensor pos_weight are not supported",
    r"CrossEntropyLoss-\d+-(4d|3d|higher_dim|no_batch_dim)_.*": _NOT_NC,
    r"CrossEntropyLoss-\d+-2d_prob_target_.*": r"cross_entropy target expected shape \(5,\)",  # probabilities
    r"Softmax-1-scalar|LogSoftmax-2-multiparam_scalar": r"reduction axis 0 out of range for shape \(\)",
}


def _mha_options(kw: dict[str, Any]) -> bool:
    same = (None, kw.get("embed_dim"))
    return (
        bool(kw.get("add_bias_kv") or kw.get("add_zero_attn"))
        or kw.get("kdim") not in same
        or kw.get("vdim") not in same
    )


# Constructor options glcomp refuses, by module: (whether a sample's keyword arguments use them,
# the refusal).
REFUSED_OPTIONS: dict[str, tuple[Any, str]] = {
    "LSTM": (lambda kw: kw.get("proj_size", 0) > 0, r"proj_size is not supported"),
    "MultiheadAttention": (_mha_options, r"add_bias_kv, add_zero_attn and kdim/vdim other than embed_dim"),
}


def expected_failure(key: str) -> str | None:
    module = key.split("-")[0]
    if module in REFUSED_OPTIONS:
        uses, reason = REFUSED_OPTIONS[module]
        if uses(SAMPLES[key][1].constructor_input.kwargs):
            return reason
    for pattern, reason in EXPECTED_FAILURES.items():
        if re.fullmatch(pattern, key):
            return reason
    return None


# -- the harness -----------------------------------------------------------------------------------
class _Call(gnn.Module):
    """glcomp's module called as the sample calls torch's: tensors (also inside tuples) become
    compile inputs ``a0, a1, ...``; None and Python values pass through."""

    def __init__(self, module: gnn.Module, args: list[Any], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.m = module
        self.names: list[str] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.feeds: dict[str, np.ndarray] = {}
        self.args = [self._slot(a) for a in args]
        self.kwargs = {k: self._slot(v, k) for k, v in kwargs.items()}

    def _slot(self, value: Any, keyword: str = "") -> Any:
        if isinstance(value, torch.Tensor):
            name = f"a{len(self.names)}"
            self.names.append(name)
            self.shapes[name] = tuple(value.shape)
            array = value.detach().numpy()
            if array.dtype == bool and keyword in ("attn_mask", "src_mask", "mask"):
                # torch's boolean attention mask (True: not attended) as glcomp's additive one
                array = np.where(array, np.float32(-1e30), np.float32(0.0))
            self.feeds[name] = array
            return ("input", name)
        if isinstance(value, tuple):
            return ("tuple", [self._slot(v) for v in value])
        return ("value", value)

    def _fill(self, slot: Any, inputs: dict[str, Any]) -> Any:
        kind, value = slot
        if kind == "input":
            return inputs[value]
        if kind == "tuple":
            return tuple(self._fill(v, inputs) for v in value)
        return value

    def forward(self, **inputs: Any) -> Any:
        args = [self._fill(a, inputs) for a in self.args]
        kwargs = {k: self._fill(v, inputs) for k, v in self.kwargs.items()}
        if "input" in kwargs and "input" not in inspect.signature(self.m.forward).parameters:
            args.insert(0, kwargs.pop("input"))  # torch's keyword for the first argument (Linear's x)
        return self.m(*args, **kwargs)


def _flat(value: Any, prefix: str = "output") -> dict[str, np.ndarray]:
    """torch's outputs by glcomp's predict keys (output, output.0, output.1.0, ...)."""
    if isinstance(value, tuple):
        out: dict[str, np.ndarray] = {}
        for i, v in enumerate(value):
            out |= _flat(v, f"{prefix}.{i}")
        return out
    return {} if value is None else {prefix: value.detach().numpy()}


def _counterpart(value: Any) -> Any:
    """A constructor argument for glcomp: torch.nn.functional callables become glcomp's of the same
    name, torch modules (TransformerEncoder's layer and norm) glcomp modules built from their
    attributes; anything else passes as it is."""
    name = getattr(value, "__name__", "")
    if callable(value) and value is getattr(torch.nn.functional, name, None):
        return getattr(glcomp.nn.functional, name)
    if isinstance(value, torch.nn.TransformerEncoderLayer):
        attn, linear1 = value.self_attn, value.linear1
        return gnn.TransformerEncoderLayer(
            attn.embed_dim,
            attn.num_heads,
            dim_feedforward=linear1.out_features,
            dropout=value.dropout.p,
            activation=_counterpart(value.activation),
            layer_norm_eps=value.norm1.eps,
            batch_first=attn.batch_first,
            norm_first=value.norm_first,
            bias=linear1.bias is not None,
        )
    if isinstance(value, torch.nn.LayerNorm):
        return gnn.LayerNorm(value.normalized_shape, eps=value.eps, bias=value.bias is not None)
    return value


def _modules(info: Any, sample: Any) -> tuple[Any, gnn.Module]:
    ctor = sample.constructor_input
    torch.manual_seed(0)
    tmodel = info.module_cls(*ctor.args, **ctor.kwargs).eval()
    args = [_counterpart(a) for a in ctor.args]
    gmodel = getattr(gnn, info.module_cls.__name__)(
        *args, **{k: _counterpart(v) for k, v in ctor.kwargs.items()}
    )
    gmodel.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    return tmodel, gmodel.eval()


def run_sample(key: str, runtime: Any = None) -> None:
    """Forward (and, where the module has parameters and one output, parameter gradients) of
    glcomp's module against torch's on the sample; asserts they agree. `runtime` makes the
    runtime from a Program as a context manager (the GL fixture); None: the reference runtime."""
    runtime = runtime or contextlib.nullcontext
    info, sample = SAMPLES[key]
    tmodel, gmodel = _modules(info, sample)
    fwd = sample.forward_input
    call = _Call(gmodel, list(fwd.args), dict(fwd.kwargs))
    with torch.no_grad():
        expected = _flat(tmodel(*fwd.args, **fwd.kwargs))
    program = glcomp.compile(call, call.shapes)
    with runtime(program.runtime("reference") if runtime is contextlib.nullcontext else program) as rt:
        got = rt.predict(**call.feeds)
    got = {"output": got} if isinstance(got, np.ndarray) else got
    for name, value in expected.items():
        assert got[name].shape == value.shape, (key, name)
        np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=f"{key} {name}")
    params = dict(tmodel.named_parameters())
    if not params or list(expected) != ["output"] or expected["output"].ndim == 0:
        return
    r = np.random.default_rng(0).normal(size=expected["output"].shape).astype(np.float32)
    tmodel.train()  # glcomp's gradients entry runs in train mode (BatchNorm: batch statistics)
    tmodel.zero_grad()
    (tmodel(*fwd.args, **fwd.kwargs) * torch.from_numpy(r)).sum().backward()
    program = glcomp.compile(call, call.shapes, loss=lambda out, y: (out * y).sum(), target_spec=r.shape)
    with runtime(program.runtime("reference") if runtime is contextlib.nullcontext else program) as rt:
        grads = rt.gradients(**call.feeds, y=r)
    for name, p in params.items():
        np.testing.assert_allclose(
            grads[f"m.{name}"], p.grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=f"{key} grad {name}"
        )


def test_the_lists_stay_true() -> None:
    assert len(module_db) == 114  # torch 2.13's module_db; a new torch must revisit the lists
    for name in NOT_IN_GLCOMP:
        assert not hasattr(gnn, name), name
    assert len(NOT_IN_GLCOMP) == 72
    for pattern in EXPECTED_FAILURES:
        assert any(re.fullmatch(pattern, key) for key in SAMPLES), pattern
    passing = [k for k in SAMPLES if expected_failure(k) is None]
    assert len(passing) == PASSING


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_module_sample(key: str) -> None:
    reason = expected_failure(key)
    if reason is not None:
        with pytest.raises(GlcompError, match=reason):
            run_sample(key)
    else:
        run_sample(key)


PASSING = 290  # samples that match torch on the reference runtime


# Samples also run on GL: one or more per module family (forward and gradients on shaders).
GL_SAMPLES = (
    "Linear-1-no_bias",
    "Conv2d-0",
    "ConvTranspose2d-0",
    "BatchNorm2d-0",
    "LayerNorm-0-1d_elementwise_affine",
    "MaxPool2d-1-4d_input",
    "AvgPool2d-2-stride",
    "Embedding-0",
    "GRU-0",
    "LSTMCell-0",
    "MultiheadAttention-24",
    "TransformerEncoderLayer-0-relu_activation",
    "CrossEntropyLoss-2-2d__mean",
    "Mish-0",
)


@pytest.mark.parametrize("key", GL_SAMPLES)
def test_module_sample_on_gl(key: str, gl_runtime: Any) -> None:
    assert expected_failure(key) is None
    run_sample(key, gl_runtime)
