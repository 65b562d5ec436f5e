"""The torch.nn layers glcomp supports, with torch's names, shapes and defaults."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor, _fail
from glcomp.ir.trace import active_trace
from glcomp.nn import functional as F
from glcomp.nn.init import fan_in_bound, uniform
from glcomp.nn.module import Module, Parameter
from glcomp.nn.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell  # noqa: F401 - their home


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def _need(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise _fail(f"expected a tensor as {what}, got {type(x).__name__}")
    return x


class ModuleList(Module):
    """torch.nn.ModuleList: sub-modules named "0", "1", ... (torch's parameter names)."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise GlcompError(f"ModuleList holds glcomp.nn modules, got {type(module).__name__}")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Any) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for m in items:
            self.append(m)

    def __getitem__(self, i: Any) -> Any:
        items = list(self._modules.values())
        return ModuleList(items[i]) if isinstance(i, slice) else items[i]

    def __setitem__(self, i: int, module: Module) -> None:
        key = list(self._modules)[i]
        self._modules[key] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Any:
        return iter(list(self._modules.values()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise GlcompError("ModuleList has no forward(): call its modules in your own forward()")


class ModuleDict(Module):
    """torch.nn.ModuleDict: sub-modules by name, in insertion order."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules: Any) -> None:
        items = modules.items() if hasattr(modules, "items") else modules
        for name, m in items:
            self[name] = m

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise GlcompError(f"ModuleDict[{name!r}] must be a glcomp.nn module, got {type(module).__name__}")
        self.add_module(name, module)

    def __contains__(self, name: str) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Any:
        return iter(list(self._modules))

    def keys(self) -> Any:
        return self._modules.keys()

    def values(self) -> Any:
        return self._modules.values()

    def items(self) -> Any:
        return self._modules.items()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise GlcompError("ModuleDict has no forward(): call its modules in your own forward()")


class Sequential(Module):
    def __init__(self, *modules: Module) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x


class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = fan_in_bound(in_features)
        self.weight = Parameter(uniform((out_features, in_features), bound))
        if bias:
            self.bias = Parameter(uniform((out_features,), bound))
        else:
            self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise _fail(f"input expected shape (..., {self.in_features}) but got {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def _groups_of(owner: str, in_channels: int, out_channels: int, groups: Any) -> int:
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise GlcompError(f"{owner}: groups must be a positive integer, got {groups!r}")
    for what, n in (("in_channels", in_channels), ("out_channels", out_channels)):
        if n % groups:
            raise GlcompError(f"{owner}: {what} ({n}) must be divisible by groups ({groups})")
    return groups


def _at_least(owner: str, what: str, v: Any, minimum: int) -> tuple[int, int]:
    pair = _pair(v)
    if min(pair) < minimum:
        raise GlcompError(f"{owner}: {what} must be at least {minimum}, got {v!r}")
    return pair


def _zeros_mode(owner: str, padding_mode: str) -> None:
    if padding_mode != "zeros":
        raise GlcompError(f"{owner}: padding_mode {padding_mode!r} is not supported (only 'zeros')")


class Conv2d(Module):
    """torch.nn.Conv2d: stride, padding (ints, "valid", "same"), dilation, groups, bias; weight
    (out_channels, in_channels / groups, kH, kW)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        _zeros_mode("Conv2d", padding_mode)
        self.groups = _groups_of("Conv2d", in_channels, out_channels, groups)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _at_least("Conv2d", "kernel_size", kernel_size, 1)
        self.stride = _at_least("Conv2d", "stride", stride, 1)
        self.dilation = _at_least("Conv2d", "dilation", dilation, 1)
        if padding == "valid":
            padding = 0
        if padding == "same":
            if self.stride != (1, 1):
                raise GlcompError("Conv2d: padding='same' is not supported for strided convolutions")
            self.padding: Any = "same"
        else:
            self.padding = _at_least("Conv2d", "padding", padding, 0)
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = fan_in_bound(fan_in)
        self.weight = Parameter(uniform((out_channels, in_channels // groups, *self.kernel_size), bound))
        self.bias = Parameter(uniform((out_channels,), bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise _fail(f"input expected shape (N, {self.in_channels}, H, W) but got {x.shape}")
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}"
        )
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        return s + (f", groups={self.groups}" if self.groups != 1 else "")


class ConvTranspose2d(Module):
    """torch.nn.ConvTranspose2d: the adjoint of Conv2d in its input, with stride, padding,
    output_padding (smaller than stride or dilation), groups, dilation, bias; weight
    (in_channels, out_channels / groups, kH, kW). ``forward(x, output_size=None)`` as torch."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        owner = "ConvTranspose2d"
        _zeros_mode(owner, padding_mode)
        self.groups = _groups_of(owner, in_channels, out_channels, groups)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _at_least(owner, "kernel_size", kernel_size, 1)
        self.stride = _at_least(owner, "stride", stride, 1)
        self.dilation = _at_least(owner, "dilation", dilation, 1)
        self.padding = _at_least(owner, "padding", padding, 0)
        self.output_padding = _at_least(owner, "output_padding", output_padding, 0)
        for op, st, d in zip(self.output_padding, self.stride, self.dilation, strict=True):
            if op >= max(st, d):
                raise GlcompError(
                    f"{owner}: output_padding {self.output_padding} must be smaller than stride "
                    f"{self.stride} or dilation {self.dilation}"
                )
        # torch computes the fan-in of a transposed weight from its dim 1 (out_channels / groups).
        bound = fan_in_bound(out_channels // groups * self.kernel_size[0] * self.kernel_size[1])
        self.weight = Parameter(uniform((in_channels, out_channels // groups, *self.kernel_size), bound))
        self.bias = Parameter(uniform((out_channels,), bound)) if bias else None

    def forward(self, x: Tensor, output_size: Any = None) -> Tensor:
        x = _need(x, "input")
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise _fail(f"input expected shape (N, {self.in_channels}, H, W) but got {x.shape}")
        output_padding = self.output_padding
        if output_size is not None:
            want = tuple(int(v) for v in tuple(output_size)[-2:])
            base = [
                (n - 1) * s - 2 * p + d * (k - 1) + 1
                for n, s, p, d, k in zip(x.shape[2:], self.stride, self.padding, self.dilation,
                                         self.kernel_size, strict=True)
            ]  # fmt: skip
            output_padding = tuple(w - b for w, b in zip(want, base, strict=True))
            if any(not 0 <= op < max(s, d) for op, s, d in zip(output_padding, self.stride, self.dilation)):
                raise _fail(
                    f"ConvTranspose2d: output_size {want} is not reachable from input {x.shape} "
                    f"(sizes from {tuple(base)} to "
                    f"{tuple(b + max(s, d) - 1 for b, s, d in zip(base, self.stride, self.dilation))})"
                )
        return F.conv_transpose2d(
            x, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}"
        )
        if self.output_padding != (0, 0):
            s += f", output_padding={self.output_padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        return s + (f", groups={self.groups}" if self.groups != 1 else "")


class Upsample(Module):
    """torch.nn.Upsample with mode "nearest" (other modes raise GlcompError): exactly one of
    ``size`` and ``scale_factor``; see F.interpolate."""

    def __init__(
        self,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: Any = None,
        recompute_scale_factor: Any = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if mode != "nearest":
            raise GlcompError(f"{name}: mode {mode!r} is not supported (only 'nearest')")
        if (size is None) == (scale_factor is None):
            raise GlcompError(f"{name}: give exactly one of size and scale_factor")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        if x.ndim != 4:
            raise _fail(f"{type(self).__name__}: input expected shape (N, C, H, W) but got {x.shape}")
        return F.interpolate(
            x, self.size, self.scale_factor, self.mode, recompute_scale_factor=self.recompute_scale_factor
        )

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """torch.nn.UpsamplingNearest2d: Upsample with mode "nearest"."""

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, "nearest")


class AdaptiveAvgPool2d(Module):
    """torch.nn.AdaptiveAvgPool2d: ``output_size`` an int or a pair (None keeps that axis);
    see F.adaptive_avg_pool2d."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        sizes = output_size if isinstance(output_size, tuple | list) else (output_size, output_size)
        if len(sizes) != 2 or any(s is not None and (not isinstance(s, int) or s < 1) for s in sizes):
            raise GlcompError(
                f"AdaptiveAvgPool2d: output_size must be a positive int or a pair of them (or None), "
                f"got {output_size!r}"
            )
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        if x.ndim != 4:
            raise _fail(f"AdaptiveAvgPool2d: input expected shape (N, C, H, W) but got {x.shape}")
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _Pool(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride) if stride is not None else self.kernel_size
        self.padding = _pair(padding)

    def _check(self, x: Any) -> Tensor:
        x = _need(x, "input")
        if x.ndim != 4:
            raise _fail(f"input expected shape (N, C, H, W) but got {x.shape}")
        return x

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


def _refuse_options(owner: str, **unsupported: bool) -> None:
    """GlcompError naming the torch constructor options set to a value glcomp does not support."""
    named = [name for name, used in unsupported.items() if used]
    if named:
        raise GlcompError(f"{owner}: {', '.join(named)} other than torch's default are not supported yet")


class MaxPool2d(_Pool):
    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__(kernel_size, stride, padding)
        _refuse_options(
            "MaxPool2d",
            dilation=_pair(dilation) != (1, 1),
            return_indices=return_indices,
            ceil_mode=ceil_mode,
        )

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(self._check(x), self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool):
    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__(kernel_size, stride, padding)
        _refuse_options(
            "AvgPool2d",
            ceil_mode=ceil_mode,
            count_include_pad=not count_include_pad,
            divisor_override=divisor_override is not None,
        )

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(self._check(x), self.kernel_size, self.stride, self.padding)


class ReLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Softmax(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)


class LogSoftmax(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, self.dim)


class GELU(Module):
    """x * Phi(x) with the exact erf (``approximate="none"``, torch's default) or the tanh form."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise GlcompError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)


class SiLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Mish(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return F.mish(x)


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x, self.alpha)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Tensor) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val)


class ReLU6(Hardtanh):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0)


class Hardswish(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return F.hardswish(x)


class _DropoutNd(Module):
    """Dropout layers: active in train mode (gradients, train_step), the identity in eval mode
    (predict). Masks come from a counter-based hash of (element, step, seed): see F.dropout."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise GlcompError(
                f"{type(self).__name__}: dropout probability has to be between 0 and 1, got {p!r}"
            )
        self.p = float(p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Dropout(_DropoutNd):
    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(_need(x, "input"), self.p, self.training)


class Dropout1d(_DropoutNd):
    def forward(self, x: Tensor) -> Tensor:
        return F.dropout1d(_need(x, "input"), self.p, self.training)


class Dropout2d(_DropoutNd):
    def forward(self, x: Tensor) -> Tensor:
        return F.dropout2d(_need(x, "input"), self.p, self.training)


class LayerNorm(Module):
    """torch.nn.LayerNorm over the trailing `normalized_shape` dims (weight ones, bias zeros)."""

    def __init__(
        self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True
    ) -> None:
        super().__init__()
        shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = Parameter(np.ones(shape, np.float32)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(shape, np.float32)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(_need(x, "input"), self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    """torch.nn.Embedding: weight (num_embeddings, embedding_dim) drawn from N(0, 1); the ids
    are fed as numbers (float32 holds integers exactly up to 2^24)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None) -> None:
        super().__init__()
        from glcomp.nn.init import normal_

        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = Parameter(np.zeros((num_embeddings, embedding_dim), np.float32))
        normal_(self.weight)
        if padding_idx is not None:
            self.weight.data[padding_idx] = 0.0

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(_need(ids, "input"), self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Unflatten(Module):
    def __init__(self, dim: int, unflattened_size: Any) -> None:
        super().__init__()
        self.dim, self.sizes = dim, tuple(unflattened_size)

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        d = self.dim % x.ndim
        return x.reshape(x.shape[:d] + self.sizes + x.shape[d + 1 :])


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return _need(x, "input").flatten(self.start_dim, self.end_dim)


class _BatchNorm(Module):
    """Batch statistics in training (running statistics updated as torch does: momentum
    average, unbiased variance), running statistics in eval mode."""

    ranks: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if momentum is None:
            raise GlcompError(
                f"{type(self).__name__}: momentum=None (a cumulative average of the running "
                "statistics) is not supported yet; give a momentum such as 0.1"
            )
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(np.ones(num_features, np.float32))
            self.bias = Parameter(np.zeros(num_features, np.float32)) if bias else None
        else:
            self.weight = self.bias = None
        if track_running_stats:  # else batch statistics in eval mode too, and no buffers (torch's)
            self.register_buffer("running_mean", np.zeros(num_features, np.float32))
            self.register_buffer("running_var", np.ones(num_features, np.float32))
            self.register_buffer("num_batches_tracked", np.array(0, dtype=np.int64))

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        if x.ndim not in self.ranks or x.shape[1] != self.num_features:
            raise _fail(
                f"input expected rank {' or '.join(map(str, self.ranks))} with {self.num_features} "
                f"channels at dim 1 but got {x.shape}"
            )
        axes = tuple(i for i in range(x.ndim) if i != 1)
        shape = tuple(self.num_features if i == 1 else 1 for i in range(x.ndim))
        if not self.track_running_stats:
            y = F.batch_norm_train(x, axes, self.eps)[0]
        elif self.training:
            y, mean, var = F.batch_norm_train(x, axes, self.eps)
            n = math.prod(x.shape[i] for i in axes)
            state = active_trace()
            path = state.paths.get(id(self), "") if state else ""
            prefix = f"{path}." if path else ""
            m = self.momentum
            unbiased = var.reshape(self.num_features) * (n / max(n - 1, 1))
            # A module called more than once in a step updates from its previous call's statistics,
            # as torch's in-place updates do.
            updates = state.buffer_updates if state is not None else {}
            old_mean = updates.get(prefix + "running_mean", self.running_mean)
            old_var = updates.get(prefix + "running_var", self.running_var)
            new_mean = old_mean * (1 - m) + mean.reshape(self.num_features) * m
            new_var = old_var * (1 - m) + unbiased * m
            if state is not None:
                state.buffer_updates[prefix + "running_mean"] = new_mean
                state.buffer_updates[prefix + "running_var"] = new_var
        else:
            mean = self.running_mean.reshape(shape)
            var = self.running_var.reshape(shape)
            y = (x - mean) / (var + self.eps).sqrt()
        if self.weight is not None:
            y = y * self.weight.reshape(shape)
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        return y

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    ranks = (4,)


_REDUCTIONS = ("mean", "sum", "none")


class _Loss(Module):
    """Base of the loss modules. ``reduction`` as torch: "mean", "sum" or "none" (a loss given to
    glcomp.compile must reduce to a scalar)."""

    reductions: tuple[str, ...] = _REDUCTIONS

    def __init__(self, size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> None:
        super().__init__()
        if isinstance(size_average, str):  # glcomp's earlier positional form: MSELoss("sum")
            reduction = size_average
        if reduction not in self.reductions:
            raise GlcompError(
                f"{type(self).__name__}: reduction must be one of {self.reductions}, got {reduction!r}"
            )
        self.reduction = reduction

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        """Shape, dtype and (for class labels) the class count of the target this loss takes;
        by default a float target shaped like the output."""
        return {"shape": output_shape, "dtype": "float32"}


class _ClassLoss(_Loss):
    def __init__(self, weight: Any = None, size_average: Any = None, ignore_index: int = -100,
                 reduce: Any = None, reduction: str = "mean") -> None:  # fmt: skip
        super().__init__(size_average, reduce, reduction)
        if weight is not None:
            raise GlcompError(f"{type(self).__name__}: class weights are not supported yet")
        self.ignore_index = ignore_index

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        if len(output_shape) != 2:
            raise GlcompError(f"{type(self).__name__} expects model output (N, C), got {output_shape}")
        return {"shape": output_shape[:1], "dtype": "int32", "num_classes": output_shape[1]}


class CrossEntropyLoss(_ClassLoss):
    def __init__(
        self,
        weight: Any = None,
        size_average: Any = None,
        ignore_index: int = -100,
        reduce: Any = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, ignore_index, reduce, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(
            logits,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class NLLLoss(_ClassLoss):
    def forward(self, log_probs: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(log_probs, target, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(
        self, size_average: Any = None, reduce: Any = None, reduction: str = "mean", beta: float = 1.0
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.huber_loss(input, target, self.reduction, self.delta)


class BCELoss(_Loss):
    """Binary cross-entropy on probabilities (e.g. after a Sigmoid); targets in [0, 1]."""

    def __init__(
        self, weight: Any = None, size_average: Any = None, reduce: Any = None, reduction: str = "mean"
    ) -> None:
        if isinstance(weight, str):  # the earlier positional form BCELoss("sum")
            weight, reduction = None, weight
        super().__init__(size_average, reduce, reduction)
        _refuse_options("BCELoss", weight=weight is not None)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy(input, target, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid + binary cross-entropy in one stable expression; ``pos_weight`` a float or None."""

    def __init__(self, weight: Any = None, size_average: Any = None, reduce: Any = None,
                 reduction: str = "mean", pos_weight: Any = None) -> None:  # fmt: skip
        super().__init__(size_average, reduce, reduction)
        if weight is not None or not (pos_weight is None or isinstance(pos_weight, int | float)):
            raise GlcompError("BCEWithLogitsLoss: weight and tensor pos_weight are not supported yet")
        self.pos_weight = pos_weight

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(
            input, target, reduction=self.reduction, pos_weight=self.pos_weight
        )


class KLDivLoss(_Loss):
    """KL divergence with `input` as log-probabilities; reduction also "batchmean" (torch's
    mathematically correct choice)."""

    reductions = (*_REDUCTIONS, "batchmean")

    def __init__(self, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                 log_target: bool = False) -> None:  # fmt: skip
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)
