"""Client-side clipping and Gaussian noise of a site's update: `ClipAndNoise`, a Flower client mod.

Flower 1.42's own client DP mods (``flwr.client.mod.LocalDpMod``, ``fixedclipping_mod``) read and
write the legacy FitIns/FitRes records (``fitins.parameters``/``fitres.parameters``); a glcomp
site answers a plain round with the Message API (an ArrayRecord ``"arrays"``), on which they raise
KeyError. `ClipAndNoise` handles both forms: the Message API of a plain round and the legacy
records of a SecAgg+ round, where it runs inside ``secaggplus_mod`` (after it in the ClientApp's
mods), on the site's reply before it is masked.

What it guarantees, per round and per site: the update the site sends (its weights minus the
global weights it received, over all float tensors together) has L2 norm at most `clip` before
noise (up to float32 rounding of the sent weights), and then every float coordinate gets
independent Gaussian noise of standard deviation ``noise_multiplier * clip``. That is local,
DP-style clipping and noise of each round's update; there is no privacy accounting here (no
epsilon/delta over rounds), and the metrics a plain round's reply carries besides the weights
(the site's losses, its row count) are not privatized.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

FITINS_KEY = "fitins.parameters"


def _flat_clip(param1: list[Any], param2: list[Any], clipping_norm: float) -> None:
    """param1 <- param2 + (param1 - param2) scaled to L2 norm at most `clipping_norm` (the same
    as Flower's compute_clip_model_update, for a Flower without it)."""
    update = [np.subtract(x, y) for x, y in zip(param1, param2, strict=True)]
    scale = min(1.0, clipping_norm / _norm(update))
    for i, y in enumerate(param2):
        param1[i] = y + update[i] * scale


def _flower_clip() -> Any:
    """Flower's FlatClip of a model update (what its LocalDpMod uses), imported on first use."""
    try:
        from flwr.supercore.differential_privacy import compute_clip_model_update as clip
    except ImportError:  # pragma: no cover - another Flower version
        try:
            from flwr.common.differential_privacy import compute_clip_model_update as clip
        except ImportError:
            clip = _flat_clip
    return clip


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise GlcompError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise GlcompError(f"{what} must be finite, got {value!r}")
    return value


def _is_float(a: np.ndarray) -> bool:
    return bool(np.issubdtype(a.dtype, np.floating))


def _norm(arrays: list[np.ndarray]) -> float:
    return float(math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays)))


class ClipAndNoise:
    """A Flower client mod (``mods=[..., ClipAndNoise(clip, noise_multiplier)]``) clipping and
    noising a site's update on TRAIN messages; other messages, and replies with an error, pass
    through untouched.

    It reads the global weights of the train message, calls the rest of the ClientApp, and
    replaces the float weights of the reply by ``received + clip_to_norm(update, clip) + N(0,
    (noise_multiplier * clip)^2)``, where ``update = reply - received`` and the L2 norm is over all
    float tensors together (Flower's ``compute_clip_model_update``, computed in float64 and sent
    in the tensors' own dtype). Non-float tensors are sent as the site computed them. A plain
    round's ``update-norm`` metric becomes the norm of the update actually sent. The noise comes
    from ``np.random.default_rng``: with `seed` None fresh OS entropy at every round; with a seed,
    a function of (seed, the node's id, the server round), for reproducible tests. This is
    per-round local clipping and noise with no privacy accounting (see the module's docstring).

    In a SecAgg+ round it must run inside ``secaggplus_mod``, i.e. after it in the mods list
    (``GlcompClient(..., dp=...)`` places it so); placed outside, it finds the reply masked and
    raises GlcompError."""

    def __init__(self, clip: float, noise_multiplier: float = 0.0, seed: int | None = None) -> None:
        clip = _number(clip, "the DP clipping norm (--dp-clip)")
        if not clip > 0:
            raise GlcompError(f"the DP clipping norm (--dp-clip) must be positive, got {clip!r}")
        noise = _number(noise_multiplier, "the DP noise multiplier (--dp-noise)")
        if noise < 0:
            raise GlcompError(f"the DP noise multiplier (--dp-noise) must be 0 or more, got {noise!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise GlcompError(f"the DP noise seed must be None or a non-negative integer, got {seed!r}")
        self.clip, self.noise_multiplier, self.seed = clip, noise, seed

    @property
    def std(self) -> float:
        """The standard deviation of the noise added to every float coordinate."""
        return self.noise_multiplier * self.clip

    def __repr__(self) -> str:
        return (
            f"ClipAndNoise(clip={self.clip!r}, noise_multiplier={self.noise_multiplier!r}, "
            f"seed={self.seed!r})"
        )

    def describe(self) -> str:
        """``DP clip C, noise Z`` (the header lines of the commands)."""
        return f"DP clip {self.clip:g}, noise {self.noise_multiplier:g}"

    # -- the mod --------------------------------------------------------------------------------------
    def __call__(self, msg: Any, ctxt: Any, call_next: Any) -> Any:
        from flwr.app import MessageType

        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctxt)
        legacy = FITINS_KEY in msg.content.array_records
        received = self._received_legacy(msg) if legacy else self._received(msg)
        if received is None:  # no weights: a SecAgg+ key-exchange stage, say
            return call_next(msg, ctxt)
        out = call_next(msg, ctxt)
        if out.has_error():
            return out
        if legacy:
            return self._reply_legacy(msg, ctxt, out, received)
        return self._reply(msg, ctxt, out, received)

    def privatize(
        self, sent: list[np.ndarray], received: list[np.ndarray], rng: np.random.Generator
    ) -> list[np.ndarray]:
        """`sent` with its float tensors replaced by received + clipped update + noise (the
        tensors matched by position; the float ones must have the same shapes)."""
        if len(sent) != len(received):
            raise GlcompError(
                f"DP: the reply holds {len(sent)} tensors, the train message {len(received)}; cannot "
                "compute the update"
            )
        idx = [i for i, a in enumerate(sent) if _is_float(a)]
        for i in idx:
            if np.shape(received[i]) != np.shape(sent[i]):
                raise GlcompError(
                    f"DP: tensor {i} of the reply has shape {np.shape(sent[i])}, the received one "
                    f"{np.shape(received[i])}; cannot compute the update"
                )
        new = [np.asarray(sent[i], np.float64) for i in idx]
        old = [np.asarray(received[i], np.float64) for i in idx]
        if _norm([n - o for n, o in zip(new, old)]) > 0:  # Flower's FlatClip divides by the norm
            _flower_clip()(new, old, self.clip)
        out = list(sent)
        for j, i in enumerate(idx):
            value = new[j]
            if self.noise_multiplier > 0:
                value = value + rng.normal(0.0, self.std, value.shape)
            out[i] = np.ascontiguousarray(value.astype(sent[i].dtype))
        return out

    def _rng(self, ctxt: Any, server_round: Any) -> np.random.Generator:
        if self.seed is None:
            return np.random.default_rng()
        node = getattr(ctxt, "node_id", 0)
        node = int(node) if isinstance(node, (int, np.integer)) and node >= 0 else 0
        r = int(server_round) if isinstance(server_round, (int, float)) and server_round >= 0 else 0
        return np.random.default_rng([self.seed, node, r])

    # -- the Message API (a plain round) ------------------------------------------------------------------
    @staticmethod
    def _record(content: Any) -> tuple[str, Any] | None:
        from glcomp.federated.client import ARRAYS_KEY

        records = content.array_records
        if ARRAYS_KEY in records:
            return ARRAYS_KEY, records[ARRAYS_KEY]
        if len(records) == 1:
            return next(iter(records.items()))
        return None

    def _received(self, msg: Any) -> dict[str, np.ndarray] | None:
        got = self._record(msg.content)
        return None if got is None else {k: v.numpy() for k, v in got[1].items()}

    def _reply(self, msg: Any, ctxt: Any, out: Any, received: dict[str, np.ndarray]) -> Any:
        from flwr.app import Array, ArrayRecord, MetricRecord

        from glcomp.federated.client import CONFIG_KEY, METRICS_KEY

        got = self._record(out.content)
        if got is None:
            raise GlcompError(
                "DP: the site's reply holds no weights to clip (placed outside secaggplus_mod? "
                "ClipAndNoise goes after it in the mods list)"
            )
        key, record = got
        sent = {k: v.numpy() for k, v in record.items()}
        names = list(sent)
        missing = [k for k in names if _is_float(sent[k]) and k not in received]
        if missing:
            raise GlcompError(f"DP: the reply's tensors {missing} were not in the train message")
        olds = [received.get(k, sent[k]) for k in names]
        config = msg.content.config_records.get(CONFIG_KEY)
        rng = self._rng(ctxt, None if config is None else config.get("server-round"))
        new = self.privatize([sent[k] for k in names], olds, rng)
        out.content.array_records[key] = ArrayRecord({k: Array(v) for k, v in zip(names, new)})
        metrics = out.content.metric_records.get(METRICS_KEY)
        if metrics is not None and "update-norm" in metrics:
            floats = [i for i, k in enumerate(names) if _is_float(new[i])]
            norm = _norm([np.asarray(new[i], np.float64) - np.asarray(olds[i], np.float64) for i in floats])
            out.content.metric_records[METRICS_KEY] = MetricRecord(dict(metrics) | {"update-norm": norm})
        return out

    # -- the legacy records (a SecAgg+ round) --------------------------------------------------------------
    def _received_legacy(self, msg: Any) -> list[np.ndarray]:
        from flwr.common import parameters_to_ndarrays
        from flwr.compat.common.recorddict_compat import recorddict_to_fitins

        fitins = recorddict_to_fitins(msg.content, keep_input=True)
        return list(parameters_to_ndarrays(fitins.parameters))

    def _reply_legacy(self, msg: Any, ctxt: Any, out: Any, received: list[np.ndarray]) -> Any:
        from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
        from flwr.compat.common.recorddict_compat import (
            fitres_to_recorddict,
            recorddict_to_fitins,
            recorddict_to_fitres,
        )

        if "fitres.parameters" not in out.content.array_records or not len(
            out.content.array_records["fitres.parameters"]
        ):
            raise GlcompError(
                "DP: the site's reply holds no fitres.parameters to clip (placed outside secaggplus_mod? "
                "ClipAndNoise goes after it in the mods list)"
            )
        fitres = recorddict_to_fitres(out.content, keep_input=True)
        sent = list(parameters_to_ndarrays(fitres.parameters))
        server_round = recorddict_to_fitins(msg.content, keep_input=True).config.get("server-round")
        new = self.privatize(sent, received, self._rng(ctxt, server_round))
        fitres.parameters = ndarrays_to_parameters(new)
        out.content = fitres_to_recorddict(fitres, keep_input=True)
        return out


def as_dp(dp: Any) -> ClipAndNoise | None:
    """`dp` as a ClipAndNoise: None, a ClipAndNoise, or a (clip, noise_multiplier) pair."""
    if dp is None or isinstance(dp, ClipAndNoise):
        return dp
    if isinstance(dp, (tuple, list)) and len(dp) == 2:
        return ClipAndNoise(dp[0], dp[1])
    raise GlcompError(f"dp must be None, a ClipAndNoise or a (clip, noise_multiplier) pair, got {dp!r}")


__all__ = ["ClipAndNoise", "as_dp"]
