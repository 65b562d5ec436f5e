"""examples/char_gpt.py: the character-level GPT trains on the GL runtime as its torch original does.

The example is loaded twice from its own source: as written (``import glcomp as torch``) and with
only its three import lines swapped for torch's, which is the claim the example makes. Both get a
tiny configuration (the module-level hyperparameters, as in nanoGPT), the same weights, and are
compared on logits, gradients and four AdamW steps (torch in float64).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp.cli import main
from glcomp.serve import export_data, make_server

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"
GLCOMP_IMPORTS = "import glcomp as torch\nfrom glcomp import nn\nfrom glcomp.nn import functional as F\n"
TORCH_IMPORTS = "import torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"
TINY = {"batch_size": 2, "block_size": 8, "n_embd": 16, "n_head": 2, "n_layer": 1, "dropout": 0.0}
RTOL, ATOL = 2e-4, 1e-5


def load_example(library: str, **config: Any) -> ModuleType:
    """The example's module, run from its source with glcomp's or torch's imports, then `config`
    set on its hyperparameters (read when the model is built)."""
    source = EXAMPLE.read_text(encoding="utf-8")
    assert GLCOMP_IMPORTS in source, "the example must import glcomp the way its torch original imports torch"
    if library == "torch":
        source = source.replace(GLCOMP_IMPORTS, TORCH_IMPORTS)
    module = ModuleType(f"char_gpt_{library}")
    module.__file__ = str(EXAMPLE)
    exec(compile(source, str(EXAMPLE), "exec"), module.__dict__)  # the repository's own example
    module.__dict__.update(config)
    return module


def close(got: Any, want: Any, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert np.shape(got) == want.shape, what
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def test_char_gpt_on_gl_matches_torch(gl_runtime: Any) -> None:
    g, t = load_example("glcomp", **TINY), load_example("torch", **TINY)
    glcomp.manual_seed(0)
    gmodel = g.GPTLanguageModel()
    tmodel = t.GPTLanguageModel()
    state = gmodel.state_dict()
    assert list(state) == list(tmodel.state_dict()), "parameter names or order differ from torch"
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    tmodel.double()

    b, block = TINY["batch_size"], TINY["block_size"]
    x_all, y_all = g.windows(np.asarray(g.encode(g.text[:400])), stride=3)
    rng = np.random.default_rng(0)
    batches = [rng.choice(len(x_all), b, replace=False) for _ in range(4)]
    spec = {"shape": (b, block), "dtype": "int32", "num_classes": g.vocab_size}
    opt = g.torch.optim.AdamW(gmodel.parameters(), lr=3e-3)
    prog = glcomp.compile(
        gmodel, {"idx": (b, block)}, loss="forward", optimizer=opt, target_name="targets", target_spec=spec
    )
    topt = torch.optim.AdamW(tmodel.parameters(), lr=3e-3)
    with gl_runtime(prog) as gl:
        idx, targets = x_all[batches[0]], y_all[batches[0]]
        tmodel.eval()
        tlogits, tnone = tmodel(torch.tensor(idx, dtype=torch.long))
        assert tnone is None
        close(gl.predict(idx=idx), tlogits, "predict: the logits (B, T, vocab_size)")
        tmodel.train()
        losses = []
        for step, rows in enumerate(batches):
            idx, targets = x_all[rows], y_all[rows]
            topt.zero_grad()
            _, tloss = tmodel(torch.tensor(idx, dtype=torch.long), torch.tensor(targets, dtype=torch.long))
            tloss.backward()
            if step == 0:
                grads = gl.gradients(idx=idx, targets=targets)
                assert sorted(grads) == sorted(k for k, _ in tmodel.named_parameters())
                for k, p in tmodel.named_parameters():
                    close(grads[k], p.grad, f"gradient of {k}")
            losses.append(gl.train_step(idx=idx, targets=targets))
            assert losses[-1] == pytest.approx(tloss.item(), rel=RTOL), f"loss of step {step + 1}"
            topt.step()
        trained = gl.state_dict()
        for k, v in tmodel.state_dict().items():
            if k.endswith("tril"):
                continue
            close(trained[k], v, f"{k} after 4 AdamW steps")
    assert losses[0] == pytest.approx(np.log(g.vocab_size), rel=0.05), "nanoGPT's init starts near uniform"


def test_glcomp_train_runs_the_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`glcomp train examples/char_gpt.py` on a copy with a tiny configuration (reference runtime):
    the loss goes down, the test windows are scored per position and a sample is printed."""
    shutil.copytree(EXAMPLE.parent / "data", tmp_path / "data")
    source = EXAMPLE.read_text(encoding="utf-8")
    config = TINY | {"batch_size": 16, "n_embd": 32, "max_iters": 30, "learning_rate": 1e-2}
    config["max_new_tokens"] = 12
    for name, value in config.items():
        lines = [line for line in source.splitlines() if line.startswith(f"{name} = ")]
        assert len(lines) == 1, name
        source = source.replace(lines[0], f"{name} = {value!r}")
    example = tmp_path / "char_gpt.py"
    example.write_text(source, encoding="utf-8")
    out = tmp_path / "run"
    assert main(["train", str(example), "--runtime", "reference", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "training: 30 steps of batch 16" in text
    steps = [line for line in text.splitlines() if line.startswith("step ")]
    losses = [float(line.split("loss ")[1].split()[0]) for line in steps]
    assert len(losses) >= 10 and losses[-1] < losses[0] - 0.3, losses
    assert "test accuracy per position: " in text and "cross-entropy" in text
    sample = text.split("sample:\n", 1)[1]
    assert sample.startswith("MENENIUS:\n") and len(sample.split("\nsaved ")[0]) == len("MENENIUS:\n") + 12
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_cross_entropy"] < np.log(58) and metrics["steps"] == 30
    from safetensors.numpy import load_file

    data = load_file(str(out / "bundle" / "data.safetensors"))
    chars = sorted(set((EXAMPLE.parent / "data" / "coriolanus.txt").read_text(encoding="utf-8")))
    assert "".join(map(chr, data["vocab"])) == "".join(chars)
    assert data["x_train"].shape[1:] == data["y_train"].shape[1:] == (TINY["block_size"],)


@pytest.mark.browser
def test_demo_page_trains_the_char_gpt(browser: Any, tmp_path: Path) -> None:
    """The demo page trains the example's bundle (tiny configuration) in Chromium: the loss goes
    down, accuracy is counted per position and text is sampled with the shipped vocabulary."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    g = load_example("glcomp", **TINY | {"batch_size": 8})
    glcomp.manual_seed(0)
    spec = g.build()
    prog = glcomp.compile(
        spec["model"], spec["inputs"], spec["loss"], spec["optimizer"],
        target_name=spec["target_name"], target_spec=spec["target_spec"],
    )  # fmt: skip
    prog.save(tmp_path / "bundle")
    data = spec["data"]
    train, test = slice(0, 400), slice(0, 16)
    export_data(
        tmp_path / "bundle", data["x_train"][train], data["y_train"][train], data["x_test"][test],
        data["y_test"][test], extra={"vocab": data["vocab"]},
    )  # fmt: skip
    server = make_server(tmp_path / "bundle")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        start = time.perf_counter()
        pg.goto(
            f"http://127.0.0.1:{server.server_address[1]}/?epochs=2&steps=8&sample=24&lr=0.01&autostart=1"
        )
        try:
            pg.wait_for_function("['done', 'error'].includes(window.glcompDemo?.status)", timeout=240_000)
        except PlaywrightTimeout:
            demo = pg.evaluate("window.glcompDemo")
            where = f"{demo['status']}, {demo['steps']} steps"
            pytest.fail(f"the demo did not finish in 240 s: {where} (a loaded machine?)", pytrace=False)
        demo = pg.evaluate("window.glcompDemo")
        assert demo["status"] == "done", demo["error"]
        seconds, first, per_step = time.perf_counter() - start, demo["firstStepMs"], demo["msPerStep"]
        print(f"\nchar GPT demo: 16 steps in {seconds:.1f} s (first {first:.0f} ms, then {per_step:.0f} ms)")
        assert demo["steps"] == len(demo["losses"]) == 16
        assert demo["losses"][0] == pytest.approx(np.log(g.vocab_size), rel=0.05)
        assert np.mean(demo["losses"][-4:]) < np.mean(demo["losses"][:4]) - 0.2, demo["losses"]
        assert len(demo["accuracies"]) == 2 and 0.0 <= demo["accuracy"] <= 1.0
        assert pg.locator("#accuracy").inner_text().startswith("test accuracy per position after epoch 2")
        prompt = "".join(g.itos[int(i)] for i in data["x_test"][0])
        sample = demo["sample"]
        assert sample.startswith(prompt) and len(sample) == len(prompt) + 24, sample
        assert set(sample) <= set(g.chars)
        assert pg.locator("#sample-text").inner_text() == sample[len(prompt) :]
        assert not errors, errors
    finally:
        context.close()
        server.shutdown()
        server.server_close()


def test_train_spec_and_export_data_errors(tmp_path: Path) -> None:
    from glcomp.cli import _train_spec

    g = load_example("glcomp", **TINY)
    base = g.build()
    without_spec = {k: v for k, v in base.items() if k != "target_spec"}
    for spec, message in [
        (without_spec, 'loss "forward" needs target_spec'),
        (base | {"steps": 0}, "steps must be a positive integer"),
        (base | {"sample": "text"}, "sample must be a function of the trained runtime"),
        (base | {"loss": "backward"}, 'loss must be a glcomp.nn Module or "forward"'),
    ]:
        with pytest.raises(glcomp.GlcompError, match=message):
            _train_spec(spec, "char_gpt.py")
    checked = _train_spec(base, "char_gpt.py")
    assert checked.steps == g.max_iters and checked.target_name == "targets"
    assert list(checked.extra) == ["vocab"] and checked.extra["vocab"].dtype == np.int64
    x, y = np.zeros((2, 3)), np.zeros((2, 3), np.int32)
    with pytest.raises(glcomp.GlcompError, match="extra arrays may not be named x_test"):
        export_data(tmp_path, x, y, x, y, extra={"x_test": x})
    with pytest.raises(glcomp.GlcompError, match="vocab must hold numbers"):
        export_data(tmp_path, x, y, x, y, extra={"vocab": np.array(["a", "b"])})
