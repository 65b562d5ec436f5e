"""The IR graph: text form, validation of the written contract, determinism, pruning."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import GlcompError, nn
from glcomp.ir.graph import Graph, origin
from glcomp.ir.tensor import Tensor

LINE = re.compile(r"^%(\d+):f32\[([\d,]*)\] = (\w+)(\[[^\]]*\])?((?: %\d+)*)\s*(?:# (.*))?$")


def cnn() -> nn.Sequential:
    glcomp.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))


def traced() -> Graph:
    return glcomp.trace(cnn(), x=(2, 1, 4, 4))


# -- text form -------------------------------------------------------------------------------------
def test_text_form_has_one_line_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    g = traced()
    print(g)
    text = capsys.readouterr().out.rstrip("\n")
    assert text == str(g)
    lines = text.splitlines()
    assert len(lines) == g.g.number_of_nodes() + 1
    assert lines[-1] == f"return output=%{g.outputs['output']}"
    order = []
    for line in lines[:-1]:
        m = LINE.match(line)
        assert m, f"unexpected line format: {line!r}"
        n = int(m.group(1))
        order.append(n)
        assert g.op(n) == m.group(3)
        assert tuple(int(s) for s in m.group(2).split(",") if s) == g.shape(n)
        assert [int(o) for o in re.findall(r"%(\d+)", m.group(5))] == g.operands(n)
        assert (m.group(6) or "") == g.node(n)["origin"]
    assert order == g.topo()


def test_text_form_names_ops_and_origins() -> None:
    lines = str(traced()).splitlines()

    def line_of(op: str) -> str:
        found = [ln for ln in lines if re.search(rf"= {re.escape(op)}", ln)]
        assert found, f"no {op} line"
        return found[0]

    assert line_of("conv2d").endswith("# 0 (Conv2d)")
    assert "padding=(1,1)" in line_of("conv2d") and "stride=(1,1)" in line_of("conv2d")
    assert line_of("relu").endswith("# 1 (ReLU)")
    assert line_of("reshape[shape=(2,32)]").endswith("# 2 (Flatten)")
    assert line_of("matmul").endswith("# 3 (Linear)")
    inputs = [ln for ln in lines if "= input[" in ln]
    assert len(inputs) == 5 and any("name=x" in ln and "role=data" in ln for ln in inputs)
    assert any("name=3.weight" in ln and "role=param" in ln for ln in inputs)


def test_backward_nodes_are_labelled() -> None:
    prog = glcomp.compile(cnn(), {"x": (2, 1, 4, 4)}, loss=nn.CrossEntropyLoss())
    text = str(prog.graphs["gradients"])
    assert re.search(r"= conv2d_weight_grad\[.*# 0 \(Conv2d\) \[grad\]$", text, re.M)
    assert "return loss=%" in text and "grad:0.weight=%" in text


# -- validation ------------------------------------------------------------------------------------
def node_with_op(g: Graph, op: str) -> int:
    return next(n for n in g.topo() if g.op(n) == op)


def corrupt_shape(g: Graph) -> None:
    g.node(node_with_op(g, "matmul"))["shape"] = (2, 4)


def corrupt_index(g: Graph) -> None:
    n = node_with_op(g, "matmul")
    src = g.operands(n)[1]
    key = next(iter(g.g[src][n]))
    g.g[src][n][key]["index"] = 5


def drop_operand(g: Graph) -> None:
    n = node_with_op(g, "add")
    g.g.remove_edge(g.operands(n)[1], n)


def add_cycle(g: Graph) -> None:
    g.g.add_edge(g.outputs["output"], node_with_op(g, "relu"), index=1)


def unknown_op(g: Graph) -> None:
    g.node(node_with_op(g, "relu"))["op"] = "gelu_unregistered"


def bad_attr(g: Graph) -> None:
    g.attrs(node_with_op(g, "conv2d"))["stride"] = (2, 2)


def missing_output(g: Graph) -> None:
    g.outputs["extra"] = 10_000


def bad_input(g: Graph) -> None:
    g.inputs["x"] = node_with_op(g, "relu")


CORRUPTIONS = {
    "wrong shape": (corrupt_shape, r"shape \(2, 4\) != inferred \(2, 3\)"),
    "bad operand index": (corrupt_index, r"bad operand indices \[0, 5\]"),
    "missing operand": (drop_operand, "operand"),
    "cycle": (add_cycle, "cycle"),
    "unknown op": (unknown_op, "gelu_unregistered"),
    "attr changes the shape": (bad_attr, "shape"),
    "output to a missing node": (missing_output, "'extra'"),
    "input that is not an input node": (bad_input, "'x'"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_validate_catches_corruption(name: str) -> None:
    corrupt, pattern = CORRUPTIONS[name]
    g = traced()
    g.validate()
    bad = g.copy()
    corrupt(bad)
    with pytest.raises(GlcompError, match=pattern):
        bad.validate()
    g.validate()  # the copy was corrupted, not the original


def test_validate_message_shows_the_node() -> None:
    g = traced()
    corrupt_shape(g)
    with pytest.raises(GlcompError, match=r"%\d+:f32\[2,4\] = matmul .*# 3 \(Linear\)"):
        g.validate()


def test_add_checks_shapes_and_arity() -> None:
    g = Graph()
    a = g.add_input("a", (2, 3), "data")
    b = g.add_input("b", (3, 2), "data")
    with pytest.raises(GlcompError, match="different shapes"):
        g.add("add", [a, b])
    with pytest.raises(GlcompError, match="takes 2 operands, got 1"):
        g.add("mul", [a])
    with pytest.raises(GlcompError, match="declared twice"):
        g.add_input("a", (1,), "data")
    with pytest.raises(ValueError, match="role"):
        g.add_input("c", (1,), "weights")
    with origin("head (Linear)"), pytest.raises(GlcompError, match=r"^head \(Linear\): matmul size mismatch"):
        g.add("matmul", [a, a])


# -- determinism -----------------------------------------------------------------------------------
def test_tracing_is_deterministic() -> None:
    model = cnn()
    assert str(glcomp.trace(model, x=(2, 1, 4, 4))) == str(glcomp.trace(model, x=(2, 1, 4, 4)))
    assert str(traced()) == str(traced())  # fresh models from the same seed


def test_compiled_graphs_are_deterministic() -> None:
    def graphs() -> dict[str, str]:
        model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3))
        prog = glcomp.compile(model, {"x": (6, 4)}, loss=nn.CrossEntropyLoss(), optimizer=glcomp.optim.Adam())
        return {k: str(v) for k, v in prog.graphs.items()}

    first, second = graphs(), graphs()
    assert sorted(first) == ["gradients", "predict", "train_step"]
    assert first == second


def test_topological_order_breaks_ties_by_id() -> None:
    g = Graph()
    a = Tensor(g, g.add_input("a", (2,), "data"))
    b = Tensor(g, g.add_input("b", (2,), "data"))
    late = b.exp()  # created first, uses the later input
    early = a.tanh()
    g.outputs["out"] = (early + late).node
    order = g.topo()
    assert order == sorted(order)  # ids are already a valid topological order here
    for n in order:
        assert all(order.index(o) < order.index(n) for o in g.operands(n))


# -- pruning ---------------------------------------------------------------------------------------
class IgnoresInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 2)

    def forward(self, x: Any, mask: Any) -> Any:
        _dead = self.unused(x).exp()
        return self.used(x)


def test_prune_keeps_inputs_and_drops_dead_nodes() -> None:
    g = glcomp.trace(IgnoresInputs(), x=(4, 3), mask=(4, 2))
    assert set(g.inputs) == {"x", "mask", "used.weight", "used.bias", "unused.weight", "unused.bias"}
    for n in g.inputs.values():
        assert n in g.g and g.op(n) == "input"
    ops = [g.op(n) for n in g.nodes()]
    assert "exp" not in ops
    assert ops.count("matmul") == 1
    rt = glcomp.compile(IgnoresInputs(), {"x": (4, 3), "mask": (4, 2)}).runtime("reference")
    assert rt.predict(x=np.ones((4, 3)), mask=np.zeros((4, 2))).shape == (4, 2)


def test_prune_returns_a_copy() -> None:
    g = Graph()
    x = Tensor(g, g.add_input("x", (3,), "data"))
    unused = g.add_input("unused", (2,), "param")
    dead = x.exp()
    g.outputs["out"] = x.tanh().node
    pruned = g.prune()
    assert dead.node in g.g and dead.node not in pruned.g
    assert unused in pruned.g and pruned.inputs == g.inputs and pruned.outputs == g.outputs
    pruned.validate()
    assert pruned.g.number_of_nodes() == g.g.number_of_nodes() - 1
