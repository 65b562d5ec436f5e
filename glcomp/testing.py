"""Property-testing helpers: Hypothesis strategies for shapes, arrays, op cases and random graphs,
and gradient checkers that compare autodiff with central finite differences in float64.

Needs Hypothesis (``pip install glcomp[test]``)::

    from glcomp.testing import check_gradients

    check_gradients(model, {"x": x}, y, nn.CrossEntropyLoss())  # raises GradientCheckError

Strategies:

* `shapes` draws tensor shapes; `arrays` draws arrays in an input domain ("real", "positive",
  "nonzero", "bytes": k / 255 as in an RGBA8 frame, or "labels": integer class labels stored as
  floats in [0, num_classes)).
* `op_cases` draws inputs and attributes for one registry op through its ``sample`` hook.
* `random_graphs` draws small composite graphs (chains, diamonds, fan-out, broadcasting,
  reductions, movement, matmul) built through the Tensor API, ready for `check_graph_gradients`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.ops import get_op
from glcomp.ir.passes import autodiff
from glcomp.ir.tensor import Tensor, broadcast_shapes, cat, const

DOMAINS = ("real", "positive", "nonzero", "labels", "bytes")

# Value ranges per domain: bounded so that exp, products and quotients stay well conditioned.
BOUNDS: dict[str, tuple[float, float]] = {
    "real": (-2.0, 2.0),
    "positive": (0.5, 3.0),
    "nonzero": (0.5, 3.0),
    "bytes": (0.0, 1.0),
}


# -- shapes and arrays -----------------------------------------------------------------------------
def shapes(
    min_rank: int = 0, max_rank: int = 4, min_side: int = 1, max_side: int = 6
) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes with `min_rank`..`max_rank` dimensions of `min_side`..`max_side` each."""
    return hnp.array_shapes(min_dims=min_rank, max_dims=max_rank, min_side=min_side, max_side=max_side)


def _floats(domain: str, dtype: np.dtype) -> st.SearchStrategy[float]:
    width = 32 if dtype == np.float32 else 64
    if domain == "bytes":  # what an RGBA8 texture holds: k / 255
        return st.integers(0, 255).map(lambda k: k / 255.0)
    lo, hi = BOUNDS[domain]
    magnitude = st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=width)
    if domain == "nonzero":
        return st.one_of(magnitude, magnitude.map(lambda v: -v))
    return magnitude


def _distinct(shape: tuple[int, ...], domain: str, dtype: np.dtype, seed: int) -> np.ndarray:
    """All elements different (gaps of at least (hi - lo) / size) and none at 0."""
    size = math.prod(shape)
    rng = np.random.default_rng(seed)
    t = (rng.permutation(size) + 0.25) / max(size, 1)  # never a symmetric grid point, so never 0
    lo, hi = BOUNDS[domain]
    values = lo + (hi - lo) * t
    if domain == "nonzero":
        values = values * rng.choice([-1.0, 1.0], size=size)
    if domain == "bytes":  # on the byte grid, distinct while there are bytes enough
        values = np.floor(values * 255.0) / 255.0
    return values.reshape(shape).astype(dtype)


def arrays(
    shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    domain: str = "real",
    dtype: Any = np.float64,
    *,
    num_classes: int | None = None,
    distinct: bool = False,
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `shape` whose values lie in `domain`.

    "real" draws from [-2, 2], "positive" from [0.5, 3], "nonzero" from +-[0.5, 3], "bytes" the
    values k / 255 an RGBA8 texture holds, and "labels" integer class labels in [0, num_classes)
    stored as floats. ``distinct=True`` makes every
    element different from every other by a clear margin and keeps all of them away from 0, so
    kinks (relu), ties (max, max-pooling, maximum) and comparisons are never hit by the
    perturbations of a finite-difference check.
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; use one of {DOMAINS}")
    if isinstance(shape, st.SearchStrategy):
        return shape.flatmap(lambda s: arrays(s, domain, dtype, num_classes=num_classes, distinct=distinct))
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if domain == "labels":
        if not num_classes or num_classes < 1:
            raise ValueError("domain 'labels' needs num_classes >= 1")
        labels = st.integers(0, num_classes - 1).map(float)
        return hnp.arrays(dtype, shape, elements=labels)
    if distinct:
        return st.integers(0, 2**32 - 1).map(lambda seed: _distinct(shape, domain, dtype, seed))
    return hnp.arrays(dtype, shape, elements=_floats(domain, dtype))


# -- op cases --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCase:
    """Inputs and attributes for one application of a registry op."""

    op: str
    inputs: tuple[np.ndarray, ...]
    attrs: dict[str, Any]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [a.shape for a in self.inputs]

    def reference(self) -> np.ndarray:
        """The op's numpy reference applied to the inputs."""
        return np.asarray(get_op(self.op).reference(*self.inputs, **self.attrs))

    def __repr__(self) -> str:
        return f"OpCase({self.op}, shapes={self.shapes}, attrs={self.attrs})"


def op_cases(
    op_name: str, dtype: Any = np.float64, distinct: bool | None = None
) -> st.SearchStrategy[OpCase]:
    """Inputs for `op_name`: shapes and attributes from the op's ``sample`` hook, values in its domain.

    ``distinct`` (default: True for ops with ``smooth=False``) draws all inputs jointly with pairwise
    distinct values away from 0, see `arrays`. Ops of domain "labels" take their class count from
    the ``num_classes`` attribute.
    """
    rule = get_op(op_name)
    if rule.sample is None:
        raise ValueError(f"op {op_name!r} has no sample hook (source ops are not drawn)")
    joint = (not rule.smooth) if distinct is None else distinct

    @st.composite
    def build(draw: Callable[..., Any]) -> OpCase:
        in_shapes, attrs = rule.sample(draw)
        in_shapes = [tuple(s) for s in in_shapes]
        if rule.domain == "labels":
            if "num_classes" not in attrs:
                raise ValueError(f"op {op_name!r}: domain 'labels' needs a num_classes attribute")
            k = int(attrs["num_classes"])
            inputs = [draw(arrays(s, "labels", dtype, num_classes=k)) for s in in_shapes]
        elif joint:
            sizes = [math.prod(s) for s in in_shapes]
            flat = draw(arrays((sum(sizes),), rule.domain, dtype, distinct=True))
            bounds = np.cumsum([0, *sizes])
            inputs = [flat[bounds[i] : bounds[i + 1]].reshape(s) for i, s in enumerate(in_shapes)]
        else:
            inputs = [draw(arrays(s, rule.domain, dtype)) for s in in_shapes]
        return OpCase(op_name, tuple(inputs), dict(attrs))

    return build()


def differentiable_inputs(
    op_name: str, in_shapes: Sequence[tuple[int, ...]], attrs: Mapping[str, Any]
) -> list[int]:
    """Operand positions for which the op's gradient rule returns a gradient (not None)."""
    rule = get_op(op_name)
    if rule.grad is None:
        return []
    g = Graph()
    operands = [g.add_input(f"in{i}", s, "data") for i, s in enumerate(in_shapes)]
    out = g.add(op_name, operands, **attrs)
    seed = const(g, 1.0, g.shape(out))
    parts = rule.grad(seed, Tensor(g, out), *(Tensor(g, o) for o in operands), **attrs)
    return [i for i, p in enumerate(parts) if p is not None]


def op_loss_graph(case: OpCase, weights: np.ndarray) -> tuple[Graph, dict[str, np.ndarray]]:
    """Graph of ``loss = sum(op(in0, in1, ...) * w)`` with feeds; inputs ``in<i>`` and ``w``.

    Random `weights` make every output element count with a different factor, so a gradient
    that is wrong for a single element, or permuted, changes the loss.
    """
    g = Graph()
    operands = [g.add_input(f"in{i}", a.shape, "param") for i, a in enumerate(case.inputs)]
    out = Tensor(g, g.add(case.op, operands, **case.attrs))
    w = Tensor(g, g.add_input("w", out.shape, "data"))
    g.outputs["loss"] = (out * w).sum().node
    feeds = {f"in{i}": a for i, a in enumerate(case.inputs)} | {"w": np.asarray(weights)}
    return g, feeds


# -- random composite graphs -----------------------------------------------------------------------
@dataclass
class GraphCase:
    """A random graph with a scalar output `loss`, the inputs to differentiate and their feeds.

    `data` names inputs that are fed but not differentiated (their gradient must cost nothing).
    `recipe` lists the steps that built the graph, for failure reports.
    """

    graph: Graph
    loss: str
    wrt: list[str]
    feeds: dict[str, np.ndarray]
    data: list[str] = field(default_factory=list)
    recipe: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"GraphCase(wrt={self.wrt}, recipe={self.recipe})"


_UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "tanh": lambda t: t.tanh(),
    "sigmoid": lambda t: t.sigmoid(),
    "neg": lambda t: -t,
    "exp(tanh)": lambda t: t.tanh().exp(),
    "square": lambda t: t * t,  # fan-out into one node: two parallel edges
    "sqrt(1+t^2)": lambda t: (t * t + 1.0).sqrt(),
    "log(1+t^2)": lambda t: (1.0 + t * t).log(),
    "1/(1+t^2)": lambda t: 1.0 / (1.0 + t * t),
    "scale": lambda t: t * 0.5 - 0.25,
}

_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (2.0 + b.tanh()),
}


@st.composite
def random_graphs(draw: Callable[..., Any], max_steps: int = 7, max_side: int = 4) -> GraphCase:
    """Small random composite graphs built from registry ops through the Tensor API.

    Parameters (role "param", differentiated) and one data input (role "data", not differentiated)
    feed up to `max_steps` steps drawn from: smooth unary functions, binary ops with broadcasting
    (including a value combined with itself), bias adds of broadcast parameters, sum/mean
    reductions with and without keepdim, transposes, reshapes, slices, unsqueeze, concatenation
    and matmul with a fresh parameter. Earlier values are reused freely, giving fan-out and
    diamonds. ``loss = sum_i sum(leaf_i * w_i)`` over every value nobody else used, with random
    data weights `w_i`. Only smooth functions are used, so finite differences apply everywhere.
    """
    g = Graph()
    feeds: dict[str, np.ndarray] = {}
    wrt: list[str] = []
    recipe: list[str] = []

    def new_input(name: str, shape: tuple[int, ...], role: str) -> Tensor:
        feeds[name] = draw(arrays(shape, "real"))
        if role == "param":
            wrt.append(name)
        return Tensor(g, g.add_input(name, shape, role))

    base = draw(shapes(1, 3, 1, max_side))
    pool = [new_input("p0", base, "param"), new_input("x", base, "data")]
    if draw(st.booleans()):
        squeezed = tuple(1 if draw(st.booleans()) else s for s in base)
        pool.append(new_input("p1", squeezed[draw(st.integers(0, len(base) - 1)) :], "param"))
    used: set[int] = set()

    def pick() -> Tensor:  # the newest value half the time (chains), any earlier one otherwise
        t = pool[-1] if draw(st.booleans()) else pool[draw(st.integers(0, len(pool) - 1))]
        used.add(t.node)
        return t

    steps = draw(st.integers(1, max_steps))
    for _ in range(steps):
        kind = draw(st.sampled_from(["unary", "binary", "bias", "reduce", "movement", "matmul"]))
        t = pick()
        if kind == "unary":
            name = draw(st.sampled_from(sorted(_UNARY)))
            out = _UNARY[name](t)
        elif kind == "binary":
            name = draw(st.sampled_from(sorted(_BINARY)))
            u = pick()
            try:
                broadcast_shapes(t.shape, u.shape)
            except GlcompError:
                u = u.mean()  # a scalar broadcasts against anything
                name += "(mean)"
            out = _BINARY[name.split("(")[0]](t, u)
        elif kind == "bias":
            shape = tuple(1 if draw(st.booleans()) else s for s in t.shape)
            shape = shape[draw(st.integers(0, len(shape))) :]
            bias = new_input(f"p{len(wrt)}", shape, "param")
            name = f"bias{shape}"
            out = t + bias if draw(st.booleans()) else bias * t
        elif kind == "reduce":
            if t.ndim == 0:
                out, name = t * 2.0, "scalar*2"
            else:
                dim = draw(st.integers(-t.ndim, t.ndim - 1))
                keep = draw(st.booleans())
                how = draw(st.sampled_from(["sum", "mean", "logsumexp"]))
                out = getattr(t, how)(dim, keepdim=keep)
                name = f"{how}({dim}, keepdim={keep})"
        elif kind == "movement":
            how = draw(st.sampled_from(["transpose", "flatten", "unsqueeze", "slice", "cat"]))
            if how == "transpose" and t.ndim >= 2:
                out = t.transpose(0, -1)
            elif how == "unsqueeze":
                out = t.unsqueeze(draw(st.integers(0, t.ndim)))
            elif how == "slice" and t.ndim >= 1 and t.shape[0] > 1:
                out = t[1:]
            elif how == "cat" and t.ndim >= 1:
                out = cat([t, t.tanh()], dim=t.ndim - 1)
            else:
                out, how = t.reshape(-1), "flatten"
            name = how
        else:
            src = t if t.ndim >= 1 else t.reshape(1)
            k = draw(st.integers(1, max_side))
            weight = new_input(f"p{len(wrt)}", (src.shape[-1], k), "param")
            out = src @ weight
            name = f"matmul(k={k})"
        recipe.append(f"{name} {t.shape}->{out.shape}")
        pool.append(out)

    leaves = [t for t in pool[2:] if t.node not in used] or [pool[-1]]
    total: Tensor | None = None
    for i, leaf in enumerate(leaves):
        w = new_input(f"w{i}", leaf.shape, "data")
        term = (leaf * w).sum()
        total = term if total is None else total + term
    g.outputs["loss"] = total.node
    data = [n for n in feeds if n not in wrt]
    return GraphCase(g, "loss", wrt, feeds, data, recipe)


# -- gradient checks -------------------------------------------------------------------------------
class GradientCheckError(AssertionError):
    """Autodiff disagrees with finite differences; the message names the tensor and worst element."""


@dataclass(frozen=True)
class GradientReport:
    """Outcome of checking the gradient of one tensor."""

    name: str
    checked: int  # elements compared against finite differences
    max_abs_error: float
    worst_index: tuple[int, ...]
    analytic: float  # autodiff value at worst_index
    numeric: float  # finite-difference value at worst_index


def _loss_only(graph: Graph, loss_output: str) -> Graph:
    if loss_output not in graph.outputs:
        raise GlcompError(f"graph has no output named {loss_output!r}; outputs: {sorted(graph.outputs)}")
    g = graph.copy()
    g.outputs = {loss_output: graph.outputs[loss_output]}
    return g.prune()


def _compare(
    name: str,
    analytic: np.ndarray,
    feeds: dict[str, np.ndarray],
    loss: Callable[[dict[str, np.ndarray]], float],
    eps: float,
    rtol: float,
    atol: float,
    max_elements: int | None,
    directions: int,
    rng: np.random.Generator,
    what: str,
) -> GradientReport:
    x = feeds[name]
    analytic = np.asarray(analytic, np.float64)
    if analytic.shape != x.shape:
        raise GradientCheckError(
            f"gradient of {what} w.r.t. {name!r} has shape {analytic.shape}, the tensor has {x.shape}"
        )

    def at(delta: np.ndarray) -> float:
        return loss(feeds | {name: x + delta})

    # Element by element (all of them, or a random subset of at most max_elements).
    flat = np.arange(x.size)
    if max_elements is not None and x.size > max_elements:
        flat = np.sort(rng.choice(x.size, size=max_elements, replace=False))
    numeric = np.zeros(len(flat))
    for j, i in enumerate(flat):
        delta = np.zeros(x.size)
        delta[i] = eps
        delta = delta.reshape(x.shape)
        numeric[j] = (at(delta) - at(-delta)) / (2 * eps)
    got = analytic.reshape(-1)[flat]
    err = np.abs(got - numeric)
    excess = err / (atol + rtol * np.abs(numeric))
    worst = int(np.argmax(excess)) if len(flat) else 0
    index = tuple(int(v) for v in np.unravel_index(flat[worst], x.shape)) if len(flat) else ()
    if len(flat) and excess[worst] > 1:
        raise GradientCheckError(
            f"gradient of {what} w.r.t. {name!r} {x.shape} does not match central finite differences: "
            f"worst element {name}[{', '.join(map(str, index))}]: autodiff {got[worst]:.9g}, "
            f"numeric {numeric[worst]:.9g} (|diff| {err[worst]:.3g} > {atol:g} + {rtol:g} * |numeric|); "
            f"{int(np.sum(excess > 1))} of {len(flat)} checked elements differ"
        )
    # Along random directions, which sees every element even when only some were checked above.
    for _ in range(directions if x.size else 0):
        v = rng.standard_normal(x.shape)
        v /= np.linalg.norm(v) or 1.0
        numeric_dir = (at(eps * v) - at(-eps * v)) / (2 * eps)
        analytic_dir = float(np.sum(analytic * v))
        if abs(analytic_dir - numeric_dir) > atol + rtol * float(np.sum(np.abs(analytic * v))):
            raise GradientCheckError(
                f"gradient of {what} w.r.t. {name!r} {x.shape} does not match central finite differences "
                f"along a random direction: autodiff {analytic_dir:.9g}, numeric {numeric_dir:.9g}"
            )
    return GradientReport(
        name,
        len(flat),
        float(err[worst]) if len(flat) else 0.0,
        index,
        float(got[worst]) if len(flat) else 0.0,
        float(numeric[worst]) if len(flat) else 0.0,
    )


def check_graph_gradients(
    graph: Graph,
    loss_output: str,
    wrt: Sequence[str],
    feeds: Mapping[str, Any],
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    max_elements: int | None = None,
    directions: int = 2,
    seed: int = 0,
) -> dict[str, GradientReport]:
    """Check `autodiff(graph, loss_output, wrt)` against central finite differences of the loss.

    Both sides are evaluated in float64 with `glcomp.ir.interpret.evaluate`. For every input
    named in `wrt`, each element (or a random subset of `max_elements`) is perturbed by +-`eps`,
    and the gradient is also checked along `directions` random unit directions. An element passes
    when ``|autodiff - numeric| <= atol + rtol * |numeric|``. The gradient graph must validate.
    Raises `GradientCheckError` naming the tensor and its worst element; returns one report per input.
    """
    base = _loss_only(graph, loss_output)
    values = {k: np.asarray(v, np.float64) for k, v in feeds.items()}
    grads = autodiff(base, loss_output, list(wrt))
    grads.validate()
    analytic = evaluate(grads, values, np.float64)

    def loss(f: dict[str, np.ndarray]) -> float:
        return float(evaluate(base, f, np.float64)[loss_output])

    rng = np.random.default_rng(seed)
    return {
        name: _compare(
            name,
            analytic[f"grad:{name}"],
            values,
            loss,
            eps,
            rtol,
            atol,
            max_elements,
            directions,
            rng,
            repr(loss_output),
        )
        for name in wrt
    }


def check_gradients(
    model: Any,
    inputs: Mapping[str, np.ndarray],
    target: np.ndarray,
    loss: Any,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    max_elements: int | None = None,
    target_name: str = "y",
    seed: int = 0,
) -> dict[str, GradientReport]:
    """Check a model's parameter gradients against central finite differences, in float64.

    Compiles `model` with `loss` for the shapes of `inputs`, takes the gradients of the reference
    runtime (``prog.runtime("reference", dtype=np.float64).gradients``, train mode) and compares
    them, for every trainable parameter and every element (or a random subset of
    `max_elements`), with ``(L(p + eps) - L(p - eps)) / (2 eps)`` of the same train-mode loss.
    Models with kinks (ReLU, max-pooling) need inputs that keep every activation away from them.
    Raises `GradientCheckError` naming the parameter and its worst element; returns one report per
    parameter.
    """
    import glcomp

    prog = glcomp.compile(
        model, {k: np.shape(v) for k, v in inputs.items()}, loss=loss, target_name=target_name
    )
    given = dict(inputs) | {target_name: target}
    runtime = prog.runtime("reference", dtype=np.float64)
    analytic = runtime.gradients(**given)
    base = _loss_only(prog.graphs["gradients"], "loss")
    values = {k: np.asarray(v, np.float64) for k, v in prog.feeds("gradients", given).items()}
    values |= {k: np.asarray(v, np.float64) for k, v in (runtime.params | runtime.buffers).items()}

    def value(f: dict[str, np.ndarray]) -> float:
        return float(evaluate(base, f, np.float64)["loss"])

    rng = np.random.default_rng(seed)
    what = f"the {type(loss).__name__} of {type(model).__name__}"
    return {
        name: _compare(name, analytic[name], values, value, eps, rtol, atol, max_elements, 2, rng, what)
        for name in prog.trainable
    }


__all__ = [
    "BOUNDS",
    "DOMAINS",
    "GradientCheckError",
    "GradientReport",
    "GraphCase",
    "OpCase",
    "arrays",
    "check_gradients",
    "check_graph_gradients",
    "differentiable_inputs",
    "op_cases",
    "op_loss_graph",
    "random_graphs",
    "shapes",
]
