"""examples/finetune_digits.py end to end: pretrain on digits 0-4 in Python, fine-tune the classifier on
5-9 in the page (finetune.html in headless Chromium), export, read the result back in Python."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp.serve import make_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import finetune_digits as ft

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finetune")
    ft.build(out, pretrain_steps=120)
    return out


def test_weights_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"not safetensors")
    with pytest.raises(glcomp.GlcompError, match=r"w\.safetensors"):
        ft.finetune_program(bad)
    from safetensors.numpy import save_file

    save_file({"0.weight": np.zeros((16, 1, 3, 3), np.float32)}, str(bad))
    with pytest.raises(glcomp.GlcompError, match="missing"):
        ft.finetune_program(bad)


def test_frozen_layers_leave_the_train_step(built: Path) -> None:
    prog = ft.finetune_program(built / "pretrained.safetensors")
    assert sorted(k.split(".")[1] for k in prog.opt_state if k.endswith("exp_avg")) == ["7", "7"]
    full = glcomp.compile(
        ft.model(),
        {"x": (ft.BATCH, 1, 8, 8)},
        loss=glcomp.nn.CrossEntropyLoss(),
        optimizer=glcomp.optim.Adam(),
    )
    ours, theirs = (len(p.bundle().manifest["entries"]["train_step"]["draws"]) for p in (prog, full))
    assert ours < theirs


def test_finetune_in_the_page(browser: Any, built: Path) -> None:
    from safetensors.numpy import load_file

    server = make_server(built / "bundle")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        pg.goto(f"http://127.0.0.1:{server.server_address[1]}/finetune.html")
        pg.wait_for_function(
            "['ready', 'error'].includes(window.glcompFinetune?.state.status) "
            "&& window.glcompFinetune.state.accuracy !== null",
            timeout=120_000,
        )
        before = pg.evaluate("window.glcompFinetune.state")
        assert before["status"] == "ready", before["error"]
        old = [before["accuracy"]["byClass"][c] for c in ft.PRETRAIN_CLASSES]
        new = [before["accuracy"]["byClass"][c] for c in ft.NEW_CLASSES]
        assert np.mean(old) > 0.9 and np.mean(new) < 0.1, before["accuracy"]

        # the pad and the buttons: a drawn stroke becomes an example with the chosen label
        box = pg.locator("#pad").bounding_box()
        pg.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.2)
        pg.mouse.down()
        pg.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.8, steps=8)
        pg.mouse.up()
        drawn = pg.evaluate("Array.from(window.glcompFinetune.pad.read())")
        assert 0 < sum(drawn) < 64 and max(drawn) <= 1.0
        pg.select_option("#label", "7")
        pg.click("#add")
        assert pg.evaluate("window.glcompFinetune.state.examples.map((e) => e.y)") == [7]
        pg.click("#predict")
        pg.wait_for_function("document.getElementById('probs').textContent.includes('%')")
        assert pg.evaluate("window.glcompFinetune.state.examples[0].x.every((v) => v <= 1)")
        bad = pg.evaluate(
            "(() => { try { window.glcompFinetune.addExample([1, 2], 3); }"
            " catch (e) { return e.message; } })()"
        )
        assert "64 pixels" in bad

        losses = pg.evaluate(
            "(async () => { const f = window.glcompFinetune; f.useSamples();"
            " const l = await f.finetune(80, 1); await f.evaluate(); return l; })()"
        )
        after = pg.evaluate("window.glcompFinetune.state")
        assert len(losses) == 80 and np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), losses
        new_after = [after["accuracy"]["byClass"][c] for c in ft.NEW_CLASSES]
        assert np.mean(new_after) > 0.6 and after["accuracy"]["all"] > 0.75, after["accuracy"]
        all_after = after["accuracy"]["all"]
        print(f"\nnew classes: {np.mean(new):.2f} -> {np.mean(new_after):.2f}; all: {all_after:.3f}")

        exported = bytes(pg.evaluate("Array.from(new Uint8Array(window.glcompFinetune.exportWeights()))"))
        path = built / "finetuned.safetensors"
        path.write_bytes(exported)
        pre, got = load_file(str(built / "pretrained.safetensors")), load_file(str(path))
        assert sorted(got) == sorted(pre)
        for name in ("0.weight", "0.bias", "3.weight", "3.bias"):  # frozen: bit for bit the pretrained ones
            np.testing.assert_array_equal(got[name], pre[name])
        assert np.abs(got["7.weight"] - pre["7.weight"]).max() > 1e-3

        # Python reads the exported model back and scores the held-out digits as the page did
        data = ft.digits()
        net = ft.load_finetuned(path)
        prog = glcomp.compile(net, {"x": (ft.BATCH, 1, 8, 8)})
        with prog.runtime("gl") as rt:
            acc = ft.evaluate(rt, data["x_test"], data["y_test"], ft.BATCH)
        assert abs(acc - after["accuracy"]["all"]) <= 1.5 / len(data["y_test"])
        assert not errors, errors
    finally:
        context.close()
        server.shutdown()
        server.server_close()
