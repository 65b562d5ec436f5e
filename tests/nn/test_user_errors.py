"""Mistakes a new user makes, each answered by one clear GlcompError (or one ``error:`` line and
exit status 2 on the command line): NaN/infinite hyper-parameters, functional ops on numpy
arrays, a missing example file, a port that is taken; ``--port 0`` picks a free port."""

from __future__ import annotations

import math
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
import glcomp.nn.functional as F
from glcomp import nn, optim
from glcomp.cli import main
from glcomp.errors import GlcompError

BAD = [math.nan, math.inf, -math.inf, -0.5]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize(
    "make", [optim.SGD, optim.Adam, optim.AdamW, optim.RMSprop, optim.Adagrad, optim.Adadelta]
)
def test_optimizers_refuse_bad_learning_rates(make: Any, value: float) -> None:
    with pytest.raises(GlcompError, match="learning rate"):
        make(lr=value)


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize(
    "make",
    [
        lambda v: optim.SGD(lr=0.1, momentum=v),
        lambda v: optim.SGD(lr=0.1, weight_decay=v),
        lambda v: optim.Adam(eps=v),
        lambda v: optim.Adam(weight_decay=v),
        lambda v: optim.Adam(betas=(v, 0.999)),
        lambda v: optim.Adam(betas=(0.9, v)),
        lambda v: optim.AdamW(weight_decay=v),
        lambda v: optim.RMSprop(alpha=v),
        lambda v: optim.RMSprop(momentum=v),
        lambda v: optim.Adagrad(lr_decay=v),
        lambda v: optim.Adagrad(eps=v),
        lambda v: optim.Adadelta(rho=v),
        lambda v: optim.Adadelta(eps=v),
    ],
)
def test_optimizers_refuse_bad_hyper_parameters(make: Any, value: float) -> None:
    with pytest.raises(GlcompError):
        make(value)


def test_good_hyper_parameters_still_work() -> None:
    assert optim.SGD(lr=np.float32(0.5), momentum=0.9).lr == 0.5
    assert optim.Adam(lr=0, eps=0.0).lr == 0.0


X = np.zeros((2, 3), np.float32)
Y = np.array([0, 1])


@pytest.mark.parametrize(
    "call",
    [
        lambda: F.cross_entropy(X, Y),
        lambda: F.mse_loss(X, X),
        lambda: F.relu(X),
        lambda: F.softmax(X, 1),
        lambda: F.log_softmax(X, dim=1),
        lambda: F.linear(X, np.zeros((4, 3), np.float32)),
        lambda: F.dropout(X),
        lambda: glcomp.relu(X),
        lambda: glcomp.softmax(X, 1),
        lambda: glcomp.sum(X),
        lambda: glcomp.matmul(X, X.T),
        lambda: glcomp.pow(X, 2),
    ],
)
def test_functional_ops_on_numpy_arrays_say_compile_first(call: Any) -> None:
    with pytest.raises(GlcompError, match="compile the model first"):
        call()


def test_functional_ops_still_trace() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: Any) -> Any:
            return F.log_softmax(F.relu(self.fc(x)), dim=1)

    prog = glcomp.compile(Net(), {"x": (2, 3)}, loss=F.nll_loss, optimizer=optim.SGD(lr=0.1))
    assert math.isfinite(prog.runtime("reference").train_step(x=X, y=Y))


def test_train_on_a_missing_file_says_so(tmp_path: Path, capsys: Any) -> None:
    assert main(["train", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nope.py: no such file" in err[0], err
    assert main(["train", str(tmp_path)]) == 2  # a directory: not an example file either


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("serve") / "bundle"
    model = nn.Sequential(nn.Linear(4, 3))
    glcomp.compile(model, {"x": (8, 4)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1)).save(path)
    return path


def test_serve_on_a_taken_port_prints_one_error_line(bundle: Path, capsys: Any) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        assert main(["serve", str(bundle), "--port", str(port)]) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and f"port {port}" in err[0], err
    assert main(["serve", str(bundle), "--port", "70000"]) == 2
    assert "65535" in capsys.readouterr().err


def test_serve_port_0_picks_a_free_port_and_prints_it(bundle: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "glcomp.cli", "serve", str(bundle), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "serving" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line or proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, line
        port = int(found.group(1))
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/bundle/manifest.json", timeout=10) as res:
            assert res.status == 200
    finally:
        proc.terminate()
        proc.wait(10)
