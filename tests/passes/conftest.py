"""Helpers of the per-pass tests: the plan of a small model or graph before and after one pass
of the pipeline, with `check_plan` run after every pass on the way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import glcomp
from glcomp.codegen.bundle import entry_plan
from glcomp.codegen.kernel_plan import KernelPlan, check_plan
from glcomp.codegen.options import CompileOptions
from glcomp.codegen.pipeline import PASS_NAMES, PIPELINE
from glcomp.codegen.target import make_target
from glcomp.ir.graph import Graph


def compiled_plan(model: Any, inputs: dict[str, Any], entry: str = "predict", **options: Any) -> KernelPlan:
    """The plan of `entry` of a small model before any pass (seeded: node ids and values fixed)."""
    glcomp.manual_seed(0)
    return entry_plan(glcomp.compile(model, inputs, **options), entry)


def graph_plan(
    graph: Graph, entry: str = "predict", passes: dict[str, bool] | None = None, **limits: Any
) -> KernelPlan:
    """The plan of a hand-built graph before any pass (webgl2 with `limits`)."""
    switches = CompileOptions.parse({"passes": passes or {}}).passes
    return KernelPlan(entry, graph, make_target("webgl2", **limits), switches)


def around(plan: KernelPlan, name: str) -> tuple[KernelPlan, KernelPlan]:
    """The plan before and after pass `name`: every pass up to it runs, each followed by
    `check_plan`."""
    for p in PIPELINE[: PASS_NAMES.index(name) + 1]:
        before, plan = plan, p.run(plan).replace(done=(*plan.done, p.name))
        check_plan(plan)
    return before, plan


def lines(text: str) -> list[str]:
    """Golden text compared line by line, each stripped (indentation in the test is free)."""
    return [line.strip() for line in text.strip().splitlines()]


def assert_golden(plan: KernelPlan | str, text: str) -> None:
    """``str(plan)`` is `text`, line by line."""
    assert lines(str(plan)) == lines(text), "\n" + str(plan)


@pytest.fixture
def plan_of() -> Callable[..., KernelPlan]:
    """compiled_plan(model, inputs, entry="predict", **options)."""
    return compiled_plan


@pytest.fixture
def graph_of() -> Callable[..., KernelPlan]:
    """graph_plan(graph, entry="predict", passes=None, **limits)."""
    return graph_plan


@pytest.fixture(name="around")
def around_fixture() -> Callable[[KernelPlan, str], tuple[KernelPlan, KernelPlan]]:
    """around(plan, name) -> (before, after)."""
    return around


@pytest.fixture
def golden() -> Callable[[KernelPlan | str, str], None]:
    """golden(plan, text): ``str(plan)`` is `text`, line by line."""
    return assert_golden
