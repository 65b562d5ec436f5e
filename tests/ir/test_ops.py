"""Every registered op against its own contract: shape rule, an independent oracle, gradient.

The oracles below are written from the ops' definitions with explicit loops or per-element
Python maths, never by calling the registry's reference, so a wrong reference shows up as a
mismatch rather than agreeing with itself.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from itertools import product
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.ops import KINDS, REGISTRY
from glcomp.ir.passes import autodiff
from glcomp.testing import (
    DOMAINS,
    arrays,
    check_graph_gradients,
    differentiable_inputs,
    op_cases,
    op_loss_graph,
)

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- independent oracles ---------------------------------------------------------------------------
def each(shape: tuple[int, ...]) -> Any:
    return itertools.product(*(range(s) for s in shape))


def per_element(fn: Callable[..., float]) -> Callable[..., np.ndarray]:
    def apply(*arrays: np.ndarray, **_: Any) -> np.ndarray:
        out = np.zeros(arrays[0].shape)
        for idx in each(out.shape):
            out[idx] = fn(*(float(a[idx]) for a in arrays))
        return out

    return apply


def o_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros((a.shape[0], b.shape[1]))
    for i, j in each(out.shape):
        out[i, j] = sum(a[i, k] * b[k, j] for k in range(a.shape[1]))
    return out


def o_bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A product per batch element, each by o_matmul's loops."""
    return np.stack([o_matmul(a[i], b[i]) for i in range(a.shape[0])]) if a.shape[0] else np.zeros(0)


def o_reshape(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    values = [a[idx] for idx in each(a.shape)]  # row-major order
    out = np.zeros(shape)
    for pos, idx in enumerate(each(shape)):
        out[idx] = values[pos]
    return out


def o_permute(a: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(tuple(a.shape[p] for p in perm))
    for idx in each(out.shape):
        src = [0] * a.ndim
        for k, p in enumerate(perm):
            src[p] = idx[k]
        out[idx] = a[tuple(src)]
    return out


def o_expand(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape)
    for idx in each(shape):
        out[idx] = a[tuple(0 if a.shape[i] == 1 else j for i, j in enumerate(idx))]
    return out


def o_slice(a: np.ndarray, starts: tuple[int, ...], stops: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(tuple(hi - lo for lo, hi in zip(starts, stops)))
    for idx in each(out.shape):
        out[idx] = a[tuple(i + lo for i, lo in zip(idx, starts))]
    return out


def o_pad(a: np.ndarray, before: tuple[int, ...], after: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(tuple(s + lo + hi for s, lo, hi in zip(a.shape, before, after)))
    for idx in each(a.shape):
        out[tuple(i + lo for i, lo in zip(idx, before))] = a[idx]
    return out


def o_concat(*arrays: np.ndarray, axis: int) -> np.ndarray:
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    out = np.zeros(shape)
    offset = 0
    for a in arrays:
        for idx in each(a.shape):
            dst = list(idx)
            dst[axis] += offset
            out[tuple(dst)] = a[idx]
        offset += a.shape[axis]
    return out


def o_reduce(combine: Callable[[float, float], float], start: float) -> Callable[..., np.ndarray]:
    def apply(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        out = np.full(tuple(1 if i in axes else s for i, s in enumerate(a.shape)), start)
        for idx in each(a.shape):
            dst = tuple(0 if i in axes else j for i, j in enumerate(idx))
            out[dst] = combine(out[dst], a[idx])
        return out

    return apply


def o_logsumexp(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """log of the sum of exp over each output's elements, in Python floats (math.fsum, shifted
    by the group's max so exp stays finite)."""
    groups: dict[tuple[int, ...], list[float]] = {}
    for idx in each(a.shape):
        groups.setdefault(tuple(0 if i in axes else j for i, j in enumerate(idx)), []).append(float(a[idx]))
    out = np.zeros(tuple(1 if i in axes else s for i, s in enumerate(a.shape)))
    for dst, values in groups.items():
        m = max(values)
        out[dst] = m + math.log(math.fsum(math.exp(v - m) for v in values))
    return out


def o_one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    out = np.zeros((*labels.shape, num_classes))
    for idx in each(labels.shape):
        out[(*idx, int(labels[idx]))] = 1.0
    return out


def o_floor(a: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: float(math.floor(v)))(a).astype(a.dtype)


def o_preprocess(
    sheet: np.ndarray,
    batch: int,
    source: Any,
    columns: int,
    size: Any,
    mode: str,
    grey: bool,
    top: int,
    left: int,
    offset: Any,
    gain: Any,
) -> np.ndarray:
    """From the definition in float64: the bytes round(255 v) of each frame, resized with bilinear
    taps from the continuous source position rounded to sixteenths, or cropped, then grey
    (77 R + 150 G + 29 B) / 256 or RGB, then (p - offset) * gain."""
    hs, ws = source
    h, w = size
    k = np.floor(sheet.astype(np.float64) * 255 + 0.5)
    frames = [k[n // columns, :hs, (n % columns) * ws : (n % columns + 1) * ws, :3] for n in range(batch)]
    out = np.zeros((batch, 1 if grey else 3, h, w))
    for n, frame in enumerate(frames):
        for i in range(h):
            for j in range(w):
                if mode == "resize":
                    pix = np.zeros(3)
                    for (y, fy), (x, fx) in product(_taps(i, h, hs), _taps(j, w, ws)):
                        pix += frame[y, x] * fy * fx
                else:
                    pix = frame[top + i, left + j]
                value = [pix @ np.array([77, 150, 29]) / 256] if grey else pix
                for c, v in enumerate(value):
                    out[n, c, i, j] = (v - offset[c]) * gain[c]
    return out


def _taps(i: int, out: int, src: int) -> list[tuple[int, float]]:
    """Source rows and weights of output row i: half-pixel centres, the position rounded to
    sixteenths, clamped at both ends."""
    pos = max((i + 0.5) * src / out - 0.5, 0.0)
    q = math.floor(pos * 16 + 0.5)
    lo, f = q // 16, (q % 16) / 16
    if lo >= src - 1:
        return [(src - 1, 1.0)]
    return [(lo, 1 - f), (lo + 1, f)]


def o_affine_gather(x: np.ndarray, m: np.ndarray, size: Any, fill: float) -> np.ndarray:
    """Per output pixel, Python integer arithmetic: the source pixel the floored map sends its
    centre (2j + 1 - OW, 2i + 1 - OH half pixels from the centre) to, or `fill` outside."""
    n, c, h, w = x.shape
    oh, ow = size
    out = np.zeros((n, c, oh, ow), x.dtype)
    for b, i, j in itertools.product(range(n), range(oh), range(ow)):
        k = [math.floor(v) for v in m[b]]
        p, q = 2 * j + 1 - ow, 2 * i + 1 - oh
        sx = (k[0] * p + k[1] * q + k[2]) // max(k[3], 1)
        sy = (k[4] * p + k[5] * q + k[6]) // max(k[7], 1)
        for ch in range(c):
            out[b, ch, i, j] = x[b, ch, sy, sx] if 0 <= sx < w and 0 <= sy < h else fill
    return out


def o_hash_uniform(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The counter hash in Python integers: absorb floor(b), floor(a), then the element index,
    each word added modulo 2^24 and followed by three rounds of h(2h+1), an odd multiplier and
    adding the high 12 bits to the low 12."""

    def mix(h: int) -> int:
        for c in (0x9E3779, 0x85EBCB, 0xC2B2AF):
            h = h * (2 * h + 1) % 2**24
            h = h * c % 2**24
            h = (h // 4096) * 4096 + (h % 4096 + h // 4096) % 4096
        return h

    out = np.zeros(a.shape)
    for i in range(a.shape[0]):
        h = mix(math.floor(b[i]) % 2**24)
        h = mix((h + math.floor(a[i]) % 2**24) % 2**24)
        out[i] = mix((h + i) % 2**24) / 2**24
    return out


def out_len(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def window(
    oh: int, ow: int, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int], hw: Any
) -> list[tuple[int, int, int, int]]:
    """(i, j, h, w) for kernel offsets i, j whose input position h, w is inside the image."""
    found = []
    for i, j in each(kernel):
        h, w = oh * stride[0] - padding[0] + i, ow * stride[1] - padding[1] + j
        if 0 <= h < hw[0] and 0 <= w < hw[1]:
            found.append((i, j, h, w))
    return found


def o_conv2d(x: np.ndarray, w: np.ndarray, stride: Any, padding: Any, groups: int = 1) -> np.ndarray:
    n, _, hh, ww = x.shape
    o, cg, kh, kw = w.shape
    out = np.zeros((n, o, out_len(hh, kh, stride[0], padding[0]), out_len(ww, kw, stride[1], padding[1])))
    for b, f, oh, ow in each(out.shape):
        first = f // (o // groups) * cg  # the first input channel of output channel f's group
        for i, j, h, v in window(oh, ow, (kh, kw), stride, padding, (hh, ww)):
            out[b, f, oh, ow] += sum(x[b, first + ch, h, v] * w[f, ch, i, j] for ch in range(cg))
    return out


def o_conv2d_input_grad(
    g: np.ndarray, w: np.ndarray, stride: Any, padding: Any, input_hw: Any, groups: int = 1
) -> np.ndarray:
    o, cg = w.shape[:2]
    out = np.zeros((g.shape[0], cg * groups, *input_hw))
    for b, f, oh, ow in each(g.shape):
        first = f // (o // groups) * cg
        for i, j, h, v in window(oh, ow, w.shape[2:], stride, padding, input_hw):
            for ch in range(cg):
                out[b, first + ch, h, v] += g[b, f, oh, ow] * w[f, ch, i, j]
    return out


def o_conv2d_weight_grad(
    x: np.ndarray, g: np.ndarray, stride: Any, padding: Any, kernel_hw: Any, groups: int = 1, parts: int = 1
) -> np.ndarray:
    o, cg = g.shape[1], x.shape[1] // groups
    rows = -(-g.shape[0] * g.shape[2] // parts)  # (image, output row) pairs per part
    out = np.zeros((parts * o, cg, *kernel_hw))
    for b, f, oh, ow in each(g.shape):
        first = f // (o // groups) * cg
        part = (b * g.shape[2] + oh) // rows
        for i, j, h, v in window(oh, ow, kernel_hw, stride, padding, x.shape[2:]):
            for ch in range(cg):
                out[part * o + f, ch, i, j] += x[b, first + ch, h, v] * g[b, f, oh, ow]
    return out


def pooled_shape(x_shape: tuple[int, ...], kernel: Any, stride: Any, padding: Any) -> tuple[int, ...]:
    n, c, hh, ww = x_shape
    return (
        n,
        c,
        out_len(hh, kernel[0], stride[0], padding[0]),
        out_len(ww, kernel[1], stride[1], padding[1]),
    )


def o_max_pool2d(x: np.ndarray, kernel: Any, stride: Any, padding: Any) -> np.ndarray:
    out = np.zeros(pooled_shape(x.shape, kernel, stride, padding))
    for b, ch, oh, ow in each(out.shape):  # padding never wins: it counts as -inf
        out[b, ch, oh, ow] = max(
            x[b, ch, h, v] for _, _, h, v in window(oh, ow, kernel, stride, padding, x.shape[2:])
        )
    return out


def o_max_pool2d_grad(x: np.ndarray, g: np.ndarray, kernel: Any, stride: Any, padding: Any) -> np.ndarray:
    out = np.zeros(x.shape)
    for b, ch, oh, ow in each(g.shape):
        best = None  # the first maximum in row-major window order takes the gradient (torch)
        for _, _, h, v in window(oh, ow, kernel, stride, padding, x.shape[2:]):
            if best is None or x[b, ch, h, v] > x[b, ch, best[0], best[1]]:
                best = (h, v)
        out[b, ch, best[0], best[1]] += g[b, ch, oh, ow]
    return out


def o_avg_pool2d(x: np.ndarray, kernel: Any, stride: Any, padding: Any) -> np.ndarray:
    out = np.zeros(pooled_shape(x.shape, kernel, stride, padding))
    for b, ch, oh, ow in each(out.shape):  # padding counts in the divisor (count_include_pad)
        total = sum(x[b, ch, h, v] for _, _, h, v in window(oh, ow, kernel, stride, padding, x.shape[2:]))
        out[b, ch, oh, ow] = total / (kernel[0] * kernel[1])
    return out


def o_avg_pool2d_grad(g: np.ndarray, kernel: Any, stride: Any, padding: Any, input_hw: Any) -> np.ndarray:
    out = np.zeros((g.shape[0], g.shape[1], *input_hw))
    for b, ch, oh, ow in each(g.shape):
        for _, _, h, v in window(oh, ow, kernel, stride, padding, input_hw):
            out[b, ch, h, v] += g[b, ch, oh, ow] / (kernel[0] * kernel[1])
    return out


ORACLES: dict[str, Callable[..., np.ndarray]] = {
    "hash_uniform": o_hash_uniform,
    "floor": o_floor,
    "affine_gather": o_affine_gather,
    "preprocess": o_preprocess,
    "erf": per_element(math.erf),
    "neg": per_element(lambda a: -a),
    "exp": per_element(math.exp),
    "log": per_element(math.log),
    "sqrt": per_element(math.sqrt),
    "tanh": per_element(math.tanh),
    "sigmoid": per_element(lambda a: 0.5 * (1.0 + math.tanh(0.5 * a))),
    "relu": per_element(lambda a: a if a > 0 else 0.0),
    "step": per_element(lambda a: 1.0 if a > 0 else 0.0),
    "stop_gradient": per_element(lambda a: a),
    "add": per_element(operator.add),
    "sub": per_element(operator.sub),
    "mul": per_element(operator.mul),
    "div": per_element(operator.truediv),
    "maximum": per_element(lambda a, b: a if a >= b else b),
    "eq": per_element(lambda a, b: 1.0 if a == b else 0.0),
    "where": per_element(lambda c, a, b: a if c != 0 else b),
    "one_hot": o_one_hot,
    "matmul": o_matmul,
    "bmm": o_bmm,
    "reshape": o_reshape,
    "permute": o_permute,
    "expand": o_expand,
    "slice": o_slice,
    "pad": o_pad,
    "concat": o_concat,
    "sum": o_reduce(operator.add, 0.0),
    "max": o_reduce(max, -math.inf),
    "logsumexp": o_logsumexp,
    "conv2d": o_conv2d,
    "conv2d_input_grad": o_conv2d_input_grad,
    "conv2d_weight_grad": o_conv2d_weight_grad,
    "max_pool2d": o_max_pool2d,
    "max_pool2d_grad": o_max_pool2d_grad,
    "avg_pool2d": o_avg_pool2d,
    "avg_pool2d_grad": o_avg_pool2d_grad,
}

# Source ops (graph inputs, constants) compute nothing: every other op is covered below.
KERNEL_OPS = sorted(n for n, op in REGISTRY.items() if op.kind != "source")
OPS = KERNEL_OPS


def min_gap(values: list[np.ndarray]) -> float:
    """Smallest distance between two input values, or between a value and the kink at 0."""
    flat = np.sort(np.concatenate([np.ravel(v) for v in values] + [np.zeros(1)]))
    return float(np.min(np.diff(flat))) if flat.size > 1 else math.inf


# -- the property test -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", OPS)
@SETTINGS
@given(data=st.data())
def test_op(name: str, data: st.DataObject) -> None:
    rule = REGISTRY[name]

    # Shape rule == shape of the reference output; reference == independent oracle.
    case = data.draw(op_cases(name, distinct=False), label="case")
    out = case.reference()
    assert tuple(rule.shape(*case.shapes, **case.attrs)) == out.shape
    expected = ORACLES[name](*case.inputs, **case.attrs)
    assert expected.shape == out.shape
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12, err_msg=f"{name} {case}")

    # The same op as a graph node, run by the reference runtime in float32.
    inputs32 = [a.astype(np.float32) for a in case.inputs]
    g = Graph()
    operands = [g.add_input(f"in{i}", s, "data") for i, s in enumerate(case.shapes)]
    g.outputs["out"] = g.add(name, operands, **case.attrs)
    g.validate()
    assert g.shape(g.outputs["out"]) == out.shape
    got = evaluate(g, {f"in{i}": a for i, a in enumerate(inputs32)})["out"]
    assert got.dtype == np.float32
    expected32 = ORACLES[name](*(a.astype(np.float64) for a in inputs32), **case.attrs)
    np.testing.assert_allclose(got, expected32, rtol=1e-5, atol=1e-5)

    # Gradient of loss = sum(op(inputs) * w) against central finite differences in float64.
    diff = differentiable_inputs(name, case.shapes, case.attrs)
    if not diff:
        return
    if not rule.smooth:  # values distinct from each other and from 0: no ties, no kinks
        case = data.draw(op_cases(name), label="distinct case")
        assume(min_gap(list(case.inputs)) > 1e-4)
    weights = data.draw(arrays(case.reference().shape), label="weights")
    graph, feeds = op_loss_graph(case, weights)
    check_graph_gradients(graph, "loss", [f"in{i}" for i in diff], feeds, seed=0)

    # Inputs the rule declares not differentiable receive an exact zero gradient.
    rest = [f"in{i}" for i in range(len(case.inputs)) if i not in diff]
    if rest:
        grads = evaluate(autodiff(graph, "loss", rest), feeds, np.float64)
        for n in rest:
            assert not np.any(grads[f"grad:{n}"]), n


# -- meta-tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registry_entry_complete(name: str) -> None:
    rule = REGISTRY[name]
    assert rule.name == name
    assert rule.kind in KINDS
    assert callable(rule.shape) and callable(rule.reference)
    assert rule.grad is None or callable(rule.grad)
    assert rule.arity is None or (isinstance(rule.arity, int) and rule.arity >= 0)
    assert rule.domain in DOMAINS
    assert isinstance(rule.smooth, bool)
    assert isinstance(rule.attrs, tuple) and all(isinstance(a, str) for a in rule.attrs)
    if rule.kind == "elementwise":
        assert isinstance(rule.glsl, str) and rule.glsl.strip()
    if rule.kind == "source":
        assert rule.arity == 0
    else:
        assert callable(rule.sample), f"op {name!r} has no sample hook"


@pytest.mark.parametrize("name", KERNEL_OPS)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_sample_hook_matches_declared_attrs(name: str, data: st.DataObject) -> None:
    rule = REGISTRY[name]
    in_shapes, attrs = rule.sample(data.draw)
    assert set(attrs) == set(rule.attrs), f"{name}: sample gives {sorted(attrs)}, op declares {rule.attrs}"
    assert rule.arity is None or len(in_shapes) == rule.arity


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_frame_ops_draw_the_values_an_rgba8_frame_holds(data: st.DataObject) -> None:
    # `preprocess` reads RGBA8 frames, whose values are k / 255. A value off that grid (1.9 was
    # drawn once) sits on a rounding half-way point of round(v * 255) in one precision and not
    # in another, so the float32 reference and the float64 oracle disagreed by a whole byte.
    for distinct in (False, True):
        case = data.draw(op_cases("preprocess", distinct=distinct))
        k = case.inputs[0] * 255.0
        assert np.all((k >= 0) & (k <= 255)) and np.allclose(k, np.round(k), atol=1e-9)


def test_every_op_has_an_independent_oracle() -> None:
    missing = sorted(set(KERNEL_OPS) - set(ORACLES))
    stale = sorted(set(ORACLES) - set(KERNEL_OPS))
    assert not missing, f"ops without an independent oracle in tests/ir/test_ops.py: {missing}"
    assert not stale, f"oracles for ops that are not registered: {stale}"
