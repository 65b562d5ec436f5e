"""Both runtimes offer glcomp.runtime.protocol.Runtime: structurally (``isinstance`` with
``runtime_checkable``), with the protocol's signatures, and the protocol is all they share."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

import glcomp
from glcomp import nn, optim
from glcomp.runtime.gl import GLRuntime
from glcomp.runtime.protocol import Runtime
from glcomp.runtime.reference import ReferenceRuntime

RUNTIMES = (GLRuntime, ReferenceRuntime)


def _members(cls: type) -> set[str]:
    """Public methods of `cls`, with the context-manager pair."""
    return {
        k
        for k, v in vars(cls).items()
        if callable(v) and (not k.startswith("_") or k in ("__enter__", "__exit__"))
    }


def test_the_protocol_is_what_both_runtimes_share() -> None:
    assert _members(GLRuntime) & _members(ReferenceRuntime) == _members(Runtime)


@pytest.mark.parametrize("cls", RUNTIMES, ids=lambda c: c.__name__)
def test_signatures_match(cls: type) -> None:
    for name in sorted(_members(Runtime)):
        want = inspect.signature(getattr(Runtime, name))
        have = inspect.signature(getattr(cls, name))  # through functools.wraps of the GL lock
        assert list(have.parameters) == list(want.parameters), f"{cls.__name__}.{name}"
        for p, q in zip(have.parameters.values(), want.parameters.values(), strict=True):
            assert (p.kind, p.default) == (q.kind, q.default), f"{cls.__name__}.{name}: {p.name}"
            if p.name != "self":
                assert p.annotation == q.annotation, f"{cls.__name__}.{name}: {p.name}"
        returns = cls.__name__ if want.return_annotation == "Self" else want.return_annotation
        assert have.return_annotation == returns, f"{cls.__name__}.{name} returns"


def test_a_class_missing_a_member_is_not_a_runtime() -> None:
    class NoSave:
        pass

    for name in _members(Runtime) - {"save"}:
        setattr(NoSave, name, lambda self, *a, **k: None)
    assert not isinstance(NoSave(), Runtime)
    NoSave.save = lambda self, directory: directory  # type: ignore[attr-defined]
    assert isinstance(NoSave(), Runtime)


def _program() -> glcomp.Program:
    glcomp.manual_seed(0)
    return glcomp.compile(
        nn.Sequential(nn.Linear(3, 2)), {"x": (4, 3)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1)
    )


def test_runtimes_are_runtimes(gl_ctx: Any, tmp_path: Any) -> None:
    prog = _program()
    prog.save(tmp_path / "b")
    for source in (prog, glcomp.load(tmp_path / "b")):
        for kind, cls in (("reference", ReferenceRuntime), ("gl", GLRuntime)):
            with source.runtime(kind) as rt:
                assert isinstance(rt, Runtime) and type(rt) is cls
    assert typing.get_type_hints(glcomp.Program.runtime)["return"] is Runtime
    assert typing.get_type_hints(glcomp.load)["return"] is glcomp.Program
