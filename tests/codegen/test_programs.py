"""Program sharing: kernels that differ only in node ids share one GLSL program."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from conftest import LastStep
from hypothesis import given, settings
from hypothesis import strategies as st

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.programs import canonical, merge_origins, sharing_key

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "char_gpt.py"


def test_canonical_renames_node_ids_consistently() -> None:
    src = (
        "// k3_add: nodes %7, %9\n// from fc\n"
        "float v7(int i0) { return glc_fetch_9(i0, 0) + texture(s9_0, s9_1); }\n"
    )
    out, renamed, offsets = canonical(src)
    assert "nodes %" not in out and "// from fc" in out
    assert "v0(" in out and "glc_fetch_1(" in out and "s1_0" in out and "s1_1" in out
    assert renamed == {"v7": "v0", "glc_fetch_9": "glc_fetch_1", "s9_0": "s1_0", "s9_1": "s1_1"}
    assert offsets == {}
    other, _, _ = canonical(src.replace("7", "12").replace("9", "30"))
    assert other == out
    # every generated name holding a node id: locals, vec4 and transposed-texel fetches
    more = "vec4 v7_4(int i0, int j0) {\n  vec4 e9 = glc_fetcht_9(i0, j0) + glc_fetch_9_4(i0, j0);\n"
    more += "  return e9;\n}\n"
    out, renamed, _ = canonical(more)
    assert out == canonical(more.replace("9", "30"))[0] and "9" not in out
    assert renamed["glc_fetcht_9"] == "glc_fetcht_1" and renamed["e9"] == "e1"


def test_view_offsets_become_uniforms() -> None:
    def shader(t: int) -> str:
        return (
            "uniform int u_page_offset;\n"
            f"float v7(int i0, int i1) {{\n  return v3(i0, (i1 + {t}), (i0 - 2));\n}}\n"
            "for (int k = 0; k < (i1 + 4); k++) {}\n"
        )

    a, _, off_a = canonical(shader(95))
    b, _, off_b = canonical(shader(94))
    assert a == b and off_a == {"u_o0": 95, "u_o1": 2} and off_b == {"u_o0": 94, "u_o1": 2}
    assert "uniform int u_o0;" in a and "(i1 + u_o0)" in a and "(i0 - u_o1)" in a
    assert "k < (i1 + 4)" in a  # only a view's call of its operand is touched


def test_recurrence_steps_share_programs(gl_runtime) -> None:
    glcomp.manual_seed(0)
    prog = glcomp.compile(
        LastStep(3, 4, 2), {"x": (2, 12, 3)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1)
    )
    bundle = build_bundle(prog)
    draws = [d for e in bundle.manifest["entries"].values() for d in e["draws"]]
    programs = bundle.manifest["programs"]
    # Without sharing every draw of the 12 steps had a program of its own.
    assert len(programs) < 0.6 * len(draws), (len(programs), len(draws))
    x = np.random.default_rng(0).normal(size=(2, 12, 3)).astype(np.float32)
    y = np.array([0, 1])
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=1e-5, atol=1e-6)
        for _ in range(2):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-5)


class _Heads(nn.Module):
    """Two identical heads over the same input: their kernels differ only in node ids and in the
    model part they come from."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.b = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x):
        return self.a(x) * self.b(x)


def test_kernels_of_different_model_parts_share_programs(gl_runtime) -> None:
    glcomp.manual_seed(0)
    prog = glcomp.compile(_Heads(), {"x": (4, 8)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.1))
    bundle = build_bundle(prog)
    m = bundle.manifest
    # The SGD updates of the two heads' weights: one program, whose shader names both heads.
    draws = m["entries"]["train_step"]["draws"]
    writes = {t["state"]: d["program"] for d in draws for t in d["targets"] if isinstance(t, dict)}
    assert writes["a.0.weight"] == writes["b.0.weight"], writes
    shader = bundle.shaders[m["programs"][writes["a.0.weight"]]["fragment"]]
    assert "// from a.0 (Linear) [grad]" in shader and "// from b.0 (Linear) [grad]" in shader, shader[:400]
    # Shared programs compute what each kernel computed alone.
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(bundle) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=1e-5, atol=1e-6)
        for _ in range(3):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-5)


class _AttentionHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 4), nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x):
        weights = glcomp.softmax(self.q(x) @ self.k(x).transpose(-2, -1), dim=-1)
        return weights @ self.v(x)


class _Attention(nn.Module):
    """Two attention heads, concatenated and projected, with a residual: kernels repeat per head."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([_AttentionHead(), _AttentionHead()])
        self.proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        x = x + self.proj(glcomp.cat([h(x) for h in self.heads], dim=-1))
        return self.out(x).sum(1)


def test_kernels_lowered_once_equal_their_own_rendering(monkeypatch: Any) -> None:
    """Kernels that differ from an earlier one only in node ids (steps, heads, entry points) take
    its lowered shader from the cache: each equals what rendering the kernel itself gives."""
    from glcomp.codegen import render_cache

    lower = render_cache.RenderCache.lower
    caches: dict[int, Any] = {}
    checked = []

    def checked_lower(self: Any, renderer: Any, plan: Any, kernel: Any, hypers: Any) -> Any:
        got = lower(self, renderer, plan, kernel, hypers)
        fresh = render_cache.Lowered.of(renderer.render(kernel, hypers))
        assert got == fresh, kernel.name
        caches[id(self)] = self
        checked.append(kernel.name)
        return got

    monkeypatch.setattr(render_cache.RenderCache, "lower", checked_lower)
    for model, shape in ((LastStep(3, 4, 2), (2, 6, 3)), (_Attention(), (2, 5, 8))):
        for target in ("webgl2", "webgl1"):
            glcomp.manual_seed(0)
            opt = optim.Adam(lr=1e-3)
            build_bundle(glcomp.compile(model, {"x": shape}, nn.CrossEntropyLoss(), opt, target=target))
    # The character GPT example, tiny: its attention output projection is an epilogue kernel whose
    # vec4 cache names a node id that canonical() keeps, and whose ids differ between entry points.
    gpt = ModuleType("char_gpt_tiny")
    gpt.__file__ = str(EXAMPLE)
    exec(compile(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE), "exec"), gpt.__dict__)
    gpt.__dict__.update(batch_size=2, block_size=8, n_embd=16, n_head=2, n_layer=1, dropout=0.0)
    glcomp.manual_seed(0)
    model = gpt.GPTLanguageModel()
    spec = {"shape": (2, 8), "dtype": "int32", "num_classes": gpt.vocab_size}
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    prog = glcomp.compile(model, {"idx": (2, 8)}, "forward", opt, target_name="targets", target_spec=spec)
    build_bundle(prog)
    rendered = sum(len(entries) for cache in caches.values() for entries in cache.lowered.values())
    assert rendered < 0.75 * len(checked), (len(checked), rendered)  # many came from the cache


class _NamedHeads(nn.Module):
    """Identical heads whose kernels differ only in node ids and origins; one head's name reads
    like a generated identifier (``v1``), so its origin comments could be mistaken for code."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.b = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.v1 = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x):
        return self.a(x) * self.b(x) + self.v1(x)


def _tiny_gpt(n_layer: int) -> glcomp.Program:
    gpt = ModuleType("char_gpt_tiny")
    gpt.__file__ = str(EXAMPLE)
    exec(compile(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE), "exec"), gpt.__dict__)
    gpt.__dict__.update(batch_size=2, block_size=8, n_embd=16, n_head=2, n_layer=n_layer, dropout=0.0)
    glcomp.manual_seed(0)
    model = gpt.GPTLanguageModel()
    spec = {"shape": (2, 8), "dtype": "int32", "num_classes": gpt.vocab_size}
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    return glcomp.compile(model, {"idx": (2, 8)}, "forward", opt, target_name="targets", target_spec=spec)


def test_kernels_differing_only_in_origins_render_once(monkeypatch: Any) -> None:
    """Kernels of different model parts (the two blocks of a GPT) are rendered once and each gets
    its own origin comments: every lowered shader equals its own rendering, yet fewer renders
    happen than there are distinct shaders. Origins that read like code are kept apart."""
    from glcomp.codegen import render, render_cache

    renders: list[str] = []
    sources: set[str] = set()
    render_kernel = render.KernelRenderer.render
    lower = render_cache.RenderCache.lower

    def counted(self: Any, kernel: Any, hypers: Any) -> Any:
        renders.append(kernel.name)
        return render_kernel(self, kernel, hypers)

    def checked_lower(self: Any, renderer: Any, plan: Any, kernel: Any, hypers: Any) -> Any:
        got = lower(self, renderer, plan, kernel, hypers)
        fresh = render_cache.Lowered.of(render_kernel(renderer, kernel, hypers))
        assert got == fresh, kernel.name
        assert got.digest == render_cache.Lowered(fresh.source, [], [], {}).digest, kernel.name
        sources.add(got.source)
        return got

    monkeypatch.setattr(render.KernelRenderer, "render", counted)
    monkeypatch.setattr(render_cache.RenderCache, "lower", checked_lower)
    glcomp.manual_seed(0)
    prog = glcomp.compile(_NamedHeads(), {"x": (4, 8)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.1))
    text = "\n".join(build_bundle(prog).shaders.values())
    for head in ("a", "b"):
        assert f"// from {head}.0 (Linear) [grad]" in text
    renders.clear()
    sources.clear()
    build_bundle(_tiny_gpt(2))
    assert len(renders) < len(sources), (len(renders), len(sources))


def test_tiled_kernels_lowered_once_equal_their_own_rendering(monkeypatch: Any) -> None:
    """Register-blocked kernels (products, convolutions, weight gradients) that differ from an
    earlier one only in node ids and origins take their shaders from the cache: each block and
    gather shader equals the tiling's own rendering, samplers bound to this kernel's nodes and
    tiles, and far fewer renders happen than blocked kernels are lowered (the heads and layers of
    a GPT, the steps of a recurrence). Products sampling one texture twice (A @ A.T) key apart."""
    from glcomp.codegen import cost, render_cache

    monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)  # tile every product the fetch count favours
    monkeypatch.setattr(cost, "GATHER_FETCHES", 0)
    lower_tiled = render_cache.RenderCache.lower_tiled
    lowered: list[str] = []
    misses: list[str] = []

    def checked(self: Any, kernel: Any, tiling: Any, layouts: Any, target: Any) -> Any:
        before = len(self.tiled)
        got = lower_tiled(self, kernel, tiling, layouts, target)
        fresh = [render_cache.Lowered.of(r) for r in tiling.render(kernel, dict(layouts), target)]
        assert got == fresh, kernel.name
        for g, f in zip(got, fresh, strict=True):
            assert g.digest == render_cache.Lowered(f.source, [], [], {}).digest, kernel.name
        lowered.append(kernel.name)
        if len(self.tiled) > before:
            misses.append(kernel.name)
        return got

    monkeypatch.setattr(render_cache.RenderCache, "lower_tiled", checked)
    build_bundle(_tiny_gpt(2))
    glcomp.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Flatten(),
        nn.Linear(512, 3),
    )
    build_bundle(glcomp.compile(model, {"x": (4, 4, 8, 8)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1)))
    assert lowered and len(misses) < 0.5 * len(lowered), (len(lowered), len(misses))


def _merge_origins_by_lines(shared: str, source: str) -> str:
    """merge_origins spelled out over lines (the definition its faster scan must keep)."""
    lines = shared.split("\n")
    have = [k for k, line in enumerate(lines) if line.startswith("// from ")]
    new = [line for line in dict.fromkeys(source.split("\n")) if line.startswith("// from ")]
    new = [line for line in new if line not in {lines[k] for k in have}]
    if not new:
        return shared
    # no origins yet: after the opening preprocessor lines (#version must stay the first line)
    opening = next((k for k, line in enumerate(lines) if not line.startswith("#")), len(lines))
    at = have[-1] + 1 if have else opening
    return "\n".join(lines[:at] + new + lines[at:])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["#version 300 es", "// from a", "// from b (X)", "x = 1;", "", "// note", "//from c"]
        ),
    ),
    st.lists(st.sampled_from(["// from a", "// from c", "// from b (X)", "y;", "", "// from d\r"])),
)
def test_merge_origins_adds_each_new_origin_once_after_the_last(shared: list[str], source: list[str]) -> None:
    a, b = "\n".join(shared), "\n".join(source)
    merged = merge_origins(a, b)
    assert merged == _merge_origins_by_lines(a, b)
    assert sharing_key(merged) == sharing_key(a)


def test_cache_pins_only_node_ids_that_canonical_form_keeps() -> None:
    """A cached shader is reused for other nodes unless it names their ids: renumbered names
    (v3, s4_0) hold indices, so only the numbers of other names (glc_f12, s5, i0) pin places."""
    from glcomp.codegen.render_cache import _numbers_in_names

    source = "float v3(int i0) { return glc_f12 + texture(s4_0, c).x + s5 + v3_4(i0).x + glc_t_v7(1); }"
    assert _numbers_in_names(source) == {0, 12, 5}
