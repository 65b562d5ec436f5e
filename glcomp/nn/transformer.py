"""torch.nn's attention and Transformer encoder layers, written with glcomp's tensor ops.

``MultiheadAttention`` keeps torch's parameters (``in_proj_weight`` of 3 * embed_dim rows in the
order q, k, v, ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``) and maths: per head
``softmax(q k^T / sqrt(head_dim) + mask) v``, attention dropout in train mode, then the output
projection. ``TransformerEncoderLayer`` and ``TransformerEncoder`` have torch's sub-module names
(``self_attn``, ``linear1``, ``dropout``, ``linear2``, ``norm1``, ``norm2``, ``dropout1``,
``dropout2``; ``layers.<i>``, ``norm``), so a torch ``state_dict`` loads by name.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor, _fail, arange, reshape, where
from glcomp.nn import functional as F
from glcomp.nn import init
from glcomp.nn.layers import Dropout, LayerNorm, Linear
from glcomp.nn.module import Module, Parameter


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention (equal query, key and value sizes; no add_bias_kv or
    add_zero_attn). forward returns ``(output, weights)``, the weights averaged over heads unless
    ``average_attn_weights=False``, or None with ``need_weights=False``."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise GlcompError(
                f"MultiheadAttention: embed_dim {embed_dim} is not divisible by num_heads {num_heads}"
            )
        if (
            add_bias_kv
            or add_zero_attn
            or (kdim or embed_dim) != embed_dim
            or (vdim or embed_dim) != embed_dim
        ):
            raise GlcompError(
                "MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim other than embed_dim "
                "are not supported"
            )
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.head_dim, self.batch_first = embed_dim // num_heads, batch_first
        w = Parameter(np.zeros((3 * embed_dim, embed_dim), np.float32))
        init.xavier_uniform_(w)
        self.in_proj_weight = w
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, np.float32)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Any = None,
        need_weights: bool = True,
        attn_mask: Any = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        for what, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor) or t.ndim not in (2, 3) or t.shape[-1] != self.embed_dim:
                raise _fail(
                    f"MultiheadAttention: {what} must be (L, {self.embed_dim}) or batched, "
                    f"got {getattr(t, 'shape', type(t).__name__)}"
                )
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = (
                    key_padding_mask[None]
                    if isinstance(key_padding_mask, Tensor)
                    else (np.asarray(key_padding_mask)[None])
                )
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        # (L, N, E) from here on.
        e, h, d = self.embed_dim, self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        q = F.linear(query, w[:e], None if b is None else b[:e])
        k = F.linear(key, w[e : 2 * e], None if b is None else b[e : 2 * e])
        v = F.linear(value, w[2 * e :], None if b is None else b[2 * e :])
        length, n, source = q.shape[0], q.shape[1], k.shape[0]

        def heads(t: Tensor, rows: int) -> Tensor:  # (rows, N, E) -> (N, H, rows, D)
            return t.reshape(rows, n, h, d).permute(1, 2, 0, 3)

        q, k, v = heads(q, length), heads(k, source), heads(v, source)
        scores = (q * (1.0 / math.sqrt(d))) @ k.transpose(-2, -1)  # (N, H, L, S)
        if attn_mask is None and is_causal:
            attn_mask = np.triu(np.ones((length, source), bool), 1)
        mask = _mask_tensor(attn_mask, "attn_mask", q.graph)
        if mask is not None:
            scores = scores + (mask.reshape(n, h, length, source) if mask.ndim == 3 else mask)
        pad = _mask_tensor(key_padding_mask, "key_padding_mask", q.graph, padding=True)
        if pad is not None:
            scores = scores + pad.reshape(n, 1, 1, source)
        weights = F.softmax(scores, dim=-1)
        dropped = F.dropout(weights, self.dropout, training=self.training) if self.dropout else weights
        out = (dropped @ v).permute(2, 0, 1, 3).reshape(length, n, e)  # (L, N, E)
        out = self.out_proj(out)
        if unbatched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(1)
        if unbatched:
            weights = weights.squeeze(0)
        return out, weights


def _mask_tensor(mask: Any, what: str, graph: Any, padding: bool = False) -> Any:
    """A mask as an additive float tensor. A traced tensor (an input or a registered buffer) is
    added as it is, or for a key padding mask taken as 1.0 where a key is padding. A numpy mask
    (boolean, True where attention is not allowed, or float) must be the causal one, which is
    built from index comparisons; other constant masks belong in a registered buffer."""
    if mask is None:
        return None
    if isinstance(mask, Tensor):
        return where(mask > 0.5, -math.inf, 0.0) if padding else mask
    arr = np.asarray(mask)
    blocked = arr.astype(bool) if arr.dtype == np.bool_ else np.isneginf(arr)
    if padding or arr.ndim != 2 or not np.array_equal(blocked, np.triu(np.ones(arr.shape, bool), 1)):
        raise GlcompError(
            f"MultiheadAttention: {what} given as a constant array other than the causal mask; "
            "register it with register_buffer (or pass it as a model input) and pass that tensor"
        )
    if arr.dtype != np.bool_ and np.any(arr[~blocked] != 0):
        raise GlcompError(f"MultiheadAttention: {what} must be 0 or -inf when given as an array")
    rows, cols = arr.shape
    r = reshape(arange(graph, rows), (rows, 1))
    c = reshape(arange(graph, cols), (1, cols))
    return where(c - r > 0.5, -math.inf, 0.0)


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with a
    residual connection and LayerNorm (after the block, or before it with ``norm_first``)."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Any = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if isinstance(activation, str) and activation not in _ACTIVATIONS:
            raise GlcompError(f"TransformerEncoderLayer: activation should be relu/gelu, not {activation}")
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _ACTIVATIONS[activation] if isinstance(activation, str) else activation

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        x = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(
        self, src: Tensor, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False
    ) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: `num_layers` copies of `encoder_layer` (``layers.<i>``), then
    the optional `norm`."""

    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        super().__init__()
        from glcomp.nn.layers import ModuleList

        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self, src: Tensor, mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool | None = None
    ) -> Tensor:
        out = src
        for layer in self.layers:
            out = layer(
                out, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal)
            )
        return self.norm(out) if self.norm is not None else out
