"""Conv2d dilation and groups, ConvTranspose2d, Upsample (nearest) and AdaptiveAvgPool2d against
torch: outputs, input and weight gradients, and 4 SGD and Adam steps, on the reference runtime and
on GL in both GLSL dialects; bad configurations raise GlcompError naming the layer.

torch runs in float64 on the float32 weights that glcomp holds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import glcomp
from glcomp import GlcompError, nn, optim
from glcomp.nn import functional as F

RTOL, ATOL = 2e-4, 2e-5


def pair(build: Any) -> tuple[Any, Any]:
    """The torch model (float64) and the glcomp model with the same weights."""
    torch.manual_seed(0)
    tmodel = build(torch.nn)
    gmodel = build(nn)
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    assert list(state) == list(gmodel.state_dict()), "state_dict names or order differ from torch"
    for k, v in state.items():
        assert gmodel.state_dict()[k].shape == v.shape, k
    gmodel.load_state_dict(state)
    return tmodel.double(), gmodel


def close(got: Any, want: Any, what: str) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert np.shape(got) == want.shape, what
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def family(ns: Any) -> Any:
    """Every new layer and option in one small CNN: dilated grouped conv, depthwise conv with
    asymmetric "same" padding, non-dividing adaptive pooling, integer and non-integer nearest
    resizing, grouped strided ConvTranspose2d with output_padding, and a dilated one whose
    output_padding exceeds its stride."""

    class Net(ns.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = ns.Conv2d(2, 4, 3, padding=2, dilation=2, groups=2)
            self.depthwise = ns.Conv2d(4, 4, (2, 3), padding="same", groups=4)
            self.pool = ns.AdaptiveAvgPool2d((3, 2))
            self.nearest = ns.Upsample(scale_factor=2)
            self.up = ns.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
            self.up2 = ns.ConvTranspose2d(4, 2, 2, dilation=2, output_padding=1, bias=False)
            self.resize = ns.Upsample(size=(5, 4))
            self.head_pool = ns.AdaptiveAvgPool2d(2)
            self.fc = ns.Linear(8, 3)

        def forward(self, x: Any) -> Any:
            h = torch.tanh(self.conv(x)) if ns is torch.nn else self.conv(x).tanh()
            h = h + self.depthwise(h)  # (N, 4, 4, 4)
            p = self.pool(h)  # (N, 4, 3, 2)
            u = self.up(p) + self.nearest(p)  # (N, 4, 6, 4)
            z = self.head_pool(self.resize(self.up2(u)))  # (N, 2, 9, 7) -> (N, 2, 5, 4) -> (N, 2, 2, 2)
            return self.fc(z.reshape(z.shape[0], 8))

    return Net()


def torch_steps(tmodel: Any, x: Any, y: Any, opt: Any, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


OPTIMIZERS = {
    "sgd": (lambda: optim.SGD(lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "adam": (lambda: optim.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("which", ["sgd", "adam"])
def test_family_trains_like_torch(which: str, dialect: str, gl_runtime: Any) -> None:
    tmodel, gmodel = pair(family)
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 2, 4, 4)).astype(np.float32), rng.integers(0, 3, size=2)
    tx, ty = torch.tensor(x, dtype=torch.float64), torch.tensor(y)
    ours, theirs = OPTIMIZERS[which]
    prog = glcomp.compile(
        gmodel, {"x": x.shape}, loss=nn.CrossEntropyLoss(), optimizer=ours(), target=dialect
    )
    ops = {d["op"] for _, d in prog.graphs["train_step"].g.nodes(data=True)}
    assert {"conv2d", "conv2d_input_grad", "conv2d_weight_grad", "pad"} <= ops
    grouped = {
        d["op"] for _, d in prog.graphs["train_step"].g.nodes(data=True) if d["attrs"].get("groups", 1) > 1
    }
    assert grouped == {"conv2d", "conv2d_input_grad", "conv2d_weight_grad"}, "groups as one primitive"

    with torch.no_grad():
        want = tmodel(tx)
    torch.nn.functional.cross_entropy(tmodel(tx), ty).backward()
    tgrads = {k: p.grad.clone() for k, p in tmodel.named_parameters()}
    tmodel.zero_grad()
    losses = torch_steps(tmodel, tx, ty, theirs(tmodel.parameters()), 4)

    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for name, rt in (("reference", ref), ("GL", gl)):
            close(rt.predict(x=x), want, f"{name} output")
            grads = rt.gradients(x=x, y=y)
            assert sorted(grads) == sorted(tgrads)
            for k, g in tgrads.items():
                close(grads[k], g, f"{name} gradient of {k}")
            for step, loss in enumerate(losses):
                assert rt.train_step(x=x, y=y) == pytest.approx(loss, rel=RTOL, abs=ATOL), (name, step)
            for k, v in tmodel.state_dict().items():
                close(rt.state_dict()[k], v, f"{name} {k} after 4 {which} steps")


def scaled(layer: Any, shape: tuple[int, ...]) -> Any:
    """`layer` after a learnable elementwise scale of the input: the scale's gradient is the
    layer's input gradient summed over the batch."""

    def build(ns: Any) -> Any:
        class Scaled(ns.Module):
            def __init__(self) -> None:
                super().__init__()
                ones = torch.ones(1, *shape[1:]) if ns is torch.nn else np.ones((1, *shape[1:]), np.float32)
                self.scale = ns.Parameter(ones)
                self.layer = layer(ns)

            def forward(self, x: Any) -> Any:
                return self.layer(x * self.scale)

        return Scaled()

    return build


LAYERS = {
    "conv_dilated_grouped": (lambda ns: ns.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2), (2, 4, 6, 7)),
    "conv_same_dilated": (lambda ns: ns.Conv2d(2, 3, (2, 3), padding="same", dilation=(2, 1)), (1, 2, 5, 6)),
    "conv_strided_dilated": (
        lambda ns: ns.Conv2d(3, 6, 2, stride=2, dilation=3, groups=3, bias=False),
        (2, 3, 9, 8),
    ),
    "tconv_output_padding": (
        lambda ns: ns.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
        (2, 3, 3, 4),
    ),
    "tconv_grouped_dilated": (
        lambda ns: ns.ConvTranspose2d(
            4, 6, (2, 3), stride=(1, 2), padding=(0, 1), output_padding=(1, 0), groups=2, dilation=2
        ),
        (2, 4, 3, 3),
    ),
    "tconv_padding_crops": (
        lambda ns: ns.ConvTranspose2d(2, 2, 3, padding=2, output_padding=1, dilation=2),
        (1, 2, 4, 4),
    ),
    "tconv_stride3": (lambda ns: ns.ConvTranspose2d(2, 3, 3, stride=3, output_padding=2), (1, 2, 2, 3)),
    "upsample_size_up": (lambda ns: ns.Upsample(size=(5, 7)), (1, 2, 3, 4)),
    "upsample_size_down": (lambda ns: ns.Upsample(size=(2, 3)), (1, 2, 5, 7)),
    "upsample_fractional": (lambda ns: ns.Upsample(scale_factor=1.5), (1, 2, 3, 5)),
    "upsample_pair": (lambda ns: ns.UpsamplingNearest2d(scale_factor=(2, 3)), (1, 2, 3, 2)),
    "adaptive_dividing": (lambda ns: ns.AdaptiveAvgPool2d((2, 3)), (1, 2, 6, 6)),
    "adaptive_overlapping": (lambda ns: ns.AdaptiveAvgPool2d((3, 4)), (1, 2, 5, 7)),
    "adaptive_none": (lambda ns: ns.AdaptiveAvgPool2d((None, 2)), (1, 2, 5, 7)),
}


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_layer_output_and_gradients_like_torch(case: str) -> None:
    layer, shape = LAYERS[case]
    tmodel, gmodel = pair(scaled(layer, shape))
    rng = np.random.default_rng(5)
    x = rng.normal(size=shape).astype(np.float32)
    tx = torch.tensor(x, dtype=torch.float64)
    tout = tmodel(tx)
    target = rng.normal(size=tuple(tout.shape))
    torch.nn.functional.mse_loss(tout, torch.tensor(target), reduction="sum").backward()
    prog = glcomp.compile(gmodel, {"x": shape}, loss=nn.MSELoss(reduction="sum"))
    rt = prog.runtime("reference")
    close(rt.predict(x=x), tout, "output")
    grads = rt.gradients(x=x, y=target.astype(np.float32))
    for k, p in tmodel.named_parameters():
        close(grads[k], p.grad, f"gradient of {k}")


def test_functional_forms_and_output_size() -> None:
    """F.conv2d / F.conv_transpose2d / F.interpolate / F.adaptive_avg_pool2d, and
    ConvTranspose2d(output_size=...) picking the output_padding."""
    torch.manual_seed(1)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)

    class Fn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(w.numpy().astype(np.float32))
            self.t = nn.ConvTranspose2d(3, 2, 3, stride=2)
            self.t.weight.data[...] = w.numpy()
            self.t.bias.data[...] = 0.5

        def forward(self, x: Any) -> Any:
            a = F.conv_transpose2d(x, self.w, stride=2, padding=1, output_padding=(0, 1))
            b = F.conv2d(a, self.w, padding=1, dilation=1, groups=1)
            c = F.interpolate(b, scale_factor=2, mode="nearest")
            d = F.adaptive_avg_pool2d(c, (3, 5))
            return d, self.t(x, output_size=(10, 12))

    got = glcomp.compile(Fn(), {"x": tuple(x.shape)}).runtime("reference").predict(x=x.numpy())
    tf = torch.nn.functional
    a = tf.conv_transpose2d(x, w, stride=2, padding=1, output_padding=(0, 1))
    b = tf.conv2d(a, w, padding=1)
    d = tf.adaptive_avg_pool2d(tf.interpolate(b, scale_factor=2, mode="nearest"), (3, 5))
    close(got["output.0"], d, "functional chain")
    t = torch.nn.ConvTranspose2d(3, 2, 3, stride=2).double()
    with torch.no_grad():
        t.weight.copy_(w)
        t.bias.fill_(0.5)
    close(got["output.1"], t(x, output_size=(10, 12)), "output_size")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: nn.Conv2d(4, 6, 3, groups=4),
            r"Conv2d: out_channels \(6\) must be divisible by groups \(4\)",
        ),
        (lambda: nn.Conv2d(3, 6, 3, groups=2), r"Conv2d: in_channels \(3\) must be divisible by groups"),
        (lambda: nn.Conv2d(2, 2, 3, dilation=0), "Conv2d: dilation must be at least 1"),
        (lambda: nn.Conv2d(2, 2, 3, stride=2, padding="same"), "Conv2d: padding='same'"),
        (lambda: nn.Conv2d(2, 2, 3, padding_mode="reflect"), "Conv2d: padding_mode 'reflect'"),
        (lambda: nn.ConvTranspose2d(2, 3, 3, groups=2), r"ConvTranspose2d: out_channels \(3\)"),
        (lambda: nn.ConvTranspose2d(2, 2, 3, stride=2, output_padding=2), "ConvTranspose2d: output_padding"),
        (lambda: nn.Upsample(scale_factor=2, mode="bilinear"), "Upsample: mode 'bilinear' is not supported"),
        (lambda: nn.Upsample(), "Upsample: give exactly one of size and scale_factor"),
        (lambda: nn.AdaptiveAvgPool2d(0), "AdaptiveAvgPool2d: output_size must be a positive int"),
    ],
)
def test_bad_configurations_name_the_layer(make: Any, message: str) -> None:
    with pytest.raises(GlcompError, match=message):
        make()


def test_bad_inputs_name_the_layer() -> None:
    class WrongWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(np.ones((4, 3, 3, 3), np.float32))

        def forward(self, x: Any) -> Any:
            return F.conv2d(x, self.w, groups=2)

    with pytest.raises(
        GlcompError, match=r"conv2d: input \(1, 4, 5, 5\) and weight \(4, 3, 3, 3\) with groups=2"
    ):
        glcomp.compile(WrongWeight(), {"x": (1, 4, 5, 5)})
    with pytest.raises(GlcompError, match=r"input expected shape \(N, 4, H, W\)"):
        glcomp.compile(nn.ConvTranspose2d(4, 2, 3), {"x": (1, 3, 5, 5)})
    with pytest.raises(GlcompError, match="output_size"):
        glcomp.compile(_Sized(), {"x": (1, 2, 3, 3)})


class _Sized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.t = nn.ConvTranspose2d(2, 2, 3, stride=2)

    def forward(self, x: Any) -> Any:
        return self.t(x, output_size=(9, 9))  # reachable sizes are 7 and 8


def _separable(ns: Any) -> Any:
    """A depthwise-separable block at a width where the texel kernels read stored textures:
    depthwise 3x3 over 64 channels (stride 1 and 2), pointwise 1x1, and a grouped ConvTranspose2d."""
    return ns.Sequential(
        ns.Conv2d(64, 64, 3, padding=1, groups=64, bias=False),
        ns.Tanh(),
        ns.Conv2d(64, 64, 3, stride=2, padding=1, groups=64),
        ns.Conv2d(64, 16, 1),
        ns.Tanh(),
        ns.ConvTranspose2d(16, 8, 4, stride=2, padding=1, groups=4),
        ns.Flatten(),
        ns.Linear(8 * 8 * 8, 3),
    )


def test_depthwise_conv_is_one_draw_per_pass() -> None:
    """A depthwise conv over 64 channels is one kernel per pass (forward, input gradient, weight
    gradient), not one per channel: its bundle has as many draws as with 4 channels, and predict
    is a draw per layer."""
    from glcomp.codegen.bundle import build_bundle

    counts = {}
    for channels in (4, 64):
        model = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
            nn.Tanh(),
            nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
            nn.Conv2d(channels, 4, 1),
            nn.Flatten(),
            nn.Linear(4 * 64, 2),
        )
        prog = glcomp.compile(
            model,
            {"x": (2, channels, 8, 8)},
            loss=nn.CrossEntropyLoss(),
            optimizer=optim.SGD(lr=0.1),
            passes={"split_weight_grads": False},
        )
        entries = build_bundle(prog).manifest["entries"]
        assert len(entries["predict"]["draws"]) <= 4, [d["kernel"] for d in entries["predict"]["draws"]]
        counts[channels] = len(entries["predict"]["draws"]), len(entries["train_step"]["draws"])
    assert counts[4] == counts[64], f"draws (predict, train_step) by channel count: {counts}"


def test_separable_block_on_gl_like_torch(dialect: str, gl_runtime: Any) -> None:
    """Depthwise, strided depthwise and grouped transposed convolutions at 64 channels: GL in both
    dialects gives torch's loss and gradients and the reference runtime's steps."""
    tmodel, gmodel = pair(_separable)
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(2, 64, 8, 8)).astype(np.float32), rng.integers(0, 3, size=2)
    tx = torch.tensor(x, dtype=torch.float64)
    loss = torch.nn.functional.cross_entropy(tmodel(tx), torch.tensor(y))
    loss.backward()
    prog = glcomp.compile(
        gmodel, {"x": x.shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1), target=dialect
    )
    ref = prog.runtime("reference")
    with gl_runtime(prog) as rt:
        grads = rt.gradients(x=x, y=y)
        for k, p in tmodel.named_parameters():
            close(grads[k], p.grad, f"gradient of {k}")
        gl_losses = [float(rt.train_step(x=x, y=y)) for _ in range(3)]
    ref_losses = [float(ref.train_step(x=x, y=y)) for _ in range(3)]
    np.testing.assert_allclose(gl_losses[0], loss.item(), rtol=RTOL)
    np.testing.assert_allclose(gl_losses, ref_losses, rtol=1e-5)
