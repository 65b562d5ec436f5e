"""Recurrent state carried across batches (glcomp.compile's ``carry=``) in glcomp.js, in headless
Chromium: a bundle of tests/nn/test_carry.py's word-language-model LSTM trains as in the Python GL
runtime (the losses, the weights and the carried state ``h0``/``c0`` that train_step writes),
predict compiled with ``carry_predict=True`` writes the state, and ``rt.resetState()`` /
``rt.resetState("h0")`` zero what Python's ``rt.reset_state()`` / ``rt.reset_state("h0")`` do, on
the main thread and through the worker; another name is a GlcompError naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nn.test_carry import BATCH, NHID, _batches, _compile, _models

import glcomp
from browser.support import Site, _js, _save
from glcomp import nn, optim

pytestmark = pytest.mark.browser
RTOL, ATOL = 1e-4, 1e-5  # as tests/browser/test_browser.py
STEPS = 3


@pytest.fixture(scope="module")
def bundle(site: Site) -> Path:
    _, gmodel = _models()
    return _save(_compile(gmodel, carry_predict=True), Path(site.root) / "carry_lstm")


def _data() -> list[dict[str, np.ndarray]]:
    return [{"data": d.numpy(), "y": t.numpy()} for d, t in _batches(STEPS + 1)]


def _as_js(batches: list[dict[str, np.ndarray]]) -> list[dict[str, list[int]]]:
    return [{k: v.ravel().tolist() for k, v in b.items()} for b in batches]


def _weights(got: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.reshape(np.asarray(v["data"], np.float64), v["shape"]) for k, v in got.items()}


def _assert_same(js: dict[str, np.ndarray], py: dict[str, np.ndarray], what: str) -> None:
    assert sorted(js) == sorted(py), what
    for k, v in py.items():
        np.testing.assert_allclose(js[k], v, rtol=RTOL, atol=ATOL, err_msg=f"{what}: {k}")


TRAIN_JS = """
const { base, batches } = arg;
const flat = (w) => Object.fromEntries(Object.entries(w).map(([k, v]) =>
  [k, { shape: v.shape, data: Array.from(v.data, Number) }]));
const rt = await g.Runtime.load(base, { quiet: true });
const carried = rt.carriedState;
const losses = [];
for (const b of batches.slice(0, 3)) losses.push(await rt.trainStep(b));
const trained = flat(rt.getWeights());
rt.resetState();
const reset = flat(rt.getWeights());
const preds = [];
for (const b of batches.slice(0, 3)) {
  const out = await rt.predict({ data: b.data });
  preds.push(Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Array.from(v.data)])));
}
const predicted = flat(rt.getWeights());
rt.dispose();
return { carried, losses, trained, reset, preds, predicted };
"""


def test_the_browser_trains_and_predicts_the_carried_state_as_the_gl_runtime(
    page: Any, bundle: Path, gl_runtime: Any
) -> None:
    batches = _data()
    got = _js(page, TRAIN_JS, {"base": "/bundle/carry_lstm/", "batches": _as_js(batches)})
    assert got["carried"] == ["h0", "c0"]
    with gl_runtime(glcomp.load(bundle)) as rt:
        losses = [rt.train_step(**b) for b in batches[:STEPS]]
        trained = rt.state_dict()
        rt.reset_state()
        preds = [rt.predict(data=b["data"]) for b in batches[:STEPS]]
        predicted = rt.state_dict()
    np.testing.assert_allclose(got["losses"], losses, rtol=RTOL)
    assert np.abs(trained["h0"]).max() > 0 and np.abs(trained["c0"]).max() > 0  # train_step wrote it
    _assert_same(_weights(got["trained"]), trained, "after 3 train steps")
    reset, before = _weights(got["reset"]), _weights(got["trained"])
    assert not reset["h0"].any() and not reset["c0"].any()
    for k, v in before.items():
        if k not in ("h0", "c0"):
            np.testing.assert_array_equal(reset[k], v, err_msg=k)  # the weights stay
    for js, py in zip(got["preds"], preds, strict=True):
        assert sorted(js) == sorted(py) == ["output.0", "output.1.0", "output.1.1"]
        for k, v in py.items():
            np.testing.assert_allclose(np.reshape(js[k], v.shape), v, rtol=RTOL, atol=ATOL, err_msg=k)
    # predict (carry_predict=True) wrote the state: the last call's final state, as in Python
    after = _weights(got["predicted"])
    assert np.abs(after["h0"]).max() > 0
    _assert_same(after, predicted, "after 3 predicts")
    np.testing.assert_allclose(after["h0"], np.reshape(got["preds"][-1]["output.1.0"], (1, BATCH, NHID)))


RESET_JS = """
const { base, batches, worker } = arg;
const flat = (w) => Object.fromEntries(Object.entries(w).map(([k, v]) =>
  [k, { shape: v.shape, data: Array.from(v.data, Number) }]));
const rt = await g.load(base, { worker, quiet: true });
const out = { thread: rt.thread, carried: rt.carriedState };
for (const b of batches.slice(0, 2)) await rt.trainStep(b);
out.trained = flat(await rt.getWeights());
await rt.resetState("h0");
out.h0 = flat(await rt.getWeights());
await rt.trainStep(batches[2]);
out.stepped = flat(await rt.getWeights());
await rt.resetState(["c0"]);
out.c0 = flat(await rt.getWeights());
await rt.trainStep(batches[3]);
await rt.resetState();
out.all = flat(await rt.getWeights());
await rt.dispose();
return out;
"""


@pytest.mark.parametrize("worker", [False, True], ids=["main", "worker"])
def test_reset_state_zeroes_what_python_reset_state_does(
    page: Any, bundle: Path, gl_runtime: Any, worker: bool
) -> None:
    batches = _data()
    got = _js(page, RESET_JS, {"base": "/bundle/carry_lstm/", "batches": _as_js(batches), "worker": worker})
    assert got["thread"] == ("worker" if worker else "main") and got["carried"] == ["h0", "c0"]
    want: dict[str, dict[str, np.ndarray]] = {}
    with gl_runtime(glcomp.load(bundle)) as rt:
        for b in batches[:2]:
            rt.train_step(**b)
        want["trained"] = rt.state_dict()
        rt.reset_state("h0")
        want["h0"] = rt.state_dict()
        rt.train_step(**batches[2])  # from the zeroed h0 and the kept c0
        want["stepped"] = rt.state_dict()
        rt.reset_state(["c0"])
        want["c0"] = rt.state_dict()
        rt.train_step(**batches[3])
        rt.reset_state()
        want["all"] = rt.state_dict()
    for what, py in want.items():
        _assert_same(_weights(got[what]), py, what)
    trained, h0, c0, everything = (_weights(got[k]) for k in ("trained", "h0", "c0", "all"))
    assert np.abs(trained["h0"]).max() > 0 and np.abs(trained["c0"]).max() > 0
    assert not h0["h0"].any()
    np.testing.assert_array_equal(h0["c0"], trained["c0"])  # exactly the one named
    np.testing.assert_array_equal(h0["rnn.weight_hh_l0"], trained["rnn.weight_hh_l0"])
    assert not c0["c0"].any() and np.abs(c0["h0"]).max() > 0
    assert not everything["h0"].any() and not everything["c0"].any()
    assert np.abs(everything["decoder.weight"]).max() > 0


UNKNOWN_JS = """
const { base, batch, worker, name } = arg;
const rt = await g.load(base, { worker, quiet: true });
await rt.trainStep(batch);
const before = await rt.getWeights();
let error = null;
try { await rt.resetState(name); } catch (err) {
  error = { name: err.name, message: err.message, isError: err instanceof Error };
}
const after = await rt.getWeights();
const kept = ["h0", "c0"].every((k) => after[k].data.every((v, i) => Object.is(v, before[k].data[i])));
const anyNonzero = after.h0.data.some((v) => v !== 0);
await rt.dispose();
return { error, kept, anyNonzero };
"""


@pytest.mark.parametrize("worker", [False, True], ids=["main", "worker"])
@pytest.mark.parametrize("name", ["nope", ["c0", "nope"], ["rnn.weight_ih_l0"]], ids=["one", "list", "param"])
def test_reset_state_of_another_name_is_an_error_naming_it(
    page: Any, bundle: Path, worker: bool, name: Any
) -> None:
    batch = _as_js(_data())[0]
    got = _js(
        page, UNKNOWN_JS, {"base": "/bundle/carry_lstm/", "batch": batch, "worker": worker, "name": name}
    )
    err = got["error"]
    assert err is not None, "resetState accepted a name that is not carried"
    assert err["isError"] and err["name"] == "GlcompError"
    bad = [n for n in ([name] if isinstance(name, str) else name) if n not in ("h0", "c0")]
    assert f"resetState: {bad}" in err["message"] and "the carried inputs are ['h0', 'c0']" in err["message"]
    assert got["kept"] and got["anyNonzero"]  # nothing was reset


PLAIN_JS = """
const rt = await g.Runtime.load(arg.base, { quiet: true });
const carried = rt.carriedState;
rt.resetState();
rt.resetState([]);
let error = null;
try { rt.resetState("h0"); } catch (err) { error = err.message; }
rt.dispose();
return { carried, error };
"""


def test_a_bundle_without_carry_has_no_state_to_reset(page: Any, site: Site) -> None:
    glcomp.manual_seed(2)
    program = glcomp.compile(
        nn.Linear(3, 2), {"x": (4, 3)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1)
    )
    _save(program, Path(site.root) / "carry_none")
    got = _js(page, PLAIN_JS, {"base": "/bundle/carry_none/"})
    assert got["carried"] == []
    assert got["error"] is not None and "resetState: ['h0'] are not carried state" in got["error"]
    assert "the carried inputs are []" in got["error"]
