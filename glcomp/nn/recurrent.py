"""torch.nn's recurrent layers (RNN, LSTM, GRU) and their cells, unrolled over time at trace time.

Every time step becomes ordinary primitives of the graph (matmul, add, mul, sigmoid, tanh, relu,
slices and stacks), so the shaders, the autodiff and both runtimes need nothing recurrent. The
parameters carry torch's names, shapes, gate orders and default initialisation, so a torch
state_dict loads by name:

- ``RNN``: ``h' = act(W_ih x + b_ih + W_hh h + b_hh)`` with ``act`` tanh or relu.
- ``LSTM``: gates (i, f, g, o) stacked in ``weight_ih`` / ``weight_hh`` of 4 * hidden rows,
  ``c' = f c + i g``, ``h' = o tanh(c')``.
- ``GRU``: gates (r, z, n) in 3 * hidden rows, ``n = tanh(W_in x + b_in + r (W_hn h + b_hn))``,
  ``h' = (1 - z) n + z h``.

Layers are named ``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` (and the
same with ``_reverse`` for the second direction); cells ``weight_ih``, ``weight_hh``, ``bias_ih``,
``bias_hh``. Everything starts uniform in +-1/sqrt(hidden_size), as torch's ``reset_parameters``.
"""

from __future__ import annotations

import math
from typing import Any

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor, _fail, cat, stack
from glcomp.nn import functional as F
from glcomp.nn.init import uniform
from glcomp.nn.module import Module, Parameter

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _step(
    mode: str,
    gx: Tensor,
    h: Tensor | None,
    c: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """One time step of one direction of one layer, from the input projection ``gx`` (W_ih x + b_ih,
    shape (N, gates * H)) and the previous state; ``h is None`` (and ``c is None``) means a zero
    state, for which the recurrent matmul is left out. Returns (h', c') (c' None except LSTM)."""
    hsz = w_hh.shape[1]
    if mode == "GRU":
        # r and z add the recurrent projection to the input one; n multiplies it by r first.
        gh = h @ w_hh.T if h is not None else None
        if b_hh is not None:
            gh = gh + b_hh if gh is not None else b_hh
        rz = gx[:, : 2 * hsz] if gh is None else gx[:, : 2 * hsz] + gh[..., : 2 * hsz]
        r = rz[:, :hsz].sigmoid()
        z = rz[:, hsz:].sigmoid()
        n_in = gx[:, 2 * hsz :]
        n = (n_in if gh is None else n_in + r * gh[..., 2 * hsz :]).tanh()
        new_h = (1.0 - z) * n if h is None else n + z * (h - n)
        return new_h, None
    gates = gx if h is None else gx + h @ w_hh.T
    if b_hh is not None:
        gates = gates + b_hh
    if mode == "RNN_TANH":
        return gates.tanh(), None
    if mode == "RNN_RELU":
        return gates.relu(), None
    i = gates[:, 0:hsz].sigmoid()
    f = gates[:, hsz : 2 * hsz].sigmoid()
    g = gates[:, 2 * hsz : 3 * hsz].tanh()
    o = gates[:, 3 * hsz :].sigmoid()
    new_c = i * g if c is None else f * c + i * g
    return o * new_c.tanh(), new_c


def _mode(kind: str, nonlinearity: str) -> str:
    if kind != "RNN":
        if nonlinearity != "tanh":
            raise GlcompError(f"{kind}: nonlinearity is an argument of RNN only, got {nonlinearity!r}")
        return kind
    if nonlinearity not in ("tanh", "relu"):
        raise GlcompError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return f"RNN_{nonlinearity.upper()}"


def _check_sizes(owner: str, input_size: Any, hidden_size: Any) -> None:
    for what, v in (("input_size", input_size), ("hidden_size", hidden_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise GlcompError(f"{owner}: {what} must be a positive integer, got {v!r}")


def _need(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise _fail(f"expected a tensor as {what}, got {type(x).__name__}")
    return x


class _RNNBase(Module):
    """The multi-layer, optionally bidirectional recurrences of torch.nn.RNN, LSTM and GRU."""

    kind = ""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
        *,
        nonlinearity: str = "tanh",
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        _check_sizes(owner, input_size, hidden_size)
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
            raise GlcompError(f"{owner}: num_layers must be a positive integer, got {num_layers!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout <= 1.0:
            raise GlcompError(f"{owner}: dropout must be a number in [0, 1], got {dropout!r}")
        if proj_size:
            raise GlcompError(f"{owner}: proj_size is not supported yet (use a Linear after the layer)")
        self.mode = _mode(self.kind, nonlinearity)
        self.nonlinearity = nonlinearity
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bool(bidirectional), 0
        dirs = 2 if bidirectional else 1
        gates = _GATES[self.mode] * hidden_size
        k = 1.0 / math.sqrt(hidden_size)
        names = []
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * dirs
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                shapes = {"weight_ih": (gates, width), "weight_hh": (gates, hidden_size)}
                if bias:
                    shapes |= {"bias_ih": (gates,), "bias_hh": (gates,)}
                for name, shape in shapes.items():
                    setattr(self, name + sfx, Parameter(uniform(shape, k)))
                    names.append(name + sfx)
        self._flat_weights_names = names

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def flatten_parameters(self) -> None:
        """torch packs cuDNN weights here; glcomp has nothing to pack."""

    def _weights(self, layer: int, direction: int) -> tuple[Tensor, Tensor, Any, Any]:
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        if not self.bias:
            return getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx), None, None
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        w_ih, w_hh, b_ih, b_hh = (getattr(self, n + sfx) for n in names)
        return w_ih, w_hh, b_ih, b_hh

    def _initial(self, hx: Any, n: int, batched: bool) -> tuple[list[Any], list[Any]]:
        """Per (layer, direction) initial h and c (None: zeros), checked against torch's shapes."""
        count = self.num_layers * self.num_directions
        if hx is None:
            return [None] * count, [None] * count
        is_lstm = self.mode == "LSTM"
        if is_lstm:
            if not isinstance(hx, tuple | list) or len(hx) != 2:
                raise _fail("LSTM: the initial state must be a tuple (h0, c0)")
            states = [(_need(hx[0], "h0"), "h0"), (_need(hx[1], "c0"), "c0")]
        else:
            states = [(_need(hx, "hx"), "hx")]
        want = (count, n, self.hidden_size) if batched else (count, self.hidden_size)
        out: list[list[Any]] = []
        for t, what in states:
            if t.shape != want:
                raise _fail(
                    f"{type(self).__name__}: {what} expected shape {want} "
                    f"(num_layers * num_directions, {'batch, ' if batched else ''}hidden_size) "
                    f"but got {t.shape}"
                )
            if not batched:
                t = t.unsqueeze(1)
            out.append([t[i] for i in range(count)])
        return out[0], out[1] if is_lstm else [None] * count

    def forward(self, input: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        """torch's forward: ``input`` (T, N, input_size), (N, T, input_size) with batch_first, or
        (T, input_size) unbatched; ``hx`` the initial state(s), (num_layers * num_directions, N,
        hidden_size) each (zeros when None). Returns ``(output, h_n)``, and ``(output, (h_n, c_n))``
        for LSTM, shaped as torch's (h_n and c_n are never batch-first)."""
        x = _need(input, "input")
        owner = type(self).__name__
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            layout = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
            raise _fail(
                f"{owner}: input expected shape {layout} or (T, input_size) with input_size "
                f"{self.input_size} but got {x.shape}"
            )
        batched = x.ndim == 3
        if not batched:
            x = x.unsqueeze(0)  # (1, T, input_size): batch-first from here on
        elif not self.batch_first:
            x = x.transpose(0, 1)
        n, steps, _ = x.shape
        h0, c0 = self._initial(hx, n, batched)
        dirs = self.num_directions
        final_h: list[Tensor] = []
        final_c: list[Tensor] = []
        for layer in range(self.num_layers):
            if layer and self.dropout and self.training:
                x = F.dropout(x, self.dropout, True)
            width = x.shape[2]
            outs = []
            for d in range(dirs):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                # One matmul projects every time step's input; only the recurrent part is per step.
                gx = F.linear(x.reshape(n * steps, width), w_ih, b_ih).reshape(n, steps, w_ih.shape[0])
                h, c = h0[layer * dirs + d], c0[layer * dirs + d]
                seq: list[Tensor] = []
                for t in reversed(range(steps)) if d else range(steps):
                    h, c = _step(self.mode, gx[:, t], h, c, w_hh, b_hh)
                    seq.append(h)
                if d:
                    seq.reverse()
                outs.append(stack(seq, 1))
                final_h.append(h)
                if c is not None:
                    final_c.append(c)
            x = outs[0] if dirs == 1 else cat(outs, 2)
        out = x if self.batch_first or not batched else x.transpose(0, 1)
        h_n = stack(final_h, 0)
        c_n = stack(final_c, 0) if final_c else None
        if not batched:
            out, h_n = out[0], h_n[:, 0]
            c_n = c_n[:, 0] if c_n is not None else None
        return (out, (h_n, c_n)) if self.mode == "LSTM" else (out, h_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.kind == "RNN" and self.nonlinearity != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(_RNNBase):
    """torch.nn.RNN: Elman recurrence with tanh or relu; num_layers, bidirectional, dropout between
    layers (train mode only), batch_first, initial state hx."""

    kind = "RNN"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
            nonlinearity=nonlinearity,
        )  # fmt: skip


class LSTM(_RNNBase):
    """torch.nn.LSTM with gate order (i, f, g, o); forward returns ``(output, (h_n, c_n))``."""

    kind = "LSTM"


class GRU(_RNNBase):
    """torch.nn.GRU with gate order (r, z, n) and torch's n gate ``tanh(W_in x + b_in + r (W_hn h +
    b_hn))``; forward returns ``(output, h_n)``."""

    kind = "GRU"


class _CellBase(Module):
    """One time step of torch's RNNCell, LSTMCell and GRUCell."""

    kind = ""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        _check_sizes(type(self).__name__, input_size, hidden_size)
        self.mode = _mode(self.kind, nonlinearity)
        self.nonlinearity = nonlinearity
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        gates = _GATES[self.mode] * hidden_size
        k = 1.0 / math.sqrt(hidden_size)
        self.weight_ih = Parameter(uniform((gates, input_size), k))
        self.weight_hh = Parameter(uniform((gates, hidden_size), k))
        if bias:
            self.bias_ih = Parameter(uniform((gates,), k))
            self.bias_hh = Parameter(uniform((gates,), k))
        else:
            self.bias_ih = self.bias_hh = None

    def _run(self, input: Tensor, hx: Any) -> tuple[Tensor, Tensor | None, bool]:
        x = _need(input, "input")
        owner = type(self).__name__
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise _fail(
                f"{owner}: input expected shape (N, input_size) or (input_size,) with input_size "
                f"{self.input_size} but got {x.shape}"
            )
        batched = x.ndim == 2
        if not batched:
            x = x.unsqueeze(0)
        want = (x.shape[0], self.hidden_size) if batched else (self.hidden_size,)
        h = c = None
        if hx is not None:
            if self.mode == "LSTM":
                if not isinstance(hx, tuple | list) or len(hx) != 2:
                    raise _fail("LSTMCell: the state must be a tuple (h, c)")
                given = [(_need(hx[0], "h"), "h"), (_need(hx[1], "c"), "c")]
            else:
                given = [(_need(hx, "hx"), "hx")]
            for t, what in given:
                if t.shape != want:
                    raise _fail(f"{owner}: {what} expected shape {want} but got {t.shape}")
            h = given[0][0] if batched else given[0][0].unsqueeze(0)
            if self.mode == "LSTM":
                c = given[1][0] if batched else given[1][0].unsqueeze(0)
        gx = F.linear(x, self.weight_ih, self.bias_ih)
        h, c = _step(self.mode, gx, h, c, self.weight_hh, self.bias_hh)
        if not batched:
            h = h[0]
            c = c[0] if c is not None else None
        return h, c, batched

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if self.kind == "RNN" and self.nonlinearity != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
        return s


class RNNCell(_CellBase):
    """torch.nn.RNNCell: ``h' = act(W_ih x + b_ih + W_hh h + b_hh)``, act tanh or relu."""

    kind = "RNN"

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._run(input, hx)[0]


class LSTMCell(_CellBase):
    """torch.nn.LSTMCell: returns ``(h', c')``; the state ``(h, c)`` defaults to zeros."""

    kind = "LSTM"

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__(input_size, hidden_size, bias)

    def forward(self, input: Tensor, hx: Any = None) -> tuple[Tensor, Tensor]:
        h, c, _ = self._run(input, hx)
        assert c is not None
        return h, c


class GRUCell(_CellBase):
    """torch.nn.GRUCell: gates (r, z, n), ``h' = (1 - z) n + z h``."""

    kind = "GRU"

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__(input_size, hidden_size, bias)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._run(input, hx)[0]
