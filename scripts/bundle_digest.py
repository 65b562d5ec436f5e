"""Print one sha256 per bundle of a fixed corpus of models, for changes that must keep every bundle
byte-identical (restructurings of the code generator).

The corpus: the benchmark workloads under several pass settings, targets and storages; the
examples (digits CNN, LSTM counter, char-level GPT); a sample program of every registry op on
both dialects; and seeded random models of the GL differential fuzzer (random layers, pass
settings and dialects). Run it before and after a change and compare the outputs::

    python scripts/bundle_digest.py > before.txt
    ... change ...
    python scripts/bundle_digest.py > after.txt && diff before.txt after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT / "examples")]

import glcomp  # noqa: E402
from glcomp.codegen.bundle import build_bundle  # noqa: E402


def digest(prog: glcomp.Program) -> str:
    bundle = build_bundle(prog)
    h = hashlib.sha256(json.dumps(bundle.manifest, sort_keys=True).encode())
    for name in sorted(bundle.shaders):
        h.update(name.encode() + b"\0" + bundle.shaders[name].encode() + b"\0")
    return h.hexdigest()[:16]


def workloads() -> Iterator[tuple[str, Callable[[], glcomp.Program]]]:
    from bench import WORKLOADS

    from glcomp import nn

    settings = [
        ("default", {}),
        ("nofuse", {"fusion": False, "epilogue": False}),
        ("notile", {"tiling": False, "mrt": False, "blend": False}),
    ]
    for name, w in WORKLOADS.items():
        for label, passes in settings:
            for target in ("webgl2", "webgl1"):
                for storage in ("f32", "f16", "rgba8"):
                    if storage != "f32" and label != "default":
                        continue

                    def make(
                        w: Any = w, passes: Any = passes, target: str = target, storage: str = storage
                    ) -> Any:
                        glcomp.manual_seed(0)
                        return glcomp.compile(
                            w.model(),
                            {"x": w.x_shape},
                            loss=nn.CrossEntropyLoss(),
                            optimizer=w.optimizer(),
                            target=target,
                            passes=passes,
                            storage=storage,
                        )

                    yield f"workload {name} {label} {target} {storage}", make


def examples() -> Iterator[tuple[str, Callable[[], glcomp.Program]]]:
    for module in ("digits_cnn", "lstm_sequence", "char_gpt"):
        for target in ("webgl2", "webgl1"):

            def make(module: str = module, target: str = target) -> Any:
                spec = __import__(module).build()
                kw = {k: spec[k] for k in ("target_name", "target_spec") if k in spec}
                return glcomp.compile(
                    spec["model"], spec["inputs"], spec["loss"], spec["optimizer"], target=target, **kw
                )

            yield f"example {module} {target}", make


def op_programs() -> Iterator[tuple[str, Callable[[], glcomp.Program]]]:
    from hypothesis import HealthCheck, given, seed, settings
    from ir.test_op_facts import OpModel

    from glcomp.ir.ops import REGISTRY
    from glcomp.testing import op_cases

    cases: list[Any] = []
    for name in sorted(n for n, op in REGISTRY.items() if op.sample is not None):
        cases.clear()

        @seed(0)
        @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=op_cases(name, np.float32))
        def draw(case: Any) -> None:
            cases.append(case)

        draw()
        for i, case in enumerate(list(cases)):
            out = REGISTRY[name].shape(*case.shapes, **case.attrs)
            for target in ("webgl2", "webgl1"):
                for epi in (True, False):

                    def make(case: Any = case, out: Any = out, target: str = target, epi: bool = epi) -> Any:
                        return glcomp.compile(
                            OpModel(case), {"x": out}, target=target, passes={"epilogue": epi}
                        )

                    yield f"op {name} {i} {target} epilogue={epi}", make


def fuzz_models(count: int) -> Iterator[tuple[str, Callable[[], glcomp.Program]]]:
    from codegen.test_fuzz_gl import specs
    from hypothesis import HealthCheck, given, seed, settings

    drawn: list[Any] = []

    @seed(12345)
    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(spec=specs())
    def draw(spec: Any) -> None:
        drawn.append(spec)

    draw()
    from glcomp import nn

    for i, spec in enumerate(drawn):

        def make(spec: Any = spec) -> Any:
            glcomp.manual_seed(spec.seed)
            return glcomp.compile(
                spec.build(),
                {"x": (spec.batch, spec.channels, spec.height, spec.width)},
                loss=nn.CrossEntropyLoss(),
                optimizer=spec.make_optimizer(),
                target=spec.target,
                passes=spec.passes,
            )

        yield f"fuzz {i}", make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz", type=int, default=60, help="random models of the GL fuzzer (default 60)")
    args = parser.parse_args(argv)
    for group in (workloads(), examples(), op_programs(), fuzz_models(args.fuzz)):
        for label, make in group:
            try:
                line = digest(make())
            except glcomp.GlcompError as err:  # a refused program is part of the corpus too
                line = "refused " + hashlib.sha256(str(err).encode()).hexdigest()[:16]
            print(f"{label}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
