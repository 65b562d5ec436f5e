"""torch.nn.functional-style functions on symbolic tensors, lowered to registry primitives."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.tensor import (
    Tensor,
    _fail,
    broadcast_to,
    clamp,
    const,
    ge,
    gt,
    log_softmax,
    lt,
    maximum,
    minimum,
    one_hot,
    prim,
    reshape,
    slice_axis,
    softmax,
    unary,
    where,
)

# The graph input holding the random-number step counter: optimizer-style state, advanced by one
# in every train step, read by every random op (dropout) of the train-mode graphs.
RNG_STEP = "rng.step"


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def relu(x: Tensor) -> Tensor:
    return unary("relu", x)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    # relu(x) - s * relu(-x): two fused elementwise ops, no extra primitive needed.
    return unary("relu", x) - negative_slope * unary("relu", -x)


def sigmoid(x: Tensor) -> Tensor:
    return unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    return unary("tanh", x)


def exp(x: Tensor) -> Tensor:
    return unary("exp", x)


def log(x: Tensor) -> Tensor:
    return unary("log", x)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise _fail(f"unknown reduction {reduction!r}; use 'mean', 'sum' or 'none'")


def _class_args(what: str, weight: Any, reduction: Any) -> str:
    """Checks torch's optional class-loss arguments; the third positional argument may also be
    the reduction (glcomp's earlier signature)."""
    if isinstance(weight, str):
        weight, reduction = None, weight
    if weight is not None:
        raise _fail(f"{what}: class weights are not supported yet")
    return reduction


def _class_reduce(loss: Tensor, target: Tensor, classes: int, ignore_index: int, reduction: str) -> Tensor:
    """torch's reduction of a per-sample class loss: samples labelled `ignore_index` count for
    nothing, and "mean" divides by the samples that count. (Labels are fed in [0, C), so an
    ignore_index outside that range, such as torch's default -100, never matches.)"""
    if not 0 <= ignore_index < classes:
        return _reduce(loss, reduction)
    valid = (target != float(ignore_index)).detach()
    loss = loss * valid
    if reduction == "mean":
        return loss.sum() / valid.sum()
    return _reduce(loss, reduction)


def _picked(what: str, logp: Tensor, target: Tensor) -> Tensor:
    """-logp[i, target[i]] for (N, C) scores and (N,) labels."""
    if logp.ndim != 2:
        raise _fail(f"{what} expects input of shape (N, C), got {logp.shape}")
    if target.shape != logp.shape[:1]:
        raise _fail(f"{what} target expected shape {logp.shape[:1]} but got {target.shape}")
    return -(logp * one_hot(target, logp.shape[1])).sum(1)


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Logits (N, C) and integer class targets (N,), as torch.nn.functional.cross_entropy
    (with label_smoothing)."""
    reduction = _class_args("cross_entropy", weight, reduction)
    if input.ndim != 2:
        raise _fail(f"cross_entropy expects logits of shape (N, C), got {input.shape}")
    logp = log_softmax(input, 1)
    loss = _picked("cross_entropy", logp, target)
    if label_smoothing:
        if not 0.0 <= label_smoothing <= 1.0:
            raise _fail(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        loss = loss * (1.0 - label_smoothing) - logp.mean(1) * label_smoothing
    return _class_reduce(loss, target, input.shape[1], ignore_index, reduction)


def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """Log-probabilities (N, C) and integer class targets (N,), as torch's nll_loss."""
    reduction = _class_args("nll_loss", weight, reduction)
    loss = _picked("nll_loss", input, target)
    return _class_reduce(loss, target, input.shape[-1], ignore_index, reduction)


def _same(what: str, input: Tensor, target: Tensor) -> None:
    if input.shape != target.shape:
        raise _fail(f"{what} target expected shape {input.shape} but got {target.shape}")


def binary_cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Any = None,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """Probabilities and targets in [0, 1]; each log is clamped at -100 as in torch."""
    _same("binary_cross_entropy", input, target)
    log_p = maximum(input.log(), -100.0)
    log_q = maximum((1.0 - input).log(), -100.0)
    loss = -(target * log_p + (1.0 - target) * log_q)
    return _reduce(loss * weight if weight is not None else loss, reduction)


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Any = None,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
    pos_weight: Any = None,
) -> Tensor:
    """Sigmoid and binary cross-entropy in one stable expression, as torch's:
    ``(1 - y) x + (1 + (pw - 1) y) (log(1 + exp(-|x|)) + max(-x, 0))``."""
    _same("binary_cross_entropy_with_logits", input, target)
    softplus_neg = (1.0 + (-input.abs()).exp()).log() + maximum(-input, 0.0)
    if pos_weight is None:
        loss = (1.0 - target) * input + softplus_neg
    else:
        loss = (1.0 - target) * input + (1.0 + (pos_weight - 1.0) * target) * softplus_neg
    return _reduce(loss * weight if weight is not None else loss, reduction)


def l1_loss(
    input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None, reduction: str = "mean"
) -> Tensor:
    _same("l1_loss", input, target)
    return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(
    input: Tensor,
    target: Tensor,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta 0: the L1 loss)."""
    _same("smooth_l1_loss", input, target)
    d = (input - target).abs()
    if beta == 0:
        return _reduce(d, reduction)
    return _reduce(where(lt(d, beta), d * d * (0.5 / beta), d - 0.5 * beta), reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    _same("huber_loss", input, target)
    d = (input - target).abs()
    return _reduce(where(lt(d, delta), d * d * 0.5, (d - 0.5 * delta) * delta), reduction)


def kl_div(
    input: Tensor,
    target: Tensor,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """torch's kl_div: `input` holds log-probabilities; pointwise ``target * (log target - input)``
    (0 where target is 0). ``reduction="batchmean"`` divides the sum by the batch size."""
    _same("kl_div", input, target)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        safe = maximum(target, 1e-30)
        loss = where(gt(target, 0.0), target * (safe.log() - input), -target * input)
    if reduction == "batchmean":
        return loss.sum() * (1.0 / (input.shape[0] if input.ndim else 1))
    return _reduce(loss, reduction)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    if input.shape != target.shape:
        raise _fail(f"mse_loss target expected shape {input.shape} but got {target.shape}")
    d = input - target
    return _reduce(d * d, reduction)


# -- activations ---------------------------------------------------------------------------------
def silu(x: Tensor) -> Tensor:
    return x * unary("sigmoid", x)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    # exp of min(x, 0): the branch not taken stays finite, so its zero gradient stays zero.
    return where(gt(x, 0.0), x, (minimum(x, 0.0).exp() - 1.0) * alpha)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as torch)."""
    z = x * beta
    soft = (1.0 + minimum(z, threshold).exp()).log() * (1.0 / beta)
    return where(gt(z, threshold), x, soft)


def relu6(x: Tensor) -> Tensor:
    return hardtanh(x, 0.0, 6.0)


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return clamp(x, min_val, max_val)


def hardsigmoid(x: Tensor) -> Tensor:
    return clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


def hardswish(x: Tensor) -> Tensor:
    return x * hardsigmoid(x)


def mish(x: Tensor) -> Tensor:
    return x * softplus(x).tanh()


def erf(x: Tensor) -> Tensor:
    """The error function (a primitive: math.erf on the reference runtime, an approximation with
    relative error below 1.2e-7 in the shaders)."""
    return unary("erf", x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """torch's GELU: ``x * Phi(x)`` with the exact erf (``approximate="none"``) or its tanh form."""
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (1.0 + inner.tanh())
    if approximate != "none":
        raise _fail(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


# -- normalisation -----------------------------------------------------------------------------------
def layer_norm(
    x: Tensor,
    normalized_shape: Any,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise over the trailing `normalized_shape` dims (biased variance), then scale and shift."""
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.ndim - len(shape) :] != shape:
        raise _fail(f"layer_norm: input {x.shape} does not end in normalized_shape {shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(axes, keepdim=True)
    y = centered / (var + eps).sqrt()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(||x||_p, eps) along `dim` (p = 2 or 1)."""
    if p == 2:
        norm = (x * x).sum(dim, keepdim=True).sqrt()
    elif p == 1:
        norm = x.abs().sum(dim, keepdim=True)
    else:
        raise _fail(f"normalize: p must be 1 or 2, got {p}")
    return x / maximum(norm, eps)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """torch's softmax(q k^T * scale + mask) v over the last two dims (batched matmuls).
    `attn_mask` is added to the scores (torch's float-mask form: glcomp tensors are float, so a
    boolean keep-mask must be given as 0 / -inf, or use `is_causal`). As in torch, `dropout_p`
    applies whenever it is positive: pass ``dropout_p=p if self.training else 0.0``."""
    from glcomp.ir.tensor import arange, le

    length, source = query.shape[-2], key.shape[-2]
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    att = (query @ key.transpose(-2, -1)) * s
    if is_causal:
        rows = reshape(arange(query.graph, length), (length, 1))
        cols = reshape(arange(query.graph, source), (1, source))
        keep = broadcast_to(le(cols - rows, 0.0), att.shape)
        att = where(keep, att, -math.inf)
    if attn_mask is not None:
        att = att + attn_mask
    att = softmax(att, -1)
    if dropout_p > 0:
        att = dropout(att, dropout_p, True)
    return att @ value


# -- lookups ---------------------------------------------------------------------------------------
def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of `weight` (V, D) picked by integer ids (any shape, fed as numbers): one_hot(ids) @
    weight, so the weight gradient is the sum of the output gradients per id. The row at
    `padding_idx` reads as zeros and gets no gradient."""
    if weight.ndim != 2:
        raise _fail(f"embedding weight must be (num_embeddings, embedding_dim), got {weight.shape}")
    rows = one_hot(input, weight.shape[0])
    if padding_idx is not None:
        keep = [0.0 if i == padding_idx % weight.shape[0] else 1.0 for i in range(weight.shape[0])]
        mask = reshape(_vector(weight.graph, keep), (weight.shape[0], 1))
        weight = weight * mask
    return rows @ weight


def _vector(graph: Any, values: Sequence[float]) -> Tensor:
    from glcomp.ir.tensor import cat

    return cat([const(graph, v, (1,)) for v in values])


# -- random ------------------------------------------------------------------------------------------
def _rng_step(graph: Any) -> Tensor:
    node = graph.inputs.get(RNG_STEP)
    if node is None:
        node = graph.add_input(RNG_STEP, (), "state")
    return Tensor(graph, node)


def rand(graph: Any, shape: tuple[int, ...]) -> Tensor:
    """Uniform values in [0, 1) of `shape`: a counter-based hash of (element, the step counter
    ``rng.step``, a seed per random call of the trace). The same on both runtimes, the same for
    the same step, new in each train step. The seeds follow glcomp.manual_seed."""
    from glcomp.ir.trace import active_trace
    from glcomp.nn.init import current_seed

    state = active_trace()
    if state is None:
        raise _fail("random ops (dropout) run only while a model is traced")
    call = state.random_calls
    state.random_calls += 1
    n = math.prod(shape)
    seed = float((current_seed() * 4099 + 7919 * call + 1) % (1 << 24))
    step = broadcast_to(_rng_step(graph), (n,))
    u = prim("hash_uniform", step, const(graph, seed, (n,)))
    return reshape(u, tuple(shape))


# cos(x) = sum_k (-1)^k x^(2k) / (2k)!, k <= 10: below 1e-9 from cos on [-pi, pi].
_COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(11))


def _cos_2pi(u: Tensor) -> Tensor:
    """cos(2 pi u) for u in [0, 1), as -cos(x) with x = 2 pi (u - 1/2) in [-pi, pi) by its Taylor
    polynomial (elementwise ops only, so both runtimes and every dialect compute it alike)."""
    x = (u - 0.5) * (2.0 * math.pi)
    x2 = x * x
    acc = x2 * _COS_TAYLOR[-1] + _COS_TAYLOR[-2]
    for c in reversed(_COS_TAYLOR[:-2]):
        acc = acc * x2 + c
    return -acc


def randn(graph: Any, shape: tuple[int, ...]) -> Tensor:
    """Standard normal values of `shape` from two `rand` draws by the Box-Muller transform,
    ``sqrt(-2 log(1 - u1)) cos(2 pi u2)`` (|z| < 5.8, as u1 has 24 bits): reproducible per step and
    seed as `rand`, new in each train step, the same on both runtimes up to float rounding."""
    u1, u2 = rand(graph, shape), rand(graph, shape)
    return ((1.0 - u1).log() * -2.0).sqrt() * _cos_2pi(u2)


def _keep(x: Tensor, shape: tuple[int, ...], p: float) -> Tensor:
    return ge(rand(x.graph, shape), p) * (1.0 / (1.0 - p))


def _dropout_checks(p: float) -> None:
    if not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise _fail(f"dropout probability has to be between 0 and 1, but got {p!r}")


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch's dropout: in training, each element is zeroed with probability `p` and the rest are
    scaled by 1 / (1 - p); otherwise the identity. Note that, as in torch, the functional form
    drops in both modes unless given ``training=self.training``."""
    _dropout_checks(p)
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0.0
    return x * _keep(x, x.shape, p)


def _channel_dropout(what: str, x: Tensor, p: float, training: bool, ranks: tuple[int, ...]) -> Tensor:
    _dropout_checks(p)
    if x.ndim not in ranks:
        raise _fail(f"{what} expects input of rank {' or '.join(map(str, ranks))}, got {x.shape}")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0.0
    # One draw per (sample, channel) of a batched input, per channel of an unbatched one.
    lead = 2 if x.ndim == ranks[-1] else 1
    mask_shape = x.shape[:lead] + (1,) * (x.ndim - lead)
    return x * broadcast_to(_keep(x, mask_shape, p), x.shape)


def dropout1d(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, L) or (C, L) inputs with probability `p`."""
    return _channel_dropout("dropout1d", x, p, training, (2, 3))


def dropout2d(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, H, W) or (C, H, W) inputs with probability `p`. A 2-D input
    (N, features), which torch accepts with a deprecation warning, drops single elements as
    `dropout` does (torch's behaviour), with the same warning."""
    if isinstance(x, Tensor) and x.ndim == 2:
        import warnings

        warnings.warn(
            "dropout2d: received a 2-D input, which torch deprecates; it drops single elements "
            "as dropout does (use nn.Dropout for a 2-D input)",
            UserWarning,
            stacklevel=2,
        )
        return dropout(x, p, training)
    return _channel_dropout("dropout2d", x, p, training, (3, 4))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    out = x @ weight.T
    return out + bias if bias is not None else out


def _dilate_kernel(w: Tensor, dilation: tuple[int, int]) -> Tensor:
    """The (.., KH, KW) kernel spread out to ((KH - 1) dh + 1, (KW - 1) dw + 1) with zeros
    between its taps: movement ops only (reshape, pad, slice), so gradients flow back to the taps
    and the convolution primitives run unchanged."""
    dh, dw = dilation
    if (dh, dw) == (1, 1):
        return w
    *lead, kh, kw = w.shape
    spread = reshape(w, (*lead, kh, 1, kw, 1))
    rank = spread.ndim
    after = tuple(dh - 1 if i == rank - 3 else dw - 1 if i == rank - 1 else 0 for i in range(rank))
    spread = prim("pad", spread, before=(0,) * rank, after=after)
    spread = reshape(spread, (*lead, kh * dh, kw * dw))
    return prim("slice", spread, starts=(0,) * len(spread.shape),
                stops=(*lead, (kh - 1) * dh + 1, (kw - 1) * dw + 1))  # fmt: skip


def _positive_pair(what: str, name: str, v: Any, minimum: int = 1) -> tuple[int, int]:
    pair = _pair(v)
    if min(pair) < minimum:
        raise _fail(f"{what}: {name} must be at least {minimum}, got {v!r}")
    return pair


def _group_checks(what: str, x: Tensor, weight: Tensor, groups: int, transposed: bool) -> None:
    if x.ndim != 4:
        raise _fail(f"{what} expects input of shape (N, C, H, W), got {x.shape}")
    if weight.ndim != 4:
        raise _fail(f"{what} expects a 4-D weight, got {weight.shape}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise _fail(f"{what}: groups must be a positive integer, got {groups!r}")
    if transposed:
        if x.shape[1] != weight.shape[0] or weight.shape[0] % groups:
            raise _fail(
                f"{what}: input {x.shape} and weight {weight.shape} with groups={groups} do not match "
                f"(weight (in_channels, out_channels / groups, kH, kW), in_channels divisible by groups)"
            )
    elif x.shape[1] != weight.shape[1] * groups or weight.shape[0] % groups:
        raise _fail(
            f"{what}: input {x.shape} and weight {weight.shape} with groups={groups} do not match "
            f"(weight (out_channels, in_channels / groups, kH, kW), out_channels divisible by groups)"
        )


def _group_attrs(groups: int) -> dict[str, int]:
    """The primitives' ``groups`` attribute: absent for an ungrouped convolution."""
    return {"groups": groups} if groups != 1 else {}


def _same_padding(kernel: tuple[int, int], dilation: tuple[int, int]) -> tuple[tuple[int, int], list[int]]:
    """padding="same" as torch: total d (k - 1) per axis, the odd one extra at the bottom/right."""
    totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    sym = (totals[0] // 2, totals[1] // 2)
    return sym, [0, totals[1] % 2, 0, totals[0] % 2]


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """torch's conv2d (NCHW input, (O, C / groups, KH, KW) weight). Dilation spreads the kernel
    with zeros (movement ops); a grouped (or depthwise) convolution is one primitive over every
    group.
    ``padding`` may be ints, "valid" or "same" (stride 1; the odd extra row/column goes at the
    bottom/right as in torch)."""
    _group_checks("conv2d", x, weight, groups, False)
    stride = _positive_pair("conv2d", "stride", stride)
    dilation = _positive_pair("conv2d", "dilation", dilation)
    if padding == "valid":
        padding = 0
    if padding == "same":
        if stride != (1, 1):
            raise _fail("conv2d: padding='same' is not supported for strided convolutions")
        padding, extra = _same_padding(weight.shape[2:], dilation)
        if any(extra):
            x = pad(x, extra)
    padding = _positive_pair("conv2d", "padding", padding, 0)
    w = _dilate_kernel(weight, dilation)
    out = prim("conv2d", x, w, stride=stride, padding=padding, **_group_attrs(groups))
    if bias is not None:
        out = out + bias.reshape(1, -1, 1, 1)
    return out


def conv_transpose2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """torch's conv_transpose2d: the adjoint of conv2d in its input (the conv2d_input_grad
    primitive), weight (C_in, C_out / groups, KH, KW). Output size per axis
    ``(H - 1) stride - 2 padding + dilation (KH - 1) + output_padding + 1``; ``output_padding``
    must be smaller than stride or dilation, as in torch."""
    _group_checks("conv_transpose2d", x, weight, groups, True)
    what = "conv_transpose2d"
    stride, dilation = _positive_pair(what, "stride", stride), _positive_pair(what, "dilation", dilation)
    padding = _positive_pair(what, "padding", padding, 0)
    output_padding = _positive_pair(what, "output_padding", output_padding, 0)
    for op, s, d in zip(output_padding, stride, dilation, strict=True):
        if op >= max(s, d):
            raise _fail(
                f"{what}: output_padding {output_padding} must be smaller than stride {stride} "
                f"or dilation {dilation}"
            )
    w = _dilate_kernel(weight, dilation)
    keff = w.shape[2:]
    full = tuple((n - 1) * s + k for n, s, k in zip(x.shape[2:], stride, keff, strict=True))
    size = tuple(f - 2 * p + op for f, p, op in zip(full, padding, output_padding, strict=True))
    if min(size) < 1:
        raise _fail(f"{what}: input {x.shape} gives an empty output {size} with padding {padding}")
    direct = all(op < s for op, s in zip(output_padding, stride, strict=True))
    kw = _group_attrs(groups)
    if direct:  # the adjoint of a conv2d over an input of `size` (output_padding < stride)
        out = prim("conv2d_input_grad", x, w, stride=stride, padding=padding, input_hw=size, **kw)
    else:  # scatter onto the whole unpadded extent, then crop (and zero-extend) to `size`
        out = prim("conv2d_input_grad", x, w, stride=stride, padding=(0, 0), input_hw=full, **kw)
        for axis, (p, n, f) in enumerate(zip(padding, size, full, strict=True)):
            out = slice_axis(out, axis + 2, p, min(p + n, f))
        grow = [0, max(0, padding[1] + size[1] - full[1]), 0, max(0, padding[0] + size[0] - full[0])]
        out = pad(out, grow) if any(grow) else out
    if bias is not None:
        out = out + bias.reshape(1, -1, 1, 1)
    return out


def _nearest_sources(n_in: int, n_out: int, scale: float | None) -> list[int]:
    """torch's nearest (legacy) sampling: source index floor(i * s) in float32, clamped, with
    s = 1 / scale_factor when a scale factor is given, else n_in / n_out."""
    import numpy as np

    s = np.float32(1.0 / scale) if scale is not None else np.float32(n_in) / np.float32(n_out)
    return [min(int(np.floor(np.float32(i) * s)), n_in - 1) for i in range(n_out)]


def _gather_axis(x: Tensor, axis: int, sources: list[int]) -> Tensor:
    """x's slices along `axis` at `sources` (ascending) by movement ops: an integer repeat
    factor is a reshape and broadcast; otherwise runs of one source are sliced and broadcast."""
    from glcomp.ir.tensor import cat

    n = x.shape[axis]
    if sources == list(range(n)):
        return x
    factor = len(sources) // n
    if factor * n == len(sources) and sources == [i // factor for i in range(len(sources))]:
        shape = x.shape[: axis + 1] + (1,) + x.shape[axis + 1 :]
        wide = x.shape[: axis + 1] + (factor,) + x.shape[axis + 1 :]
        y = broadcast_to(reshape(x, shape), wide)
        return reshape(y, x.shape[:axis] + (n * factor,) + x.shape[axis + 1 :])
    parts: list[Tensor] = []
    i = 0
    while i < len(sources):
        j = i
        while j < len(sources) and sources[j] == sources[i]:
            j += 1
        piece = slice_axis(x, axis, sources[i], sources[i] + 1)
        parts.append(broadcast_to(piece, x.shape[:axis] + (j - i,) + x.shape[axis + 1 :]))
        i = j
    return cat(parts, axis)


def interpolate(
    x: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: Any = None,
    recompute_scale_factor: Any = None,
    antialias: bool = False,
) -> Tensor:
    """torch's interpolate for mode "nearest" on (N, C, H, W) input, by movement ops (an integer
    factor is a reshape and a broadcast; the gradient sums each source's copies). Exactly one of
    ``size`` and ``scale_factor``; other modes raise GlcompError."""
    if mode != "nearest":
        raise _fail(f"interpolate: mode {mode!r} is not supported (only 'nearest')")
    if x.ndim != 4:
        raise _fail(f"interpolate expects input of shape (N, C, H, W), got {x.shape}")
    if (size is None) == (scale_factor is None):
        raise _fail("interpolate: give exactly one of size and scale_factor")
    hw = x.shape[2:]
    if size is not None:
        out = _pair(size)
        scales: tuple[Any, Any] = (None, None)
    else:
        scales = (
            (float(scale_factor[0]), float(scale_factor[1]))
            if isinstance(scale_factor, tuple | list)
            else (float(scale_factor),) * 2
        )
        out = (math.floor(hw[0] * scales[0]), math.floor(hw[1] * scales[1]))
        if recompute_scale_factor:
            scales = (None, None)
    if min(out) < 1:
        raise _fail(f"interpolate: output size {out} of input {x.shape} must be positive")
    for axis in (2, 3):
        x = _gather_axis(x, axis, _nearest_sources(hw[axis - 2], out[axis - 2], scales[axis - 2]))
    return x


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """torch's adaptive_avg_pool2d: output cell i of an axis averages input rows
    [floor(i H / OH), ceil((i + 1) H / OH)). When OH divides H (and OW divides W) this is
    avg_pool2d; otherwise each axis is averaged separately over its bins (slices and means, as
    a rectangle's mean is the mean of its rows' means). ``None`` keeps that axis's size."""
    if x.ndim != 4:
        raise _fail(f"adaptive_avg_pool2d expects input of shape (N, C, H, W), got {x.shape}")
    sizes = output_size if isinstance(output_size, tuple | list) else (output_size, output_size)
    hw = x.shape[2:]
    out = tuple(n if s is None else int(s) for s, n in zip(sizes, hw, strict=True))
    if min(out) < 1:
        raise _fail(f"adaptive_avg_pool2d: output size {output_size} must be positive")
    if all(n % o == 0 for n, o in zip(hw, out, strict=True)):
        kernel = (hw[0] // out[0], hw[1] // out[1])
        return x if kernel == (1, 1) else avg_pool2d(x, kernel)
    from glcomp.ir.tensor import cat

    for axis, (n, o) in enumerate(zip(hw, out, strict=True), start=2):
        if n == o:
            continue
        bins = [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]
        x = cat([slice_axis(x, axis, lo, hi).mean(axis, keepdim=True) for lo, hi in bins], axis)
    return x


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    k = _pair(kernel_size)
    s = _pair(stride) if stride is not None else k
    return prim("max_pool2d", x, kernel=k, stride=s, padding=_pair(padding))


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    k = _pair(kernel_size)
    s = _pair(stride) if stride is not None else k
    return prim("avg_pool2d", x, kernel=k, stride=s, padding=_pair(padding))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return x.flatten(start_dim, end_dim)


def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """torch's F.pad with zeros: `pad` lists (before, after) pairs from the last dim backwards."""
    if mode != "constant" or value != 0.0 or len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise _fail(f"pad: only zero padding with (before, after) pairs is supported, got {pad}, {mode!r}")
    before, after = [0] * x.ndim, [0] * x.ndim
    for k in range(len(pad) // 2):
        before[x.ndim - 1 - k], after[x.ndim - 1 - k] = int(pad[2 * k]), int(pad[2 * k + 1])
    if min(before + after) < 0:
        raise _fail("pad: negative padding is not supported")
    return prim("pad", x, before=tuple(before), after=tuple(after))


def batch_norm_train(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Normalise with batch statistics; returns (normalised, mean, biased variance)."""
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(axes, keepdim=True)
    return centered / (var + eps).sqrt(), mean, var


__all__ = [
    "RNG_STEP",
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "batch_norm_train",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "conv2d",
    "conv_transpose2d",
    "cross_entropy",
    "dropout",
    "dropout1d",
    "dropout2d",
    "elu",
    "embedding",
    "erf",
    "exp",
    "flatten",
    "gelu",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "huber_loss",
    "interpolate",
    "kl_div",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "linear",
    "log",
    "log_softmax",
    "max_pool2d",
    "mish",
    "mse_loss",
    "nll_loss",
    "normalize",
    "one_hot",
    "pad",
    "rand",
    "relu",
    "relu6",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "smooth_l1_loss",
    "softmax",
    "softplus",
    "tanh",
]


def _traced_only(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, refusing numpy arrays when no traced tensor is given with them: these functions
    build the graph `glcomp.compile` traces (a raw AttributeError from deep inside otherwise)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        if not any(isinstance(v, Tensor) for v in values):
            arrays = [type(v).__name__ for v in values if isinstance(v, np.ndarray | np.generic)]
            if arrays:
                raise GlcompError(
                    f"F.{name} works on the tensors of a model being compiled, not on numpy arrays "
                    f"(got {arrays[0]}): compile the model first (prog = glcomp.compile(model, inputs, "
                    "loss, optimizer)) and run it with prog.runtime(...).predict / train_step"
                )
        return fn(*args, **kwargs)

    return call


for _name in __all__:
    if _name not in ("RNG_STEP", "rand") and callable(globals()[_name]):
        globals()[_name] = _traced_only(_name, globals()[_name])
del _name
