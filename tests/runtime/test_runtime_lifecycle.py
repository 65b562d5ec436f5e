"""Runtimes living together: several GL runtimes in one process, calls from other threads,
release and garbage collection in any order, and the training-safety API shared by the GL and
reference runtimes (learning-rate and input checks, divergence detection, optimizer reset and
restore).

These tests build their GL runtimes the way users do (``prog.runtime("gl")``, the shared default
context) rather than on the `gl_ctx` fixture's context; `gl_ctx` is requested only so that they
fail, not skip, without OpenGL.
"""

from __future__ import annotations

import gc
import itertools
import random
import threading
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.errors import GlcompError
from glcomp.runtime import gl as gl_module
from glcomp.runtime.gl import GLRuntime

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _mlp(seed: int, sizes: tuple[int, ...], optimizer: optim.Optimizer | None = None) -> glcomp.Program:
    """A small classifier on (6, sizes[0]) inputs with 3 classes."""
    glcomp.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(sizes[-1], 3))
    return glcomp.compile(
        model,
        {"x": (6, sizes[0])},
        loss=nn.CrossEntropyLoss(),
        optimizer=optimizer or optim.Adam(lr=0.05),
    )


def _batch(prog: glcomp.Program, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = prog.inputs["x"].shape
    return {"x": rng.normal(size=shape).astype(np.float32), "y": rng.integers(0, 3, size=shape[0])}


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        np.testing.assert_allclose(got[name], want[name], **TOL, err_msg=f"{what}: {name}")


# -- several runtimes in one process ---------------------------------------------------------------
def test_interleaved_runtimes_of_different_bundles_match_the_reference(gl_ctx: Any) -> None:
    progs = [_mlp(1, (5, 7)), _mlp(2, (4, 6, 5)), _mlp(3, (3,))]
    # Created the ways users create them: each used to get a standalone context of its own.
    gls = [progs[0].runtime("gl"), GLRuntime(build_bundle(progs[1])), progs[2].runtime("gl")]
    refs = [p.runtime("reference") for p in progs]
    calls = [(i, op) for i in range(3) for op in ("predict", "train", "train", "state", "predict")]
    random.Random(0).shuffle(calls)
    for n, (i, op) in enumerate(calls):
        batch = _batch(progs[i], n)
        if op == "predict":
            np.testing.assert_allclose(gls[i].predict(x=batch["x"]), refs[i].predict(x=batch["x"]), **TOL)
        elif op == "train":
            assert gls[i].train_step(**batch) == pytest.approx(refs[i].train_step(**batch), rel=1e-4)
        else:
            _same(gls[i].state_dict(), refs[i].state_dict(), f"runtime {i}")
    # Free them in a shuffled order, by release() or by dropping them, checking the rest each time.
    alive = [0, 1, 2]
    for k, i in enumerate([1, 0, 2]):
        if k % 2:
            gls[i].release()
        else:
            gls[i] = None  # type: ignore[call-overload]
            gc.collect()
        alive.remove(i)
        for j in alive:
            batch = _batch(progs[j], 100 + k)
            assert gls[j].train_step(**batch) == pytest.approx(refs[j].train_step(**batch), rel=1e-4)
            _same(gls[j].state_dict(), refs[j].state_dict(), f"runtime {j} after freeing {i}")


def test_runtime_on_its_own_context_beside_shared_ones(gl_ctx: Any) -> None:
    prog = _mlp(4, (5, 4))
    batch = _batch(prog, 0)
    ref = prog.runtime("reference")
    shared = prog.runtime("gl")
    on_fixture = prog.runtime("gl", ctx=gl_ctx)
    own = prog.runtime("gl", own_context=True)
    assert own.ctx is not shared.ctx and shared.ctx is gl_module.default_context()
    want = ref.train_step(**batch)
    for rt in (own, shared, on_fixture):
        assert rt.train_step(**batch) == pytest.approx(want, rel=1e-4)
    own.release()
    assert gl_module._is_released(own.ctx)  # the context it created is freed with it
    assert not gl_module._is_released(shared.ctx) and not gl_module._is_released(gl_ctx)
    for rt in (shared, on_fixture):
        _same(rt.state_dict(), ref.state_dict(), "after releasing the owned context")
        rt.release()


# -- threads ---------------------------------------------------------------------------------------
def _in_thread(fn: Any) -> Any:
    result: dict[str, Any] = {}

    def body() -> None:
        try:
            result["value"] = fn()
        except BaseException as err:  # handed to the main thread
            result["error"] = err

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_runtime_used_from_other_threads(gl_ctx: Any) -> None:
    prog = _mlp(5, (5, 6))
    batch = _batch(prog, 1)
    ref = prog.runtime("reference")
    gl = prog.runtime("gl")  # created and first used on this thread, then used on another
    want = [ref.train_step(**batch) for _ in range(5)]
    assert [gl.train_step(**batch) for _ in range(2)] == pytest.approx(want[:2], rel=1e-4)
    losses = _in_thread(lambda: [gl.train_step(**batch) for _ in range(3)])
    want = want[2:]
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    _same(gl.state_dict(), ref.state_dict(), "after steps on another thread")
    born_elsewhere = _in_thread(lambda: prog.runtime("gl"))  # created on another, used on this one
    np.testing.assert_allclose(
        born_elsewhere.predict(x=batch["x"]), prog.runtime("reference").predict(x=batch["x"]), **TOL
    )
    born_elsewhere.release()
    gl.release()


def test_concurrent_threads_on_shared_and_separate_runtimes(gl_ctx: Any) -> None:
    progs = [_mlp(6, (5, 6)), _mlp(7, (4, 5))]
    gls = [p.runtime("gl") for p in progs]
    batches = [_batch(p, 2) for p in progs]
    steps = 4
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(steps):
                gls[i].train_step(**batches[i])
                gls[i].predict(x=batches[i]["x"])
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i % 2,)) for i in range(4)]  # two per runtime
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for prog, gl, batch in zip(progs, gls, batches, strict=True):
        ref = prog.runtime("reference")
        for _ in range(2 * steps):  # the same batch each step, so the order of the threads is moot
            ref.train_step(**batch)
        _same(gl.state_dict(), ref.state_dict(), "after concurrent steps")
        gl.release()


# -- lifetime --------------------------------------------------------------------------------------
def test_context_manager_release_is_idempotent_and_final(gl_ctx: Any) -> None:
    prog = _mlp(8, (5, 4))
    batch = _batch(prog, 0)
    for kind in ("gl", "reference"):
        with prog.runtime(kind) as rt:
            rt.train_step(**batch)
        rt.release()  # a second release does nothing
        for use in (
            lambda rt=rt: rt.predict(x=batch["x"]),
            lambda rt=rt: rt.train_step(**batch),
            lambda rt=rt: rt.state_dict(),
            lambda rt=rt: rt.set_lr(0.1),
        ):
            with pytest.raises(GlcompError, match="released"):
                use()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_create_and_drop_cycles_keep_memory_and_gl_objects_flat(gl_ctx: Any) -> None:
    prog = _mlp(9, (5, 6))
    bundle = build_bundle(prog)
    batch = _batch(prog, 0)
    keeper = prog.runtime("gl")  # another runtime on the same context must survive every cycle
    keeper.train_step(**batch)
    want = keeper.state_dict()
    held: list[list[Any]] = []  # what each dropped runtime held, to check that it was freed

    def cycle() -> None:
        rt = GLRuntime(bundle)
        rt.train_step(**batch)
        held.append(rt._objects)
        assert rt.gl_objects() > 0
        # dropped here without release(): the finalizer frees it

    for _ in range(10):  # warm-up: allocator pools and the driver's caches settle
        cycle()
    before = _rss_mib()
    for _ in range(60):
        cycle()
    grown = _rss_mib() - before
    assert all(objects == [] for objects in held), "a dropped runtime kept GL objects"
    assert grown < 20, f"RSS grew by {grown:.1f} MiB over 60 create/drop cycles"
    _same(keeper.state_dict(), want, "the runtime that stayed")
    keeper.release()


def test_runtime_collected_during_a_gl_call_is_freed_by_the_next_call(gl_ctx: Any) -> None:
    prog = _mlp(10, (5, 4))
    other = prog.runtime("gl")
    dropped = prog.runtime("gl")
    objects = dropped._objects
    with gl_module._exclusive():  # as when a collection starts inside a GL call on this thread
        del dropped
        gc.collect()
        assert objects, "freed while the GL lock was held"
    other.predict(x=_batch(prog, 0)["x"])
    assert objects == []
    other.release()


class _FailingAllocations:
    """A context that reports GL_OUT_OF_MEMORY after each texture allocation."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.mglo = ctx.mglo
        self.error = "GL_NO_ERROR"

    def texture(self, *args: Any, **kwargs: Any) -> Any:
        self.error = "GL_OUT_OF_MEMORY"
        return self._ctx.texture(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def __enter__(self) -> Any:
        return self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def test_failed_texture_allocation_names_the_texture(gl_ctx: Any) -> None:
    bundle = build_bundle(_mlp(11, (5, 4)))
    first = next(iter(bundle.manifest["textures"]))
    with pytest.raises(GlcompError, match=rf"texture '{first}' \(\d+x\d+ RGBA32F.*GL_OUT_OF_MEMORY"):
        GLRuntime(bundle, ctx=_FailingAllocations(gl_ctx))


# -- training safety, the same on both runtimes ---------------------------------------------------
KINDS = ("reference", "gl")


@pytest.mark.parametrize("kind", KINDS)
def test_set_lr_refuses_what_is_not_a_usable_rate(kind: str, gl_ctx: Any) -> None:
    rt = _mlp(12, (5, 4)).runtime(kind)
    for bad in (float("nan"), float("inf"), -0.1, "0.1", None, True, [0.1]):
        with pytest.raises(GlcompError, match="set_lr"):
            rt.set_lr(bad)
    for good in (0, 0.5, np.float32(0.25)):
        rt.set_lr(good)


@pytest.mark.parametrize("kind", KINDS)
def test_inputs_beyond_float32_are_refused(kind: str, gl_ctx: Any) -> None:
    prog = _mlp(13, (5, 4))
    batch = _batch(prog, 0)
    rt = prog.runtime(kind)
    for value in (1e39, -4e38, np.inf, np.nan):
        x = batch["x"].astype(np.float64)
        x[2, 3] = value
        with pytest.raises(GlcompError, match="input 'x'"):
            rt.train_step(x=x, y=batch["y"])
    rt.train_step(x=batch["x"].astype(np.float64) * 1e3, y=batch["y"])  # large but in range


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_train_steps_stops_at_the_first_non_finite_loss_it_reads(kind: str, gl_ctx: Any) -> None:
    prog = _mlp(14, (5, 4))
    batch = _batch(prog, 0)
    rt = prog.runtime(kind)
    rt.set_lr(1e38)  # Adam moves every weight by about lr: the logits overflow
    with pytest.raises(GlcompError, match=r"loss is (nan|inf) at step 5 .*steps 1-5.*load_state_dict"):
        rt.train_steps([batch] * 20, read_every=5)
    assert float(rt.optimizer_state()["opt.step"]) == 5  # no step after the read point ran
    with pytest.raises(GlcompError, match=r"loss is (nan|inf) at step 3 of"):
        rt.train_steps([batch] * 3)  # read_every=0: the last loss is checked
    assert not np.isfinite(rt.train_step(**batch))  # a single step returns the loss as it is


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_reset_and_restore_the_optimizer(kind: str, gl_ctx: Any) -> None:
    prog = _mlp(15, (5, 4), optimizer=optim.Adam(lr=0.05))
    batches = [_batch(prog, s) for s in range(3)]
    ref = prog.runtime("reference")  # the oracle for both kinds
    with prog.runtime(kind) as rt:
        for b in batches:
            rt.train_step(**b)
            ref.train_step(**b)
        weights, opt = rt.state_dict(), rt.optimizer_state()
        _same(opt, ref.optimizer_state(), "optimizer state")
        assert float(opt["opt.step"]) == 3 and any(np.any(v != 0) for v in opt.values())

        rt.set_lr(1e38)
        with pytest.raises(GlcompError, match="loss is"):
            rt.train_steps(batches)  # diverges
        rt.set_lr(0.05)
        rt.load_state_dict(weights, optimizer=opt)  # back to step 3, moments and all
        _same(rt.state_dict(), weights, "weights restored")
        _same(rt.optimizer_state(), opt, "optimizer restored")
        assert rt.train_step(**batches[0]) == pytest.approx(ref.train_step(**batches[0]), rel=1e-4)
        _same(rt.state_dict(), ref.state_dict(), "a step after restoring")

        rt.load_state_dict(weights, optimizer="reset")
        ref.load_state_dict(weights, optimizer="reset")
        assert all(np.all(v == 0) for v in rt.optimizer_state().values())
        assert rt.train_step(**batches[1]) == pytest.approx(ref.train_step(**batches[1]), rel=1e-4)
        _same(rt.state_dict(), ref.state_dict(), "a step after the reset")
        assert float(rt.optimizer_state()["opt.step"]) == 1

        rt.reset_optimizer()
        assert all(np.all(v == 0) for v in rt.optimizer_state().values())

        # Bad arguments are refused before anything is loaded.
        now = rt.state_dict()
        for bad, match in (
            ("zero", "optimizer must be None"),
            ({k: v for k, v in opt.items() if k != "opt.step"}, r"missing keys \['opt.step'\]"),
            (opt | {"opt.step": np.float32(np.nan)}, "'opt.step' holds NaN"),
        ):
            with pytest.raises(GlcompError, match=match):
                rt.load_state_dict(weights, optimizer=bad)
            _same(rt.state_dict(), now, "weights after a refused load")
