"""A torch model built from the ops the ONNX importer composes (reflection padding, Conv1d, split,
InstanceNorm1d, PReLU, ELU, Softplus, MaxPool1d), exported by torch.onnx.export: glcomp's
predictions, gradients and SGD steps match torch's on the reference runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import glcomp
from onnx_import.test_onnx import check_training, compile_sgd, data, export, plain_layout, predict_matches

tnn = torch.nn


class Sequence1d(tnn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pad, self.conv = tnn.ReflectionPad1d(2), tnn.Conv1d(2, 4, 3)
        self.norm, self.prelu = tnn.InstanceNorm1d(4, affine=True), tnn.PReLU(4)
        self.fc = tnn.Linear(28, 3)

    def forward(self, x: Any) -> Any:
        h = self.prelu(self.norm(self.conv(self.pad(x))))
        a, b = torch.split(h, [1, 3], dim=1)
        h = tnn.functional.max_pool1d(torch.cat([tnn.functional.elu(a), tnn.functional.softplus(b)], 1), 2)
        return self.fc(h.flatten(1))


def prelu_layout(tmodel: Any, module: Any) -> Any:
    """torch exports PReLU's slope (4,) as a (4, 1) initializer of its own name."""
    slope = next(k for k in module.state_dict() if k.startswith("onnx::PRelu"))
    rest = {k: v for k, v in module.named_parameters() if k != slope}
    holder = type("Params", (), {"named_parameters": lambda self: iter(rest.items())})()
    plain = plain_layout(tmodel, holder)

    def layout(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**plain(arrays), slope: arrays["prelu.weight"].reshape(4, 1)}

    return layout


def test_composed_ops_train_like_torch(tmp_path: Path) -> None:
    tmodel = Sequence1d()
    path = export(tmodel, (4, 2, 12), tmp_path / "seq1d.onnx")
    module = glcomp.onnx.load(path)
    ops = {n.op for n in module._nodes}
    assert {"Pad", "Conv", "InstanceNormalization", "PRelu", "Split", "Elu", "Softplus", "MaxPool"} <= ops
    x, y = data((4, 2, 12), 3)
    ref = compile_sgd(module, (4, 2, 12)).runtime("reference")
    predict_matches(tmodel, ref, x)
    check_training(tmodel, module, ref, x, y, layout=prelu_layout)
