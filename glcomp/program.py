"""`Program`: the facade over a compiled program: a frozen IR program (glcomp.ir.program), the
values of its state, its typed compile options, and the runtimes and bundles made from it.

The code generator never sees a Program: `Program.ir` is the frozen IR program it lowers
(glcomp.codegen.bundle.lower) with `Program.compile_options`, the options parsed once (by
`glcomp.compile` at the boundary; a loaded program's when it is first lowered again, which a
loaded program that runs its own bundle never is). The lowering is cached and shared by copies
(`with_state`, `dataclasses.replace`); state values are not part of it. Loading a bundle
(`from_bundle`) imports the bundle format and the IR, no part of the code generator."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format.program import PROGRAM_FORMAT, check_program
from glcomp.format.shaders import SHADERS_FILE, float_literal, shader_literals
from glcomp.ir.graph import Graph
from glcomp.ir.program import ENTRY_POINTS, InputSpec, IRProgram, StateSpec
from glcomp.runtime.feeds import check_feeds
from glcomp.runtime.protocol import Runtime

# Graph outputs that update a state, by prefix: the role of the state they update.
_UPDATES = {"param": "param", "buffer": "buffer", "state": "state"}
# Options kept with the program that the code generator does not read: the inputs carried across
# batches (glcomp.compile's ``carry=``, ``carry_predict=``), already in the graphs.
CARRY_OPTIONS = ("carry", "carry_predict")
# The elements all nodes of one graph of program.json may hold together (the reference
# interpreter keeps them: 2 GiB of float32).
MAX_GRAPH_ELEMENTS = 1 << 29


def _is_number(v: Any) -> bool:
    """An int or float that is not NaN (not a bool, a string or a list): infinities are
    constants too (a causal mask's -inf, which the shaders spell -3.0e38)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


__all__ = ["ENTRY_POINTS", "PROGRAM_FORMAT", "InputSpec", "Program"]  # InputSpec: glcomp.ir.program's


class _Lowering:
    """The cache of one program and its copies: the typed options (parsed once for each value of
    ``Program.options``) and the lowered bundle (for one lowering key). Pickled without the
    typed options (a worker parses them again if it lowers)."""

    def __init__(self) -> None:
        self.options_key: str | None = None
        self.options: Any = None
        self.key: Any = None
        self.bundle: Any = None
        # A loaded bundle whose program.json is not yet known to describe its shaders (see
        # Program.check_agreement); None once checked, or for a bundle compiled here.
        self.unchecked: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "bundle": self.bundle, "unchecked": self.unchecked}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.key, self.bundle = state["key"], state["bundle"]
        self.unchecked = state.get("unchecked")


def _options_key(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True, default=repr)


@dataclass
class Program:
    """What `glcomp.compile` returns. Graph input names: data inputs and target by their names,
    parameters and buffers by torch names, optimizer state as ``opt.<param>.<slot>`` and
    ``opt.step``, the learning rate as ``lr``."""

    graphs: dict[str, Graph]
    inputs: dict[str, InputSpec]
    target: InputSpec | None
    params: dict[str, np.ndarray]
    trainable: list[str]
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    counters: dict[str, np.ndarray] = field(default_factory=dict)
    opt_state: dict[str, np.ndarray] = field(default_factory=dict)
    lr: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)
    # The glcomp Optimizer compiled in: its set_lr (a scheduler's step) reaches this program's runtimes.
    optimizer: Any = field(default=None, repr=False, compare=False)
    # `options` already parsed (glcomp.codegen.options.CompileOptions), as glcomp.compile gives them.
    typed_options: InitVar[Any] = None
    # The lowering, shared by copies: graphs and options are treated as fixed once compiled (its
    # key notices replaced graphs or changed options).
    _cache: _Lowering = field(default_factory=_Lowering, repr=False, compare=False)

    def __post_init__(self, typed_options: Any) -> None:
        if typed_options is not None:
            self._cache.options_key, self._cache.options = _options_key(self.options), typed_options

    @property
    def compile_options(self) -> Any:
        """The typed compile options (glcomp.codegen.options.CompileOptions) of `options`, parsed
        once for each value they take; GlcompError naming a bad one."""
        key = _options_key(self.options)
        if self._cache.options_key != key or self._cache.options is None:
            from glcomp.codegen.options import CompileOptions

            parsed = CompileOptions.parse({k: v for k, v in self.options.items() if k not in CARRY_OPTIONS})
            self._cache.options, self._cache.options_key = parsed, key
        return self._cache.options

    @property
    def ir(self) -> IRProgram:
        """The frozen IR program that the code generator lowers: the graphs, input specs, target
        and the names, roles and shapes of the state (not its values)."""
        states = {k: StateSpec("param", tuple(np.shape(v))) for k, v in self.params.items()}
        states |= {k: StateSpec("buffer", tuple(np.shape(v))) for k, v in self.buffers.items()}
        states |= {k: StateSpec("state", tuple(np.shape(v))) for k, v in self.opt_state.items()}
        return IRProgram(
            MappingProxyType(dict(self.graphs)),
            MappingProxyType(dict(self.inputs)),
            self.target,
            MappingProxyType(states),
            tuple(self.counters),
        )

    def input_specs(self, entry: str) -> dict[str, InputSpec]:
        """What the caller feeds an entry point: data inputs, plus the target when training."""
        return IRProgram({}, self.inputs, self.target, {}, ()).input_specs(entry)

    def feeds(self, entry: str, given: dict[str, Any]) -> dict[str, np.ndarray]:
        """Validate user inputs for an entry point: every name known, none missing, shapes right."""
        specs = {k: v.to_json() for k, v in self.input_specs(entry).items()}
        return check_feeds(entry, specs, given)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {k: v.shape for k, v in self.params.items()}
        shapes |= {k: v.shape for k, v in self.buffers.items()}
        shapes |= {k: v.shape for k, v in self.counters.items()}
        return shapes

    # -- lowering, runtimes and saving ----------------------------------------------------------
    def _lowering_key(self) -> Any:
        return (
            tuple((k, id(g)) for k, g in self.graphs.items()),
            json.dumps(self.options, sort_keys=True, default=repr),
            tuple((k, np.shape(v)) for k, v in (self.params | self.buffers | self.opt_state).items()),
            tuple(self.counters),
        )

    def _lowered(self, dump_after: str | None = None) -> Any:
        """The lowered bundle (its program.json this program's), cached; `dump_after` (a pass
        name) lowers again, printing each entry's plan after that pass."""
        key = self._lowering_key()
        if self._cache.bundle is None or self._cache.key != key or dump_after is not None:
            from glcomp.codegen.bundle import lower

            bundle = lower(self.ir, self.compile_options, dump_after=dump_after)
            self._cache.bundle = dataclasses.replace(bundle, program=self.to_json())
            self._cache.key = key
        return self._cache.bundle

    def state(self) -> dict[str, np.ndarray]:
        """Every value the program's state holds: parameters, buffers, optimizer state, counters."""
        return {**self.params, **self.buffers, **self.opt_state, **self.counters}

    def bundle(self) -> Any:
        """The program lowered to a Bundle holding its current state (the lowering is reused)."""
        return self._lowered().with_state(self.state(), self.lr)

    def with_state(
        self,
        params: dict[str, np.ndarray] | None = None,
        buffers: dict[str, np.ndarray] | None = None,
        opt_state: dict[str, np.ndarray] | None = None,
        counters: dict[str, np.ndarray] | None = None,
        lr: float | None = None,
    ) -> Program:
        """A copy of this program starting from other state (same graphs; shares the lowering)."""
        changes: dict[str, Any] = {"params": params, "buffers": buffers, "opt_state": opt_state}
        changes |= {"counters": counters, "lr": lr}
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def runtime(self, kind: str = "reference", **options: Any) -> Runtime:
        """A runtime for this program, starting from the program's state: ``"reference"``
        (numpy; needs the IR graphs) or ``"gl"`` (moderngl; a loaded program runs the bundle it
        was loaded from, without compiling again). Both offer `glcomp.runtime.protocol.Runtime`."""
        if kind == "reference":
            from glcomp.ir.interpret import evaluate
            from glcomp.ir.names import program_tensor_nodes
            from glcomp.runtime.reference import ReferenceRuntime

            if not self.graphs:
                raise GlcompError(
                    "this program was loaded from a bundle without IR graphs (no program.json); "
                    "only runtime('gl') can run it"
                )
            self.check_agreement()
            return self._bound(ReferenceRuntime(self, evaluate, names=program_tensor_nodes, **options))
        if kind == "gl":
            from glcomp.runtime.gl import GLRuntime

            return self._bound(GLRuntime(self.bundle(), **options))
        raise GlcompError(f"unknown runtime {kind!r}; use 'reference' or 'gl'")

    def check_agreement(self) -> None:
        """For a program loaded from a bundle: raise GlcompError naming program.json and the first
        kernel that differs unless program.json's graphs, lowered under its compile options and
        target, give exactly the bundle's shaders and draws, so the reference runtime (which runs
        the graphs) computes what GL (which runs the shaders) does. Lazy and done once per loaded
        bundle (copies share it): the reference runtime calls it; `glcomp.load` itself and the GL
        runtime never run the code generator. Nothing to check for a compiled program, whose
        bundle is lowered from its graphs, or once the graphs or options were replaced."""
        cache = self._cache
        loaded = cache.unchecked
        if loaded is None or cache.bundle is not loaded or cache.key != self._lowering_key():
            return
        from glcomp.codegen.bundle import lower
        from glcomp.format.agreement import disagreement

        generated = lower(self.ir, self.compile_options)
        fault = disagreement(loaded.manifest, loaded.shaders, generated.manifest, generated.shaders)
        if fault is not None:
            raise GlcompError(
                f"bundle program.json: does not describe the computation of {SHADERS_FILE}: {fault} "
                "(program.json was edited, or the bundle was compiled by another version of glcomp; "
                "runtime('gl') still runs its shaders)"
            )
        cache.unchecked = None

    def _bound(self, runtime: Runtime) -> Runtime:
        if self.optimizer is not None:
            self.optimizer.bind(runtime)
        return runtime

    def save(self, directory: str | Path) -> Path:
        """Write the program with its current state as a bundle directory (manifest, shaders,
        weights, program.json), atomically: see `Bundle.save`. `glcomp.load` reads it back."""
        return self.bundle().save(directory)

    def save_weights(self, path: str | Path) -> Path:
        """Write the program's parameters and buffers (by torch name; integer buffers such as
        ``num_batches_tracked`` as 0-d int64) to the safetensors file `path`, atomically, and
        nothing else: no optimizer state, step or random-number counters. The torch twin of the
        model loads it with ``load_state_dict(safetensors.torch.load_file(path), strict=True)``;
        ``runtime.save_weights`` does the same for a runtime's trained state."""
        from glcomp.runtime.weights import save_weights

        carried = self.options.get("carry") or {}  # carry=: state of the loop, not of the model
        buffers = {k: v for k, v in self.buffers.items() if k not in carried}
        return save_weights(path, {**self.params, **buffers, **self.counters})

    def explain(self, dump_after: str | None = None) -> str:
        """The lowered program as text: per entry point each draw with its kernel, program,
        targets, viewport and estimated work (largest first), then texture memory. With
        `dump_after` (a pass of glcomp.codegen.pipeline.PASS_NAMES): instead each entry point's
        kernel plan after that pass (glcomp.codegen.explain.plans_after); GlcompError listing the
        passes for an unknown name."""
        from glcomp.codegen.explain import explain, plans_after

        if dump_after is not None:
            return plans_after(self, dump_after)
        lowered = self._lowered()
        return explain(lowered.manifest, lowered.shaders)

    def __repr__(self) -> str:
        count = sum(int(np.size(v)) for v in self.params.values())
        text = (
            f"<Program entries={','.join(self.graphs) or '-'} parameters={count} ({len(self.params)} tensors)"
        )
        try:
            m = self._lowered().manifest
        except GlcompError as err:
            return f"{text} (not lowered: {err})>"
        draws = " ".join(f"{e}={len(x['draws'])}" for e, x in m["entries"].items())
        return f"{text} draws[{draws}] texture_bytes={m['memory']['texture_bytes']}>"

    # -- program.json -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """What a bundle needs beyond its manifest and weights to rebuild this Program: the IR
        graphs as plain data, the input specs, the trainable names, the order of the state and
        the compile options. `Program.from_bundle` reads it back."""
        try:
            options = json.loads(json.dumps(self.options, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise GlcompError(f"the compile options cannot be saved as JSON ({err})") from None
        return {
            "format": PROGRAM_FORMAT,
            "version": 1,
            "graphs": {k: g.to_json() for k, g in self.graphs.items()},
            "inputs": [spec.to_json() | {"name": spec.name} for spec in self.inputs.values()],
            "target": None if self.target is None else self.target.to_json() | {"name": self.target.name},
            "trainable": list(self.trainable),
            "order": {
                "params": list(self.params),
                "buffers": list(self.buffers),
                "opt_state": list(self.opt_state),
                "counters": list(self.counters),
            },
            "options": options,
        }

    @classmethod
    def from_bundle(cls, bundle: Any) -> Program:
        """The Program a loaded bundle holds, starting from the bundle's state. Its program.json
        is untrusted: it is type-checked, graphs are rebuilt with `Graph.from_json` (registered
        ops only, shapes checked) and must agree with the manifest and weights; any fault raises
        GlcompError naming program.json. Running the result on GL reuses `bundle` as it is."""
        m = bundle.manifest
        roles = {k: st["role"] for k, st in m["states"].items()}
        data = bundle.program
        if data is None:
            program = cls._from_manifest(bundle, roles)
        else:
            program = cls._from_program_json(bundle, data, roles)
            program._cache.unchecked = bundle  # see check_agreement
        program._cache.bundle, program._cache.key = bundle, program._lowering_key()
        return program

    @classmethod
    def _from_manifest(cls, bundle: Any, roles: dict[str, str]) -> Program:
        m, w = bundle.manifest, bundle.weights
        entries = m["entries"]
        fed = set(entries.get("predict", {}).get("inputs", {}))
        specs = {}
        for name, spec in m["inputs"].items():
            specs[name] = InputSpec(name, tuple(spec["layout"]["shape"]), spec.get("dtype", "float32"))
            if spec.get("num_classes") is not None:
                specs[name] = dataclasses.replace(specs[name], num_classes=spec["num_classes"])
        target = next((specs[n] for n in specs if n not in fed), None) if "predict" in entries else None
        inputs = {n: s for n, s in specs.items() if target is None or n != target.name}
        by_role = {
            r: {k: np.array(w[k], np.float32) for k, v in roles.items() if v == r} for r in roles.values()
        }
        return cls(
            {},
            inputs,
            target,
            by_role.get("param", {}),
            [],
            by_role.get("buffer", {}),
            {k: np.array(w[k], np.int64) for k in m["counters"]},
            by_role.get("state", {}),
            float(m["hyper"].get("lr", 0.0)),
            {"target": m["target"].get("name", "webgl2")},
        )

    @classmethod
    def _from_program_json(cls, bundle: Any, data: dict[str, Any], roles: dict[str, str]) -> Program:
        from glcomp.ir.graph import Graph

        where = "bundle program.json"

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise GlcompError(f"{where}: {msg}")

        m, w = bundle.manifest, bundle.weights
        check_program(data, m)  # the schema, and the agreement with the manifest

        def spec_of(obj: dict[str, Any]) -> InputSpec:
            return InputSpec(
                obj["name"], tuple(obj["shape"]), obj["dtype"], obj.get("num_classes"), obj.get("image")
            )

        inputs = {s.name: s for s in map(spec_of, data["inputs"])}
        target = None if data["target"] is None else spec_of(data["target"])
        order, trainable, options = data["order"], data["trainable"], data["options"]
        graphs_data = data["graphs"]
        literals = shader_literals(bundle.shaders)
        graphs = {}
        shapes = {k: tuple(np.shape(w[k])) for k in w} | {k: s.shape for k, s in inputs.items()}
        if target is not None:
            shapes[target.name] = target.shape
        for entry in ENTRY_POINTS:
            if entry not in graphs_data:
                continue
            g = Graph.from_json(graphs_data[entry], f"{where}: graphs.{entry}")
            for name, n in g.inputs.items():
                if g.attrs(n)["role"] == "hyper":
                    need(
                        name in m["hyper"] and g.shape(n) == (),
                        f"graphs.{entry}: unknown hyper-parameter {name!r}",
                    )
                    continue
                need(name in shapes, f"graphs.{entry}: input {name!r} is neither a state nor an input")
                need(
                    g.shape(n) == shapes[name],
                    f"graphs.{entry}: input {name!r} has shape {g.shape(n)}, expected {shapes[name]}",
                )
            # Outputs: the manifest's (same shapes), and state updates of the states' shapes.
            outs = m["entries"][entry]["outputs"]
            outs = {k: v for k, v in outs.items() if not k.startswith("inspect:")}  # kept by inspect=
            plain = {k: n for k, n in g.outputs.items() if k.split(":", 1)[0] not in _UPDATES}
            need(
                sorted(plain) == sorted(outs),
                f"graphs.{entry}: outputs {sorted(plain)} != the manifest's {sorted(outs)}",
            )
            need(bool(plain), f"graphs.{entry}: no outputs")
            need(entry == "predict" or "loss" in plain, f"graphs.{entry}: no loss output")
            for k, n in g.outputs.items():
                want = tuple(outs[k]["layout"]["shape"]) if k in plain else None
                if k not in plain:
                    kind, _, name = k.partition(":")
                    need(
                        name in roles and roles[name] == _UPDATES[kind],
                        f"graphs.{entry}: output {k!r} updates no {_UPDATES[kind]} state",
                    )
                    want = shapes[name]
                need(
                    g.shape(n) == want,
                    f"graphs.{entry}: output {k!r} has shape {g.shape(n)}, expected {want}",
                )
            for n in g.g.nodes:
                if g.op(n) == "const":
                    value = g.attrs(n).get("value")
                    need(
                        _is_number(value),
                        f"graphs.{entry}: node {n} is a constant of value {value!r}, not a number",
                    )
                    # The reference runs these graphs and GL the shaders: a constant the shaders
                    # do not hold would make the two compute different numbers, silently.
                    need(
                        float_literal(value) in literals,
                        f"graphs.{entry}: node {n} is the constant {value!r}, which no shader of "
                        f"the bundle holds (program.json disagrees with {SHADERS_FILE})",
                    )
            elements = sum(math.prod(g.shape(n)) for n in g.g.nodes)
            need(
                elements <= MAX_GRAPH_ELEMENTS,
                f"graphs.{entry}: its nodes hold {elements} elements, more than the "
                f"{MAX_GRAPH_ELEMENTS} allowed",
            )
            graphs[entry] = g
        lr = m["hyper"].get("lr", 0.0)
        return cls(
            graphs,
            inputs,
            target,
            {k: np.array(w[k], np.float32) for k in order["params"]},
            list(trainable),
            {k: np.array(w[k], np.float32) for k in order["buffers"]},
            {k: np.array(w[k], np.int64) for k in order["counters"]},
            {k: np.array(w[k], np.float32) for k in order["opt_state"]},
            float(lr) if math.isfinite(lr) else 0.0,
            options,
        )
