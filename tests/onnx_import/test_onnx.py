"""ONNX import: models exported by torch.onnx.export, loaded with glcomp.onnx.load, compared with
torch (outputs, gradients, SGD steps, BatchNorm running statistics), on the reference runtime and
on GL; unsupported ops, invalid files and external data outside the model's directory; the CLI."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

# torch exports the test models; onnx is a test dependency (pyproject's `test` extra), so a
# missing package fails these tests instead of skipping them.
import onnx
import pytest
import torch

import glcomp
from glcomp import nn, optim
from glcomp.cli import main

tnn = torch.nn

RTOL, ATOL = 2e-4, 2e-5


# -- torch models ----------------------------------------------------------------------------------
class MLP(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.drop = tnn.Linear(8, 16), tnn.Linear(16, 3), tnn.Dropout(0.3)

    def forward(self, x: Any) -> Any:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class CNN(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(1, 4, 3, stride=1, padding=1)
        self.conv2 = tnn.Conv2d(4, 3, 3, stride=2, padding=1)
        self.fc = tnn.Linear(3 * 2 * 2, 5)

    def forward(self, x: Any) -> Any:
        h = tnn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(torch.flatten(torch.relu(self.conv2(h)), 1))


class NormGelu(tnn.Module):
    """3-D input: MatMul + Add (pre-transposed weight), LayerNormalization, erf GELU, ReduceMean."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.norm, self.head = tnn.Linear(6, 12), tnn.LayerNorm(12), tnn.Linear(12, 2)

    def forward(self, x: Any) -> Any:
        return self.head(tnn.functional.gelu(self.norm(self.proj(x))).mean(1))


class BatchNormNet(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.bn, self.out = tnn.Linear(4, 6), tnn.BatchNorm1d(6, momentum=0.3), tnn.Linear(6, 3)

    def forward(self, x: Any) -> Any:
        return self.out(torch.relu(self.bn(self.lin(x))))


class Zoo(tnn.Module):
    """Pooling, reductions, shape chains (dynamic batch axis), slices, concat, movement ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.lin = tnn.Conv2d(2, 3, 3, stride=2, padding=1), tnn.Linear(12, 5)

    def forward(self, x: Any) -> Any:
        h = torch.tanh(self.conv(x))
        h = tnn.functional.avg_pool2d(h, 2) * torch.sigmoid(tnn.functional.adaptive_avg_pool2d(h, 1))
        f = h.reshape(h.size(0), -1)
        f = torch.cat([f[:, 1:], f[:, :1]], 1)
        z = tnn.functional.leaky_relu(self.lin(f), 0.1).unsqueeze(1).transpose(1, 2).squeeze(2)
        z = (z - z.sum(1, keepdim=True) / 5) / torch.sqrt(z.pow(2).mean(1, keepdim=True) + 1)
        return torch.log_softmax(z, -1) + torch.softmax(z, 1)[:, 2:3]


class ConvFamily(tnn.Module):
    """Grouped dilated Conv, ConvTranspose (grouped, output_padding; dilated), Resize (nearest by a
    factor and to a size), AveragePool and GlobalAveragePool from AdaptiveAvgPool2d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(2, 4, 3, padding=2, dilation=2, groups=2)
        self.up = tnn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = tnn.ConvTranspose2d(4, 2, 2, dilation=2, output_padding=1)
        self.nearest, self.resize = tnn.Upsample(scale_factor=2), tnn.Upsample(size=(5, 4))
        self.pool, self.gpool = tnn.AdaptiveAvgPool2d((2, 2)), tnn.AdaptiveAvgPool2d(1)
        self.fc = tnn.Linear(16 + 2 + 40, 5)

    def forward(self, x: Any) -> Any:
        h = torch.tanh(self.conv(x))  # (N, 4, 3, 3)
        u = self.up(h) + self.nearest(h)  # (N, 4, 6, 6)
        z = self.up2(h)  # (N, 2, 6, 6)
        parts = [self.pool(u).flatten(1), self.gpool(z).flatten(1), self.resize(z).flatten(1)]
        return self.fc(torch.cat(parts, 1))


class Recurrent(tnn.Module):
    """A `layers`-layer bidirectional batch-first LSTM feeding a GRU (ONNX LSTM and GRU nodes)."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.lstm = tnn.LSTM(3, 4, num_layers=layers, batch_first=True, bidirectional=True)
        self.gru = tnn.GRU(8, 5)
        self.fc = tnn.Linear(5, 3)

    def forward(self, x: Any) -> Any:
        out, _ = self.lstm(x)
        seq, h = self.gru(out.transpose(0, 1))
        return self.fc(seq[-1] + h[0])


def export(model: Any, shape: tuple[int, ...], path: Path, dynamic_batch: bool = False) -> Path:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # distinct values: no initializer is deduplicated away
            p.copy_(torch.randn_like(p) * 0.5)
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(*shape),),
            str(path),
            input_names=["x"],
            output_names=["y"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={"x": {0: "batch"}} if dynamic_batch else None,
        )
    return path


def torch_name(model: Any, onnx_name: str, value: np.ndarray) -> tuple[str, bool]:
    """The torch parameter an ONNX initializer came from, and whether it was transposed."""
    params = dict(model.named_parameters())
    if onnx_name in params:
        return onnx_name, False
    for name, p in params.items():
        t = p.detach().numpy()
        if t.ndim == 2 and t.T.shape == value.shape and np.array_equal(t.T, value):
            return name, True
        if t.shape == value.shape and np.array_equal(t, value):
            return name, False
    raise AssertionError(f"no torch parameter for {onnx_name}")


def plain_layout(tmodel: Any, module: Any) -> Any:
    """torch arrays by parameter name -> the ONNX parameters they became (maybe transposed)."""
    names = {k: torch_name(tmodel, k, p.data) for k, p in module.named_parameters()}

    def layout(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: arrays[n].T if transposed else arrays[n] for k, (n, transposed) in names.items()}

    return layout


def recurrent_layout(tmodel: Any, module: Any) -> Any:
    """As plain_layout, for models with torch LSTM / GRU layers: their ONNX W, R and B
    initializers stack the directions and list the gates in ONNX order (LSTM i o f c, GRU z r h;
    torch's are i f g o and r z n), B joining the input and recurrent biases."""
    candidates: dict[str, Any] = {}
    for prefix, layer in tmodel.named_modules():
        if not isinstance(layer, tnn.LSTM | tnn.GRU):
            continue
        order = (0, 3, 1, 2) if isinstance(layer, tnn.LSTM) else (1, 0, 2)
        size = layer.hidden_size
        for k in range(layer.num_layers):
            sfxs = [f"_l{k}", f"_l{k}_reverse"][: 2 if layer.bidirectional else 1]

            def gates(a: np.ndarray, order: Any = order, size: int = size) -> np.ndarray:
                return np.concatenate([a[j * size : (j + 1) * size] for j in order])

            def stacked(arrays: dict[str, np.ndarray], kinds: tuple[str, ...], prefix: str = prefix,
                        sfxs: list[str] = sfxs, gates: Any = gates) -> np.ndarray:  # fmt: skip
                return np.stack(
                    [np.concatenate([gates(arrays[f"{prefix}.{kind}{s}"]) for kind in kinds]) for s in sfxs]
                )

            for kinds in (("weight_ih",), ("weight_hh",), ("bias_ih", "bias_hh")):
                candidates[f"{prefix}.{kinds}.{k}"] = lambda a, kinds=kinds, f=stacked: f(a, kinds)
    for name, _ in tmodel.named_parameters():
        if not any(name.startswith(f"{p}.") for p, m in tmodel.named_modules() if isinstance(m, tnn.RNNBase)):
            candidates[name] = lambda a, name=name: a[name]
    start = {n: p.detach().numpy() for n, p in tmodel.named_parameters()}
    found = {}
    for key, value in module.state_dict().items():
        hits = [
            f
            for f in candidates.values()
            if f(start).shape == value.shape and np.array_equal(f(start), value)
        ]
        assert len(hits) == 1, f"no single torch origin for {key}"
        found[key] = hits[0]
    return lambda arrays: {k: f(arrays) for k, f in found.items()}


def check_training(
    tmodel: Any,
    module: Any,
    runtime: Any,
    x: np.ndarray,
    y: np.ndarray,
    steps: int = 4,
    lr: float = 0.1,
    layout: Any = plain_layout,
) -> None:
    """Gradients and `steps` SGD steps of cross-entropy training match torch (train mode);
    ``layout(tmodel, module)`` maps torch's arrays onto the imported parameters."""
    to_onnx = layout(tmodel, module)
    tmodel.train()
    topt = torch.optim.SGD(tmodel.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    grads = runtime.gradients(x=x, y=y)
    for step in range(steps):
        topt.zero_grad()
        loss = tnn.functional.cross_entropy(tmodel(xt), yt)
        loss.backward()
        if step == 0:
            want = to_onnx({n: p.grad.numpy() for n, p in tmodel.named_parameters()})
            assert sorted(want) == sorted(grads)
            for key, g in want.items():
                np.testing.assert_allclose(grads[key], g, RTOL, ATOL, err_msg=key)
        ours = runtime.train_step(x=x, y=y)
        assert ours == pytest.approx(loss.item(), rel=RTOL, abs=ATOL), step
        topt.step()
    state = runtime.state_dict()
    for key, p in to_onnx({n: p.detach().numpy() for n, p in tmodel.named_parameters()}).items():
        np.testing.assert_allclose(state[key], p, RTOL, ATOL, err_msg=key)


def predict_matches(tmodel: Any, runtime: Any, x: np.ndarray) -> None:
    tmodel.eval()
    with torch.no_grad():
        expected = tmodel(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(runtime.predict(x=x), expected, rtol=1e-4, atol=1e-5)


def data(shape: tuple[int, ...], classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, shape[0])


def compile_sgd(module: Any, shape: tuple[int, ...], target: str = "webgl2") -> Any:
    return glcomp.compile(
        module, {"x": shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1), target=target
    )


# -- parity ----------------------------------------------------------------------------------------
def test_mlp_names_predict_and_sgd(tmp_path: Path) -> None:
    tmodel = MLP()
    module = glcomp.onnx.load(export(tmodel, (4, 8), tmp_path / "mlp.onnx"))
    assert isinstance(module, nn.Module)
    assert list(module.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert module.input_names == ["x"] and module.input_shapes == {"x": (4, 8)}
    np.testing.assert_array_equal(module.state_dict()["fc1.weight"], tmodel.fc1.weight.detach().numpy())
    x, y = data((4, 8), 3)
    ref = compile_sgd(module, (4, 8)).runtime("reference")
    predict_matches(tmodel, ref, x)
    tmodel.drop.p = 0.0  # torch's dropout masks differ from glcomp's: compare training without
    module_nodrop = glcomp.onnx.load(export(tmodel, (4, 8), tmp_path / "mlp0.onnx"))
    check_training(tmodel, module_nodrop, compile_sgd(module_nodrop, (4, 8)).runtime("reference"), x, y)


def test_cnn_on_gl(tmp_path: Path, gl_runtime: Any) -> None:
    tmodel = CNN()
    module = glcomp.onnx.load(export(tmodel, (2, 1, 8, 8), tmp_path / "cnn.onnx"))
    assert {"fc.weight", "fc.bias"} <= set(module.state_dict())
    x, y = data((2, 1, 8, 8), 5)
    with gl_runtime(compile_sgd(module, (2, 1, 8, 8))) as gl:
        predict_matches(tmodel, gl, x)
        check_training(tmodel, module, gl, x, y)


def test_layernorm_gelu_matmul(tmp_path: Path) -> None:
    tmodel = NormGelu()
    path = export(tmodel, (2, 5, 6), tmp_path / "ln.onnx")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"MatMul", "LayerNormalization", "Erf", "ReduceMean"} <= ops
    module = glcomp.onnx.load(path)
    # The exporter stores proj.weight transposed under a generated name: it trains all the same.
    assert any(k.startswith("onnx::MatMul") for k in module.state_dict())
    x, y = data((2, 5, 6), 2)
    ref = compile_sgd(module, (2, 5, 6)).runtime("reference")
    predict_matches(tmodel, ref, x)
    check_training(tmodel, module, ref, x, y)


def test_batchnorm_running_stats(tmp_path: Path) -> None:
    tmodel = BatchNormNet()
    path = export(tmodel, (8, 4), tmp_path / "bn.onnx")
    module = glcomp.onnx.load(path)
    state = module.state_dict()
    assert {"bn.running_mean", "bn.running_var"} <= set(state)
    assert "bn.running_mean" not in dict(module.named_parameters())
    np.testing.assert_array_equal(state["bn.running_var"], tmodel.bn.running_var.numpy())
    x, y = data((8, 4), 3)
    ref = compile_sgd(module, (8, 4)).runtime("reference")
    predict_matches(tmodel, ref, x)
    check_training(tmodel, module, ref, x, y)
    for key in ("running_mean", "running_var"):
        np.testing.assert_allclose(ref.state_dict()[f"bn.{key}"], getattr(tmodel.bn, key).numpy(), RTOL, ATOL)
    predict_matches(tmodel, ref, x)  # eval mode with the updated statistics


def test_fresh_batchnorm_deduplicated_statistics(tmp_path: Path) -> None:
    """A fresh BatchNorm's running_var equals its weight; torch exports it as Identity(weight).
    It still becomes a buffer of its own that train steps update."""
    tmodel = BatchNormNet().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            tmodel, (torch.randn(8, 4),), str(tmp_path / "b.onnx"), input_names=["x"], dynamo=False
        )
    module = glcomp.onnx.load(tmp_path / "b.onnx")
    assert {"bn.weight", "bn.running_var", "bn.running_mean"} <= set(module.state_dict())
    x, y = data((8, 4), 3)
    ref = compile_sgd(module, (8, 4)).runtime("reference")
    check_training(tmodel, module, ref, x, y, steps=2)
    for key in ("running_mean", "running_var"):
        np.testing.assert_allclose(ref.state_dict()[f"bn.{key}"], getattr(tmodel.bn, key).numpy(), RTOL, ATOL)


def test_op_zoo_with_shape_chains(tmp_path: Path) -> None:
    tmodel = Zoo()
    path = export(tmodel, (2, 2, 8, 8), tmp_path / "zoo.onnx", dynamic_batch=True)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Shape", "Gather", "Concat", "Reshape", "Slice", "Transpose", "Pow", "Sqrt"} <= ops
    module = glcomp.onnx.load(path)
    assert module.input_shapes == {"x": (None, 2, 8, 8)}
    x, y = data((2, 2, 8, 8), 5)
    prog = compile_sgd(module, (2, 2, 8, 8))
    ops_in_program = {d["op"] for _, d in prog.graphs["predict"].g.nodes(data=True)}
    assert "input" in ops_in_program and not ops_in_program & {"Shape", "Gather"}
    ref = prog.runtime("reference")
    predict_matches(tmodel, ref, x)
    check_training(tmodel, module, ref, x, y, steps=2)


def test_conv_family_on_gl(tmp_path: Path, gl_runtime: Any) -> None:
    tmodel = ConvFamily()
    path = export(tmodel, (2, 2, 3, 3), tmp_path / "convs.onnx")
    nodes = onnx.load(str(path)).graph.node
    ops = {n.op_type for n in nodes}
    assert {"Conv", "ConvTranspose", "Resize", "AveragePool", "GlobalAveragePool"} <= ops
    conv = next(n for n in nodes if n.op_type == "Conv")
    assert {a.name for a in conv.attribute} >= {"group", "dilations"}
    module = glcomp.onnx.load(path)
    x, y = data((2, 2, 3, 3), 5)
    with gl_runtime(compile_sgd(module, (2, 2, 3, 3))) as gl:
        predict_matches(tmodel, gl, x)
        check_training(tmodel, module, gl, x, y)


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 2], "pads": [1, 0, 0, 2], "output_padding": [1, 1]},
        # Extent 6 x 7: the spec's padding for output_shape 6 x 4 is [0, 2, 0, 1] (begin gets the
        # larger half); onnx's reference evaluator does not derive it, so it gets the pads.
        {"strides": [2, 1], "output_shape": [6, 4], "dilations": [1, 2], "group": 2},
        {"strides": [1, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1]},
    ],
)
def test_conv_transpose_asymmetric_pads_and_output_shape(tmp_path: Path, attrs: dict[str, Any]) -> None:
    """Forms torch does not export, checked against onnx's reference evaluator."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(4)
    w = rng.normal(size=(2, 2 // attrs.get("group", 1), 2, 3)).astype(np.float32)
    x = rng.normal(size=(1, 2, 3, 3)).astype(np.float32)

    def model(out: Any, attrs: dict[str, Any] = attrs) -> Any:
        node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="tconv", **attrs)
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], [numpy_helper.from_array(w, "w")],
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    oracle = dict(attrs)
    if "output_shape" in oracle:
        del oracle["output_shape"]
        oracle["pads"] = [0, 2, 0, 1]
    want = ReferenceEvaluator(model(None, oracle)).run(None, {"x": x})[0]
    module = glcomp.onnx.load(_save(model(list(want.shape)), tmp_path / "t.onnx"))
    got = glcomp.compile(module, {"x": x.shape}).runtime("reference").predict(x=x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("op", "direction"), [("LSTM", "reverse"), ("GRU", "bidirectional")])
def test_recurrent_node_layout_direction_and_states(tmp_path: Path, op: str, direction: str) -> None:
    """Batch-first layout, reverse and bidirectional directions and initial states (initializers,
    hence parameters), checked against onnx's reference evaluator on every output."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(6)
    dirs, gates, hidden, (n, steps, width) = (
        1 + (direction == "bidirectional"),
        4 if op == "LSTM" else 3,
        3,
        (2, 4, 2),
    )
    inits = {
        "W": rng.normal(size=(dirs, gates * hidden, width)),
        "R": rng.normal(size=(dirs, gates * hidden, hidden)) * 0.5,
        "B": rng.normal(size=(dirs, 2 * gates * hidden)),
        "h0": rng.normal(size=(n, dirs, hidden)),  # layout 1: batch first
    }
    if op == "LSTM":
        inits["c0"] = rng.normal(size=(n, dirs, hidden))
    inputs = ["x", "W", "R", "B", "", "h0"] + (["c0"] if op == "LSTM" else [])
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    node = helper.make_node(
        op, inputs, outputs, name="rnn", hidden_size=hidden, direction=direction, layout=1, **extra
    )
    shapes = {"y": [n, steps, dirs, hidden], "y_h": [n, dirs, hidden], "y_c": [n, dirs, hidden]}
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, steps, width])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(size=(n, steps, width)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    module = glcomp.onnx.load(_save(model, tmp_path / "rnn.onnx"))
    assert set(module.state_dict()) == set(inits)
    got = glcomp.compile(module, {"x": x.shape}).runtime("reference").predict(x=x)
    for i, name in enumerate(outputs):
        np.testing.assert_allclose(got[f"output.{i}"], want[i], rtol=1e-5, atol=1e-6, err_msg=name)


# On GL the quick run imports one LSTM layer (still an ONNX LSTM node in both directions feeding a
# GRU node; a second layer adds 30 shaders but no other kind of node), `--slow` both.
RNN_CASES = [("reference", 2), ("webgl2", 1), ("webgl1", 1)]
RNN_CASES += [pytest.param(t, 2, marks=pytest.mark.slow_only, id=f"{t}-2") for t in ("webgl2", "webgl1")]


@pytest.mark.parametrize(("runtime", "layers"), RNN_CASES)
def test_lstm_gru_nodes(tmp_path: Path, runtime: str, layers: int, gl_runtime: Any) -> None:
    """A torch-exported bidirectional LSTM of `layers` layers feeding a GRU imports, predicts and
    trains 4 steps like torch on the reference runtime and on GL in both dialects."""
    tmodel = Recurrent(layers)
    path = export(tmodel, (2, 3, 3), tmp_path / "rnn.onnx")
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("LSTM") == layers and ops.count("GRU") == 1
    module = glcomp.onnx.load(path)
    x, y = data((2, 3, 3), 3)
    if runtime == "reference":
        ref = compile_sgd(module, (2, 3, 3)).runtime("reference")
        predict_matches(tmodel, ref, x)
        check_training(tmodel, module, ref, x, y, layout=recurrent_layout)
        return
    prog = compile_sgd(module, (2, 3, 3), target=runtime)
    with gl_runtime(prog) as gl:
        predict_matches(tmodel, gl, x)
        check_training(tmodel, module, gl, x, y, layout=recurrent_layout)


# -- errors ----------------------------------------------------------------------------------------
def _save(model: Any, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _tiny(nodes: list[Any], inits: list[Any] | None = None) -> Any:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=inits or [],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unsupported_op_names_node_and_supported_ops(tmp_path: Path) -> None:
    from onnx import helper

    path = _save(_tiny([helper.make_node("Sin", ["x"], ["y"], name="my_sine")]), tmp_path / "sin.onnx")
    with pytest.raises(glcomp.GlcompError) as err:
        glcomp.onnx.load(path)
    message = str(err.value)
    assert "'my_sine'" in message and "'Sin'" in message and "sin.onnx" in message
    assert "supported ops: " in message and "Gemm" in message and "LayerNormalization" in message
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert " ".join(", ".join(glcomp.onnx.SUPPORTED_OPS).split()) in " ".join(readme.split())


def test_unsupported_resize_mode_names_the_node(tmp_path: Path) -> None:
    path = export(tnn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 3, 3), tmp_path / "bilinear.onnx")
    module = glcomp.onnx.load(path)
    with pytest.raises(glcomp.GlcompError, match=r"ONNX node '/Resize' \(Resize\): only mode 'nearest'"):
        glcomp.compile(module, {"x": (1, 2, 3, 3)})


def test_invalid_and_unsafe_files(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(glcomp.GlcompError, match=r"junk\.onnx"):
        glcomp.onnx.load(tmp_path / "junk.onnx")
    with pytest.raises(glcomp.GlcompError, match="no such ONNX file"):
        glcomp.onnx.load(tmp_path / "missing.onnx")
    # The checker refuses a node reading a value nobody defines.
    bad = _tiny([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")])
    with pytest.raises(glcomp.GlcompError, match="invalid ONNX model"):
        glcomp.onnx.load(_save(bad, tmp_path / "bad.onnx"))
    # External data must stay inside the model's directory.
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    inner = tmp_path / "model"
    inner.mkdir()
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "24")):
        w.external_data.add(key=key, value=value)
    escaping = _tiny([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [w])
    onnx.save(escaping, str(inner / "m.onnx"))
    with pytest.raises(glcomp.GlcompError, match=r"outside the model's directory"):
        glcomp.onnx.load(inner / "m.onnx")
    # ... and inside it they load.
    (inner / "w.bin").write_bytes((np.arange(6, dtype=np.float32)).tobytes())
    w.external_data[0].value = "w.bin"
    onnx.save(_tiny([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [w]), str(inner / "ok.onnx"))
    module = glcomp.onnx.load(inner / "ok.onnx")
    np.testing.assert_array_equal(module.state_dict()["w"], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_onnx_is_optional(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = "import sys, glcomp; assert 'onnx' not in sys.modules and hasattr(glcomp.onnx, 'load')"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(glcomp.__file__).parent.parent)
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(glcomp.GlcompError, match=r"pip install glcomp\[onnx\]"):
        glcomp.onnx.load(tmp_path / "m.onnx")


# -- command line ----------------------------------------------------------------------------------
def test_cli_compiles_onnx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmodel = MLP()
    path = export(tmodel, (4, 8), tmp_path / "model.onnx")
    out = tmp_path / "out"
    args = ["compile", str(path), "-o", str(out), "--loss", "cross_entropy", "--optimizer", "sgd"]
    assert main([*args, "--input", "x=4,8"]) == 0
    assert "train_step" in capsys.readouterr().out
    prog = glcomp.load(str(out))
    assert set(prog.params) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    x, _ = data((4, 8), 3)
    predict_matches(tmodel, prog.runtime("reference"), x)
    # Static input shapes in the file: --input may be left out.
    assert main(["compile", str(path), "-o", str(tmp_path / "out2")]) == 0
    assert glcomp.load(str(tmp_path / "out2")).bundle().manifest["entries"].keys() == {"predict"}
    # A bad ONNX file is one error line.
    (tmp_path / "bad.onnx").write_bytes(b"nope")
    assert main(["compile", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "o3"), "--input", "x=4,8"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_dropout_drops_in_train_mode_only(tmp_path: Path) -> None:
    tmodel = MLP()
    plain = compile_sgd(glcomp.onnx.load(export(tmodel, (4, 8), tmp_path / "eval.onnx")), (4, 8))
    path = tmp_path / "train.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            tmodel, (torch.randn(4, 8),), str(path), input_names=["x"], dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
        )  # fmt: skip
    assert "Dropout" in {n.op_type for n in onnx.load(str(path)).graph.node}
    module = glcomp.onnx.load(path)
    prog = compile_sgd(module, (4, 8))
    ref = prog.runtime("reference")
    x, y = data((4, 8), 3)
    predict_matches(tmodel, ref, x)  # eval mode: the identity
    ops = {d["op"] for _, d in prog.graphs["gradients"].g.nodes(data=True)}
    assert "hash_uniform" in ops  # train mode: dropout masks
    # The same weights without Dropout give other gradients: the masks are applied.
    assert not np.allclose(
        ref.gradients(x=x, y=y)["fc1.weight"], plain.runtime("reference").gradients(x=x, y=y)["fc1.weight"]
    )
