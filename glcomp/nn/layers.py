"""The torch.nn layers glcomp supports, with torch's names, shapes and defaults."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor, _fail, stack
from glcomp.nn import functional as F
from glcomp.nn.init import fan_in_bound, uniform
from glcomp.nn.module import Module, Parameter, active_trace


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def _need(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise _fail(f"expected a tensor as {what}, got {type(x).__name__}")
    return x


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


class Conv2d(Module):
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
    ) -> None:
        super().__init__()
        if _pair(dilation) != (1, 1) or groups != 1:
            raise GlcompError("Conv2d: dilation and groups other than 1 are not supported yet")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        if padding == "valid":
            padding = 0
        elif padding == "same":
            if self.stride != (1, 1) or any(k % 2 == 0 for k in self.kernel_size):
                raise GlcompError("Conv2d: padding='same' needs stride 1 and odd kernel sizes")
            padding = (self.kernel_size[0] // 2, self.kernel_size[1] // 2)
        self.padding = _pair(padding)
        bound = fan_in_bound(in_channels * self.kernel_size[0] * self.kernel_size[1])
        self.weight = Parameter(uniform((out_channels, in_channels, *self.kernel_size), bound))
        self.bias = Parameter(uniform((out_channels,), bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        x = _need(x, "input")
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise _fail(f"input expected shape (N, {self.in_channels}, H, W) but got {x.shape}")
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}"
        )


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


class MaxPool2d(_Pool):
    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(self._check(x), self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool):
    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(self._check(x), self.kernel_size, self.stride, self.padding)


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01) -> None:
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
        self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True
    ) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        if affine:
            self.weight = Parameter(np.ones(num_features, np.float32))
            self.bias = Parameter(np.zeros(num_features, np.float32))
        else:
            self.weight = self.bias = None
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
        if self.training:
            y, mean, var = F.batch_norm_train(x, axes, self.eps)
            n = math.prod(x.shape[i] for i in axes)
            state = active_trace()
            path = state.paths.get(id(self), "") if state else ""
            prefix = f"{path}." if path else ""
            m = self.momentum
            unbiased = var.reshape(self.num_features) * (n / max(n - 1, 1))
            new_mean = self.running_mean * (1 - m) + mean.reshape(self.num_features) * m
            new_var = self.running_var * (1 - m) + unbiased * m
            if state is not None:
                state.buffer_updates[prefix + "running_mean"] = new_mean
                state.buffer_updates[prefix + "running_var"] = new_var
        else:
            mean = self.running_mean.reshape(shape)
            var = self.running_var.reshape(shape)
            y = (x - mean) / (var + self.eps).sqrt()
        if self.weight is not None:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    ranks = (4,)


class LSTM(Module):
    """One-layer LSTM with torch's weights and gate order (i, f, g, o), unrolled over time."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
    ) -> None:
        super().__init__()
        if num_layers != 1:
            raise GlcompError("LSTM: only num_layers=1 is supported yet (stack LSTM modules instead)")
        self.input_size, self.hidden_size, self.batch_first = input_size, hidden_size, batch_first
        k = 1.0 / math.sqrt(hidden_size)
        self.weight_ih_l0 = Parameter(uniform((4 * hidden_size, input_size), k))
        self.weight_hh_l0 = Parameter(uniform((4 * hidden_size, hidden_size), k))
        if bias:
            self.bias_ih_l0 = Parameter(uniform((4 * hidden_size,), k))
            self.bias_hh_l0 = Parameter(uniform((4 * hidden_size,), k))
        else:
            self.bias_ih_l0 = self.bias_hh_l0 = None

    def forward(self, x: Tensor, hx: Any = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x = _need(x, "input")
        if x.ndim != 3 or x.shape[2] != self.input_size:
            layout = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
            raise _fail(f"input expected shape {layout} with input_size {self.input_size} but got {x.shape}")
        if hx is not None:
            raise _fail("LSTM: initial states (h0, c0) are not supported yet; they start at zero")
        if not self.batch_first:
            x = x.transpose(0, 1)
        n, steps, _ = x.shape
        hsz = self.hidden_size
        # One matmul projects every time step's input; only the recurrent part is per step.
        xw = F.linear(x.reshape(n * steps, self.input_size), self.weight_ih_l0, self.bias_ih_l0)
        xw = xw.reshape(n, steps, 4 * hsz)
        h = c = None
        outputs = []
        for t in range(steps):
            gates = xw[:, t]
            if h is not None:  # h starts at zero, so step 0 has no recurrent term
                gates = gates + h @ self.weight_hh_l0.T
            if self.bias_hh_l0 is not None:
                gates = gates + self.bias_hh_l0
            i = gates[:, 0:hsz].sigmoid()
            f = gates[:, hsz : 2 * hsz].sigmoid()
            g = gates[:, 2 * hsz : 3 * hsz].tanh()
            o = gates[:, 3 * hsz :].sigmoid()
            c = i * g if c is None else f * c + i * g
            h = o * c.tanh()
            outputs.append(h)
        out = stack(outputs, 1)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, (h.unsqueeze(0), c.unsqueeze(0))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, batch_first={self.batch_first}"


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        """Shape, dtype and (for class labels) the class count of the target this loss takes."""
        raise GlcompError(f"{type(self).__name__} does not say what target it takes (target_spec)")


class CrossEntropyLoss(_Loss):
    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits, target, self.reduction)

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        if len(output_shape) != 2:
            raise GlcompError(f"CrossEntropyLoss expects model output (N, C), got {output_shape}")
        return {"shape": output_shape[:1], "dtype": "int32", "num_classes": output_shape[1]}


class MSELoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        return {"shape": output_shape, "dtype": "float32"}
