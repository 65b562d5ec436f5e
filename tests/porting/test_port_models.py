"""Training programs written in plain torch idiom (tests/ported/*.py), ported to glcomp by
rewriting only their import lines, train like torch: forward loss, gradients, four optimizer
steps (with the scheduler each script builds) and the weights after them, torch in float64 on
the same float32 weights. Dropout is switched off for the comparison with torch (its masks come
from another generator); random draws the model makes itself (a VAE's randn_like) are fed from
glcomp to torch. A subset also trains on the GL runtime (webgl2) against the reference runtime,
dropout on.

What a port needs beyond the import lines is the driver: glcomp compiles a train step from the
model, its loss and its optimizer (``glcomp.compile(model, shapes, loss=criterion,
optimizer=optimizer)``) and ``runtime.train_step(**batch)`` replaces torch's ``zero_grad();
loss.backward(); step()``; each test states any further edit.
"""

from __future__ import annotations

import inspect
import math
import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp

torch = pytest.importorskip("torch")

PORTED = Path(__file__).parents[1] / "ported"
TORCH = types.SimpleNamespace(nn=torch.nn, lib=torch)
GLCOMP = types.SimpleNamespace(nn=glcomp.nn, lib=glcomp)
RTOL, ATOL = 2e-4, 1e-5
B = 4

# The import lines of torch scripts and their glcomp spellings: the whole port.
IMPORTS = [
    (r"import torch", "import glcomp as torch"),
    (r"import torch\.nn as nn", "from glcomp import nn"),
    (r"from torch import nn", "from glcomp import nn"),
    (r"from torch import nn, optim", "from glcomp import nn, optim"),
    (r"import torch\.nn\.functional as F", "import glcomp.nn.functional as F"),
    (r"import torch\.optim as optim", "from glcomp import optim"),
    (r"from torch\.optim\.lr_scheduler import (\w+)", r"from glcomp.optim.lr_scheduler import \1"),
]


def port(text: str) -> str:
    """`text` with its torch import lines rewritten to glcomp's and nothing else changed."""
    lines = []
    for line in text.splitlines():
        for pattern, replacement in IMPORTS:
            if re.fullmatch(pattern, line):
                line = re.sub(pattern, replacement, line)
                break
        assert not re.match(r"(import|from) torch\b", line), f"unported import line: {line}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def load(name: str, ported: bool) -> types.ModuleType:
    text = (PORTED / f"{name}.py").read_text()
    module = types.ModuleType(f"{'glcomp' if ported else 'torch'}_{name}")
    exec(compile(port(text) if ported else text, str(PORTED / f"{name}.py"), "exec"), module.__dict__)
    return module


def both(
    name: str, **setup: Any
) -> tuple[types.ModuleType, tuple[Any, ...], types.ModuleType, tuple[Any, ...]]:
    """The script as written and ported, each `setup()` run, glcomp's model holding torch's
    initial weights (the names and their order must agree); torch's model in float64."""
    torch.manual_seed(0)
    glcomp.manual_seed(0)
    tmod, gmod = load(name, False), load(name, True)
    tset, gset = tmod.setup(**setup), gmod.setup(**setup)
    state = {k: v.detach().numpy() for k, v in tset[0].state_dict().items()}
    assert list(state) == list(gset[0].state_dict()), "state_dict names or order differ from torch"
    gset[0].load_state_dict(state)
    tset[0].double()
    return tmod, tset, gmod, gset


def call_loss(criterion: Any, output: Any, target: Any) -> Any:
    """torch's side of the loss contract glcomp compiles: loss(output, target), or with a tuple
    output loss(output[0], target) or loss(output[0], target, *output[1:]) if it takes more."""
    if not isinstance(output, tuple):
        return criterion(output, target)
    try:
        inspect.signature(criterion).bind(None, None)
    except TypeError:
        return criterion(output[0], target, *output[1:])
    except ValueError:
        pass
    return criterion(output[0], target)


def close(got: Any, want: Any, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert np.shape(got) == want.shape, what
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def as_torch(a: np.ndarray) -> Any:
    return torch.tensor(a) if np.issubdtype(a.dtype, np.integer) else torch.tensor(a, dtype=torch.float64)


def train_like_torch(
    name: str,
    shapes: dict[str, tuple[int, ...]],
    batch: Any,
    setup: dict[str, Any] | None = None,
    steps: int = 4,
    compile_kw: dict[str, Any] | None = None,
    torch_extra: Any = None,
    carry: Any = None,
    rtol: float = RTOL,
    exclude: dict[str, Any] | None = None,
) -> Any:
    """Train the script `name` for `steps` steps in torch and (ported) in glcomp's reference
    runtime and compare. `batch(step)` gives the inputs (dict, in forward's order) and the
    target; `torch_extra(tmodel)` runs after torch's backward (gradient clipping);
    `carry(step, runtime, feeds)` updates the feeds from the previous step (hidden states);
    `exclude` names parameter elements left out of the final comparison."""
    _, (tmodel, tcrit, topt, tsched), _, (gmodel, gcrit, gopt, gsched) = both(name, **(setup or {}))
    prog = glcomp.compile(gmodel, shapes, loss=gcrit, optimizer=gopt, **(compile_kw or {}))
    rt = prog.runtime("reference")
    feeds, target = batch(0)
    for step in range(steps):
        if step:
            feeds, target = batch(step)
        if carry is not None:
            feeds = carry(step, rt, feeds)
        topt.zero_grad()
        tout = tmodel(*[as_torch(v) for v in feeds.values()])
        tloss = call_loss(tcrit, tout, as_torch(target))
        tloss.backward()
        if step == 0:  # gradients before any clipping
            grads = rt.gradients(**feeds, y=target)
            assert sorted(grads) == sorted(k for k, p in tmodel.named_parameters() if p.requires_grad)
            for k, p in tmodel.named_parameters():
                close(grads[k], p.grad, f"{name}: gradient of {k}", rtol=rtol)
        if torch_extra is not None:
            torch_extra(tmodel, tout)
        topt.step()
        got = rt.train_step(**feeds, y=target)  # the loss before the step: the forward loss
        assert got == pytest.approx(tloss.item(), rel=rtol), f"{name}: loss at step {step}"
        if tsched is not None:
            tsched.step()
            gsched.step()
            assert rt.lr == pytest.approx(topt.param_groups[0]["lr"], rel=1e-9), "scheduled lr"
    for k, v in tmodel.state_dict().items():
        got, want = rt.state_dict()[k], v.detach().numpy()
        if k in (exclude or {}):
            got, want = np.delete(got, exclude[k]), np.delete(want, exclude[k])
        close(got, want, f"{name}: {k} after {steps} steps", rtol=rtol)
    return rt


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)))


def labels_batch(name: str, shape: tuple[int, ...], classes: int, ids: int = 0) -> Any:
    rng = rng_for(name)

    def batch(step: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        x = rng.integers(0, ids, size=shape) if ids else rng.normal(size=shape)
        return {"x": x}, rng.integers(0, classes, size=shape[0])

    return batch


# -- classification scripts: import-only ports ---------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "shape", "classes", "ids", "setup"),
    [
        ("mnist_cnn", (B, 1, 10, 10), 10, 0, {"dropout": False}),
        ("quickstart", (B, 6, 6), 10, 0, {}),
        ("cifar_net", (B, 3, 16, 16), 10, 0, {}),
        ("gru_classifier", (B, 6), 3, 9, {}),
        ("transformer_classifier", (B, 6), 3, 10, {"dropout": 0.0}),
    ],
)
def test_classifier_ports_train_like_torch(
    name: str, shape: tuple[int, ...], classes: int, ids: int, setup: dict[str, Any]
) -> None:
    # Attention's key bias has an exactly zero gradient (softmax ignores a shift shared by a row):
    # its rounding noise, which Adam-type steps scale to lr-sized moves of either sign, is not compared.
    key_bias = {f"encoder.layers.{i}.self_attn.in_proj_bias": slice(8, 16) for i in range(2)}
    exclude = key_bias if name.startswith("transformer") else None
    train_like_torch(name, {"x": shape}, labels_batch(name, shape, classes, ids), setup, exclude=exclude)


def test_autoencoder_port_trains_like_torch() -> None:
    rng = rng_for("autoencoder")

    def batch(step: int) -> Any:
        x = rng.uniform(size=(B, 20))
        return {"x": x}, x  # the input is the target

    train_like_torch("autoencoder", {"x": (B, 20)}, batch)


def test_time_sequence_port_trains_like_torch() -> None:
    """LSTMCells looped over time and torch.cat, as written (torch.double spellings included);
    Adam stands in for the original's LBFGS."""
    t = np.arange(B)[:, None] * 0.7 + np.arange(6)[None] * 0.4

    def batch(step: int) -> Any:
        wave = np.sin(t + step)
        return {"input": wave[:, :-1]}, wave[:, 1:]

    train_like_torch("time_sequence", {"input": (B, 5)}, batch)


def test_char_rnn_port_trains_like_torch() -> None:
    """The tutorial's per-letter loop lives in its train(); glcomp compiles modules, so the loop
    is written in a forward (NameClassifier) - the one edit beyond the imports."""
    rng = rng_for("char_rnn")

    def batch(step: int) -> Any:
        line = np.eye(8)[rng.integers(0, 8, size=5)][:, None]  # (T, 1, n_letters) one-hot
        return {"line_tensor": line}, rng.integers(0, 4, size=1)

    train_like_torch("char_rnn", {"line_tensor": (5, 1, 8)}, batch)


def test_word_language_model_port_trains_like_torch() -> None:
    """Embedding + GRU + decoder with the hidden state carried across batches: torch detaches it
    (repackage_hidden); glcomp's train_step returns only the loss, so the next hidden state is
    read with predict on the same weights (dropout off: predict runs in eval mode). Clipping is
    the compile option clip_grad_norm=0.25 in place of clip_grad_norm_."""
    rng = rng_for("word_lm")
    seq, layers, hid = 5, 2, 8
    tokens = rng.integers(0, 11, size=(seq * 5 + 1, B))
    state = {"hidden": np.zeros((layers, B, hid))}
    torch_hidden: dict[str, Any] = {}

    def batch(step: int) -> Any:
        data, target = tokens[step * seq : (step + 1) * seq], tokens[step * seq + 1 : (step + 1) * seq + 1]
        return {"input": data, "hidden": state["hidden"]}, target.reshape(-1)

    def carry(step: int, rt: Any, feeds: dict[str, Any]) -> dict[str, Any]:
        if step:
            close(feeds["hidden"], torch_hidden[step - 1], f"hidden state carried into batch {step}")
        state["hidden"] = rt.predict(**feeds)["output.1"]  # what batch(step + 1) feeds
        return feeds

    def torch_side(tmodel: Any, output: Any) -> None:
        torch_hidden[len(torch_hidden)] = output[1].detach()  # repackage_hidden
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 0.25)

    rt = train_like_torch(
        "word_lm",
        {"input": (seq, B), "hidden": (layers, B, hid)},
        batch,
        {"rnn_type": "GRU", "dropout": 0.0},
        compile_kw={"clip_grad_norm": 0.25},
        torch_extra=torch_side,
        carry=carry,
    )
    assert len(torch_hidden) == 4 and rt.optimizer_state() is not None


# -- the VAE: a loss function of (recon_x, x, mu, logvar) and randn_like ----------------------------
class Noise(glcomp.nn.Module):
    def forward(self, h: Any) -> Any:
        return glcomp.randn_like(h)


def noise_at(shape: tuple[int, ...], step: int) -> np.ndarray:
    """The normal draws of the first randn_like of a trace at `step` (seed 0)."""
    glcomp.manual_seed(0)
    rt = glcomp.compile(Noise(), {"h": shape}).runtime("reference")
    rt.load_state_dict(rt.state_dict(), optimizer={"rng.step": np.float32(step)})
    return rt.predict(h=np.zeros(shape, np.float32))


def test_vae_port_trains_like_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss function takes (recon_x, x, mu, logvar): glcomp calls a loss of more than two
    parameters as loss(output[0], target, *output[1:]). torch's randn_like is fed glcomp's draws."""
    rng = rng_for("vae")
    eps = {s: noise_at((B, 3), s) for s in range(4)}
    current = {"step": 0}
    monkeypatch.setattr(torch, "randn_like", lambda t: torch.tensor(eps[current["step"]], dtype=t.dtype))

    def batch(step: int) -> Any:
        current["step"] = step
        x = rng.uniform(size=(B, 16))
        return {"x": x}, x

    train_like_torch("vae", {"x": (B, 16)}, batch)


def test_randn_like_is_standard_normal_and_changes_per_step() -> None:
    z = noise_at((200, 250), 0)
    assert abs(z.mean()) < 0.01 and z.std() == pytest.approx(1.0, abs=0.01)
    # Quantiles of N(0, 1) at 2.3%, 15.9%, 50%, 84.1%, 97.7%.
    np.testing.assert_allclose(
        np.quantile(z, [0.02275, 0.15866, 0.5, 0.84134, 0.97725]), [-2, -1, 0, 1, 2], atol=0.03
    )
    assert abs(np.corrcoef(z[:, 1:].ravel(), z[:, :-1].ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(z.ravel(), noise_at((200, 250), 1).ravel())[0, 1]) < 0.01, "a new draw per step"
    np.testing.assert_array_equal(noise_at((200, 250), 0), z)


def test_init_functions_fill_weight_data_in_place() -> None:
    """DCGAN's weights_init calls nn.init.normal_(m.weight.data, ...): the Parameter's array."""
    conv = glcomp.nn.Conv2d(2, 3, 3)
    before = conv.weight.data.copy()
    assert glcomp.nn.init.normal_(conv.weight.data, 1.0, 0.02) is conv.weight.data
    assert not np.array_equal(conv.weight.data, before) and abs(conv.weight.data.mean() - 1.0) < 0.02
    glcomp.nn.init.constant_(conv.bias.data, 0)
    assert not conv.bias.data.any()
    with pytest.raises(glcomp.GlcompError, match="expected a Parameter or numpy array, got list"):
        glcomp.nn.init.zeros_([1.0, 2.0])


def test_batchnorm_called_twice_in_a_step_updates_running_stats_twice() -> None:
    """DCGAN's discriminator sees the real and the fake batch in one step: each call moves the
    running statistics on from the previous call's, as torch's in-place update."""

    def build(ns: Any) -> Any:
        class Twice(ns.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bn = ns.nn.BatchNorm1d(3)

            def forward(self, a: Any, b: Any) -> Any:
                return self.bn(a) + self.bn(b * 2.0)

        return Twice()

    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(6, 3)), rng.normal(size=(6, 3)) + 1.0
    tmodel = build(torch).double()
    tmodel(as_torch(a), as_torch(b))
    prog = glcomp.compile(build(glcomp), {"a": a.shape, "b": b.shape}, loss=glcomp.nn.MSELoss(),
                          optimizer=glcomp.optim.SGD(lr=0.0))  # fmt: skip
    rt = prog.runtime("reference")
    rt.train_step(a=a, b=b, y=np.zeros((6, 3)))
    for k in ("bn.running_mean", "bn.running_var"):
        close(rt.state_dict()[k], tmodel.state_dict()[k], k, rtol=1e-5)


# -- DCGAN: two optimizers, two compiled train steps ---------------------------------------------------
def test_dcgan_port_trains_like_torch() -> None:
    """torch's loop (D on a real and a detached fake batch, gradients accumulated, then G through
    D) against two compiled train steps: DStep (optimizerD: D's parameters only) and GStep
    (optimizerG). The programs hold separate copies of the weights, synchronised after each step
    by state_dict / load_state_dict: the D step's G running statistics are torch's (G runs once
    per iteration there), the G step's D running statistics too (D runs a third time there)."""
    torch.manual_seed(0)
    glcomp.manual_seed(0)
    tmod, gmod = load("dcgan", False), load("dcgan", True)
    t_g, t_d, criterion, t_opt_d, t_opt_g = tmod.setup()
    g_g, g_d, _, g_opt_d, g_opt_g = gmod.setup()
    for t_net, g_net in ((t_g, g_g), (t_d, g_d)):
        g_net.load_state_dict({k: v.detach().numpy() for k, v in t_net.state_dict().items()})
        t_net.double()
    real_shape, noise_shape = (B, 1, 16, 16), (B, 4, 1, 1)
    d_prog = glcomp.compile(
        gmod.DStep(g_g, g_d), {"real": real_shape, "noise": noise_shape}, loss=gmod.d_loss, optimizer=g_opt_d
    )
    g_prog = glcomp.compile(
        gmod.GStep(g_g, g_d), {"noise": noise_shape}, loss=gmod.nn.BCELoss(), optimizer=g_opt_g
    )
    assert d_prog.trainable == [f"netD.{k}" for k, _ in g_d.named_parameters()]
    assert g_prog.trainable == [f"netG.{k}" for k, _ in g_g.named_parameters()]
    d_rt, g_rt = d_prog.runtime("reference"), g_prog.runtime("reference")
    rng = rng_for("dcgan")
    ones, zeros = np.ones(B), np.zeros(B)
    for step in range(4):
        real, noise = np.tanh(rng.normal(size=real_shape)), rng.normal(size=noise_shape)
        t_d.zero_grad()
        label = torch.full((B,), tmod.real_label, dtype=torch.float64)
        err_real = criterion(t_d(as_torch(real)).view(-1), label)
        err_real.backward()
        fake = t_g(as_torch(noise))
        label.fill_(tmod.fake_label)
        err_fake = criterion(t_d(fake.detach()).view(-1), label)
        err_fake.backward()
        t_opt_d.step()
        t_g.zero_grad()
        label.fill_(tmod.real_label)
        err_g = criterion(t_d(fake).view(-1), label)
        err_g.backward()
        t_opt_g.step()

        err_d = d_rt.train_step(real=real, noise=noise, y=np.concatenate([ones, zeros]))
        assert err_d == pytest.approx((err_real + err_fake).item(), rel=RTOL), f"errD at step {step}"
        d_state = d_rt.state_dict()
        g_rt.load_state_dict(
            {
                k: d_state[k]
                if k.startswith("netD.")
                or not k.startswith("netG.main.")
                or "running" in k
                or "num_batches" in k
                else v
                for k, v in g_rt.state_dict().items()
            }
        )
        assert g_rt.train_step(noise=noise, y=ones) == pytest.approx(err_g.item(), rel=RTOL), (
            f"errG at step {step}"
        )
        g_state = g_rt.state_dict()
        d_rt.load_state_dict(
            {
                k: g_state[k]
                if (k.startswith("netG.") and k.split(".")[-1] in ("weight", "bias"))
                or (k.startswith("netD.") and k.split(".")[-1] not in ("weight", "bias"))
                else v
                for k, v in d_rt.state_dict().items()
            }
        )
    final = d_rt.state_dict()
    for prefix, net in (("netG", t_g), ("netD", t_d)):
        for k, v in net.state_dict().items():
            if prefix == "netD" and k.endswith("num_batches_tracked"):
                # A known difference: glcomp counts train steps that run the layer (8: a D and a
                # G step per iteration), torch counts calls (12: D runs 3 times per iteration).
                # Only momentum=None would read it, which glcomp's BatchNorm does not take.
                assert final[f"{prefix}.{k}"] == 8 and v.item() == 12
                continue
            close(final[f"{prefix}.{k}"], v, f"{prefix}.{k} after 4 iterations", rtol=1e-3)


# -- the GL runtime --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "shapes", "setup", "target"),
    [
        ("mnist_cnn", {"x": (B, 1, 10, 10)}, {}, "labels10"),
        ("vae", {"x": (B, 16)}, {}, "input"),
    ],
)
def test_ports_train_on_gl_like_reference(
    gl_runtime: Any, name: str, shapes: dict[str, Any], setup: dict[str, Any], target: str
) -> None:
    """Ported as they are, dropout and random draws on: three train steps on GL (webgl2) follow the
    reference runtime (same masks and noise, same losses and weights). The transformer also
    matches on GL but takes about 15 s to build and compile its shaders, so it is left out."""
    glcomp.manual_seed(1)
    model, criterion, optimizer, scheduler = load(name, True).setup(**setup)
    prog = glcomp.compile(model, shapes, loss=criterion, optimizer=optimizer, target="webgl2")
    ref = prog.runtime("reference")
    rng = rng_for(name)
    ((input_name, shape),) = shapes.items()
    with gl_runtime(prog) as gl:
        for step in range(3):
            x = rng.uniform(size=shape)
            y = x if target == "input" else rng.integers(0, int(target[6:]), size=shape[0])
            feeds = {input_name: x, "y": y}
            assert gl.train_step(**feeds) == pytest.approx(ref.train_step(**feeds), rel=RTOL), f"step {step}"
            if scheduler is not None:
                scheduler.step()
                assert gl.hyper["lr"] == pytest.approx(ref.lr) and ref.lr == optimizer.lr
        for k, v in ref.state_dict().items():
            close(gl.state_dict()[k], v, f"{name} on GL: {k}", rtol=1e-3)


# -- attention layers against torch ----------------------------------------------------------------------
def test_multihead_attention_and_encoder_layer_like_torch() -> None:
    """Sequence-first MultiheadAttention with per-head and averaged weights, a causal mask and a
    key padding mask fed as an input; a norm_first GELU encoder layer with a final LayerNorm."""

    def build(ns: Any) -> Any:
        tnn = ns.nn

        class Attend(tnn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.mha = tnn.MultiheadAttention(8, 2)
                layer = tnn.TransformerEncoderLayer(8, 4, 12, 0.0, "gelu", norm_first=True)
                self.enc = tnn.TransformerEncoder(layer, 1, norm=tnn.LayerNorm(8))

            def forward(self, x: Any, pad: Any) -> Any:
                causal = torch.triu(torch.full((5, 5), -math.inf, dtype=x.dtype), 1) if ns is TORCH else None
                a, w = self.mha(x, x, x, attn_mask=causal, is_causal=causal is None)
                b, wh = self.mha(a, x, x, key_padding_mask=pad, average_attn_weights=False)
                # glcomp: a numpy causal mask outside the trace's tensors (as torch scripts build it)
                mask = causal if ns is TORCH else np.triu(np.full((5, 5), -np.inf), 1)
                return self.enc(a + b, mask=mask) + w.sum() + wh[:, 1].mean()

        return Attend()

    torch.manual_seed(0)
    tmodel = build(TORCH)
    gmodel = build(GLCOMP)
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    assert list(state) == list(gmodel.state_dict())
    gmodel.load_state_dict(state)
    tmodel.double()
    rng = np.random.default_rng(21)
    x, pad = rng.normal(size=(5, 3, 8)), np.zeros((3, 5))
    pad[1, 3:] = 1.0  # the second sequence's last two keys are padding
    tout = tmodel(as_torch(x), torch.tensor(pad, dtype=torch.bool))
    prog = glcomp.compile(gmodel, {"x": x.shape, "pad": pad.shape}, loss=glcomp.nn.MSELoss())
    rt = prog.runtime("reference")
    close(rt.predict(x=x, pad=pad), tout, "output")
    y = rng.normal(size=x.shape)
    torch.nn.functional.mse_loss(tout, as_torch(y)).backward()
    grads = rt.gradients(x=x, pad=pad, y=y)
    for k, p in tmodel.named_parameters():
        close(grads[k], p.grad, f"gradient of {k}", atol=2e-5)


def test_attention_errors_name_the_problem() -> None:
    with pytest.raises(glcomp.GlcompError, match="embed_dim 6 is not divisible by num_heads 4"):
        glcomp.nn.MultiheadAttention(6, 4)
    with pytest.raises(glcomp.GlcompError, match="kdim/vdim"):
        glcomp.nn.MultiheadAttention(8, 2, kdim=4)

    class Masked(glcomp.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = glcomp.nn.MultiheadAttention(4, 1)

        def forward(self, x: Any) -> Any:
            return self.mha(x, x, x, attn_mask=np.eye(3, dtype=bool))[0]

    with pytest.raises(glcomp.GlcompError, match="register it with register_buffer"):
        glcomp.compile(Masked(), {"x": (3, 2, 4)})


def test_tuple_hidden_state_input_is_a_clear_error() -> None:
    """The LSTM variant of the word language model takes hidden = (h0, c0): not one tensor."""
    model, criterion, _, _ = load("word_lm", True).setup(rnn_type="LSTM", dropout=0.0)
    with pytest.raises(
        glcomp.GlcompError, match=r"inputs\['hidden'\]: got several shapes .* one argument per"
    ):
        glcomp.compile(model, {"input": (5, B), "hidden": ((2, B, 8), (2, B, 8))}, loss=criterion)


def test_loss_function_with_more_arguments_than_outputs_is_a_clear_error() -> None:
    def loss_function(recon_x: Any, x: Any, mu: Any, logvar: Any) -> Any:
        return ((recon_x - x) ** 2).sum()

    model = glcomp.nn.Linear(4, 4)
    with pytest.raises(glcomp.GlcompError, match=r"\(Linear\)\.forward returned 0 further value"):
        glcomp.compile(model, {"x": (2, 4)}, loss=loss_function)
