"""The moderngl runtime: executes a bundle's manifest with OpenGL draw calls.

It knows nothing about ops: it allocates the textures the manifest lists (once), compiles the
programs (once), uploads inputs, runs an entry point's draws in order and reads back only the
outputs asked for. Parameters and optimizer state live in two texture sets each; an update
writes the `next` set and the runtime flips which set is current afterwards.

Contexts, threads and lifetime. moderngl issues GL calls to whichever context is current on the
calling thread, and GL object names (texture 1, 2, ...) mean different objects in different
contexts. So every GL call this module makes runs inside `_current(ctx)`: it holds one
process-wide lock (one GL call at a time, from any thread) and makes the runtime's own context
current for the call, leaving no context current afterwards, so that any thread may take the
context next. Runtimes share one default context (`default_context()`, created on first use)
unless they are given a context or asked for their own (`own_context=True`, freed with the
runtime). A runtime releases its GL objects on `release()`, on leaving a `with` block, or through
a finalizer when it is garbage collected; each of these touches only that runtime's objects, in
that runtime's context. A context passed in by the caller must not be current on another thread
while a runtime uses it (`create_context()` returns one that is current nowhere).
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format import texel_bytes, texel_span, texture_format
from glcomp.runtime.feeds import (
    carried_names,
    check_feeds,
    check_lr,
    check_optimizer_option,
    check_read_loss,
    refuse_positional,
)
from glcomp.runtime.inspection import visible_outputs
from glcomp.runtime.packing import pack, unpack

# Texel format of a manifest texture -> (moderngl dtype, GL internal format name). An "rgba8"
# texture is 4x its record's width: its bytes are the float32 values' bytes (see _prelude.j2).
_GL_FORMATS = {"f32": ("f4", "RGBA32F"), "f16": ("f2", "RGBA16F"), "rgba8": ("f1", "RGBA8")}
_NUMPY_DTYPES = {"f4": np.float32, "f2": np.float16, "f1": np.dtype("<f4")}
_QUAD = np.array([-1.0, -1.0, 3.0, -1.0, -1.0, 3.0], dtype="f4")  # one triangle covers the viewport

# -- one GL call at a time -------------------------------------------------------------------------
_LOCK = threading.Lock()
_lock_owner: int | None = None  # the thread holding _LOCK
# GL objects whose runtime was garbage collected while its own thread held _LOCK (a collection can
# start inside any allocation); they are freed by the next call that takes the lock.
_pending: list[tuple[Any, list[Any], bool]] = []
_default_ctx: Any = None


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """Hold the process-wide GL lock; free GL objects whose release had to wait for it."""
    global _lock_owner
    if _lock_owner == threading.get_ident():
        raise GlcompError("a GL runtime was called while another GL call was running on the same thread")
    with _LOCK:
        _lock_owner = threading.get_ident()
        try:
            while _pending:
                _release_now(*_pending.pop())
            yield
        finally:
            _lock_owner = None


def _is_released(ctx: Any) -> bool:
    import moderngl

    return isinstance(ctx.mglo, moderngl.InvalidObject)


@contextlib.contextmanager
def _made_current(ctx: Any) -> Iterator[None]:
    """`ctx` current on this thread (the GL lock held); afterwards no context is current."""
    if _is_released(ctx):
        raise GlcompError("the OpenGL context of this runtime was released")
    with ctx:
        yield


@contextlib.contextmanager
def _current(ctx: Any) -> Iterator[None]:
    """Hold the GL lock with `ctx` current on this thread; afterwards no context is current."""
    with _exclusive(), _made_current(ctx):
        yield


def current_context(ctx: Any) -> contextlib.AbstractContextManager[None]:
    """``with current_context(ctx):`` runs raw moderngl calls on `ctx` (benchmarks, probes) the way
    runtime calls run: under the process-wide GL lock with `ctx` current on this thread. No runtime
    method may be called inside the block."""
    return _current(ctx)


def _release_now(ctx: Any, objects: list[Any], owns_ctx: bool) -> None:
    """Free `objects` (created in `ctx`), then `ctx` itself when it is owned; needs the GL lock."""
    if not _is_released(ctx):  # a released context took its objects with it
        with ctx:
            for obj in reversed(objects):
                obj.release()
        if owns_ctx:
            ctx.release()
    objects.clear()


def _release_gl(ctx: Any, objects: list[Any], owns_ctx: bool) -> None:
    """What `GLRuntime.release()` and its finalizer run (once): free the runtime's GL objects."""
    if _lock_owner == threading.get_ident():  # collected during a GL call on this thread
        _pending.append((ctx, objects, owns_ctx))
        return
    with _exclusive():
        _release_now(ctx, objects, owns_ctx)


# -- contexts --------------------------------------------------------------------------------------
def _new_context(backends: tuple[str | None, ...]) -> Any:
    try:
        import moderngl
    except ImportError as err:
        raise GlcompError(
            f"moderngl is not installed ({err}); runtime('reference') works without it"
        ) from None
    errors = []
    for backend in backends:
        try:
            kwargs = {"backend": backend} if backend else {}
            ctx = moderngl.create_context(standalone=True, require=330, **kwargs)
        except Exception as err:
            errors.append(f"{backend or 'default'}: {err}")
            continue
        with ctx:  # creating it made it current here; leave it current nowhere, free for any thread
            pass
        return ctx
    raise GlcompError(
        "no OpenGL context could be created (tried " + "; ".join(errors) + "). "
        "Install Mesa's EGL/llvmpipe (apt-get install libegl1 libgl1-mesa-dri) or use "
        "prog.runtime('reference'), which needs no GPU."
    )


def create_context(backends: tuple[str | None, ...] = ("egl", None)) -> Any:
    """A new headless OpenGL context: EGL first (Mesa llvmpipe or a GPU driver), then the default.

    The context is current on no thread when returned; the caller owns it (``ctx.release()``).
    """
    with _exclusive():
        return _new_context(backends)


def default_context() -> Any:
    """The context that runtimes share unless given one: created on first use (again if it was
    released) and kept for the life of the process."""
    global _default_ctx
    with _exclusive():
        if _default_ctx is None or _is_released(_default_ctx):
            _default_ctx = _new_context(("egl", None))
        return _default_ctx


# Renderer strings of software rasterisers (no GPU): Mesa's llvmpipe, softpipe and swrast,
# SwiftShader, lavapipe, Microsoft Basic Render Driver (glcomp.js tests the same words).
SOFTWARE_RENDERERS = re.compile(r"swiftshader|llvmpipe|softpipe|software|basic render|lavapipe|swrast", re.I)


def _info_of(ctx: Any) -> dict[str, Any]:
    info = ctx.info
    renderer = str(info.get("GL_RENDERER") or "")
    return {
        "software": bool(SOFTWARE_RENDERERS.search(f"{renderer} {info.get('GL_VENDOR') or ''}")),
        "renderer": info.get("GL_RENDERER"),
        "vendor": info.get("GL_VENDOR"),
        "version": info.get("GL_VERSION"),
        "max_texture_size": info.get("GL_MAX_TEXTURE_SIZE"),
        "max_draw_buffers": info.get("GL_MAX_DRAW_BUFFERS"),
        "max_texture_units": info.get("GL_MAX_TEXTURE_IMAGE_UNITS"),
    }


def context_info(ctx: Any) -> dict[str, Any]:
    """Renderer, vendor, version and the limits a bundle is checked against."""
    with _current(ctx):
        return _info_of(ctx)


_PROBE_VERT = "#version 330\nin vec2 a_position;\nvoid main() { gl_Position = vec4(a_position, 0.0, 1.0); }\n"
_PROBE_FRAG = "#version 330\nout vec4 color;\nvoid main() { color = vec4(1.5, -2.0, 0.25, 65536.0); }\n"


def probe_float_targets(ctx: Any) -> dict[str, bool]:
    """Whether RGBA32F textures can be rendered to (values outside [0, 1] survive) and blended
    additively (ONE, ONE) into, checked by drawing one pixel and reading it back."""
    with _current(ctx):
        return _probe(ctx)


def _probe(ctx: Any) -> dict[str, bool]:
    import moderngl

    result = {"float_render_targets": False, "float_blending": False}
    objects: list[Any] = []
    try:
        tex = ctx.texture((1, 1), 4, dtype="f4")
        objects.append(tex)
        fbo = ctx.framebuffer(color_attachments=[tex])
        objects.append(fbo)
        prog = ctx.program(vertex_shader=_PROBE_VERT, fragment_shader=_PROBE_FRAG)
        objects.append(prog)
        vbo = ctx.buffer(_QUAD.tobytes())
        objects.append(vbo)
        vao = ctx.vertex_array(prog, [(vbo, "2f", "a_position")])
        objects.append(vao)
        fbo.use()
        ctx.viewport = (0, 0, 1, 1)
        ctx.disable(moderngl.BLEND)
        vao.render(moderngl.TRIANGLES, vertices=3)
        want = np.array([1.5, -2.0, 0.25, 65536.0], np.float32)
        result["float_render_targets"] = bool(np.allclose(np.frombuffer(tex.read(), np.float32), want))
        ctx.enable(moderngl.BLEND)
        ctx.blend_func = moderngl.ONE, moderngl.ONE
        vao.render(moderngl.TRIANGLES, vertices=3)
        ctx.disable(moderngl.BLEND)
        result["float_blending"] = bool(np.allclose(np.frombuffer(tex.read(), np.float32), 2 * want))
    except Exception:  # a failed probe means the feature is missing
        pass
    finally:
        for obj in reversed(objects):
            obj.release()
    return result


def _compile_error(kernel: str, source: str, err: Exception) -> GlcompError:
    msg = str(err)
    header = "\n".join(line for line in source.splitlines()[:12] if line.startswith("//"))
    found = re.search(r"0:(\d+)", msg)
    line = ""
    if found:
        n = int(found.group(1))
        lines = source.splitlines()
        if 0 < n <= len(lines):
            line = f"\nGLSL line {n}: {lines[n - 1].strip()}"
    return GlcompError(
        f"shader for kernel {kernel} failed to compile or link:\n{header}{line}\ndriver: {msg}"
    )


# A fragment output of a bundle's shader: `layout(location = 0) out vec4 glc_out0;` (GLSL ES 3.00).
_OUTPUT = re.compile(
    r"^[ \t]*(?:layout\s*\([^)]*\)\s*)?out\s+(?:(?:highp|mediump|lowp)\s+)?vec4\s+(\w+)\s*;.*$", re.M
)
_DIRECTIVES = re.compile(r"\A(?:[ \t]*#[^\n]*\n)*")  # the leading #version and #extension lines


def exact_outputs(source: str) -> str:
    """`source` with its fragment outputs declared `invariant`, which Mesa's GLSL compiler takes as
    `precise` for every computation they depend on: it then keeps IEEE results where it would
    fold ``x - x`` and ``x + -x`` to 0 (nan for an infinite x, as numpy and torch give; see
    docs/devices.md#infinities-and-nan). GLSL ES 3.00 outputs are redeclared after their
    declarations, GLSL ES 1.00's gl_FragColor/gl_FragData after the leading directives."""
    if _OUTPUT.search(source):
        return _OUTPUT.sub(lambda m: f"{m.group(0)}\ninvariant {m.group(1)};", source)
    names = [n for n in ("gl_FragColor", "gl_FragData") if re.search(rf"\b{n}\b", source)]
    head = _DIRECTIVES.match(source).end()  # type: ignore[union-attr]
    return source[:head] + "".join(f"invariant {n};\n" for n in names) + source[head:]


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _gl_call(method: _Method) -> _Method:
    """Run a runtime method with the runtime's context current, one GL call at a time."""

    @functools.wraps(method)
    def call(self: GLRuntime, *args: Any, **kwargs: Any) -> Any:
        with _exclusive():
            self._check_usable()  # under the lock: another thread may have released it
            with _made_current(self.ctx):
                return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


class GLRuntime:
    """Runs a Bundle through moderngl; the same interface as the reference runtime.

    ``ctx``: the context to run in (default: the shared `default_context()`); ``own_context=True``
    creates a context for this runtime alone, released with it. ``texture_budget_bytes`` (default
    2 GiB, as `glcomp.format.DEFAULT_TEXTURE_BUDGET`): a bundle whose textures take more is
    refused before anything is allocated; a GL error while allocating raises GlcompError.
    Several runtimes may live in one process and be called from any thread: calls are
    serialised and each runs in the runtime's own context. Use it as a context manager or call
    `release()`; a runtime that is dropped without either is released by a finalizer. A
    released runtime raises GlcompError when used.
    """

    def __init__(
        self,
        bundle: Any,
        ctx: Any = None,
        own_context: bool = False,
        texture_budget_bytes: int | None = None,
    ) -> None:
        if ctx is not None and own_context:
            raise GlcompError("GLRuntime: pass either ctx or own_context=True, not both")
        self.bundle = bundle
        self.manifest = bundle.manifest
        self._texture_budget = texture_budget_bytes
        self.ctx = create_context() if own_context else ctx if ctx is not None else default_context()
        self.hyper = dict(self.manifest["hyper"])
        self.counters = {k: np.array(bundle.weights[k]) for k in self.manifest["counters"]}
        self.parity = {name: 0 for name in self.manifest["states"]}
        self.textures: dict[str, Any] = {}
        self.programs: dict[str, Any] = {}
        self.vaos: dict[str, Any] = {}
        self._units: dict[str, dict[str, int]] = {}  # program -> sampler -> texture unit
        self._active: dict[str, set[str]] = {}  # program -> uniforms the driver kept
        self._written: dict[tuple[str, str], Any] = {}  # (program, uniform) -> value last written
        self._fbos: dict[tuple[int, ...], Any] = {}
        self._released = False
        self._last_entry: str | None = None  # the entry point run last (what inspect reads)
        # Every GL object this runtime creates, in creation order; the finalizer holds this list
        # and the context, never the runtime, so it can run when the runtime is collected.
        self._objects: list[Any] = []
        self._finalizer = weakref.finalize(self, _release_gl, self.ctx, self._objects, own_context)
        self._finalizer.atexit = False  # at exit the process takes the contexts with it
        try:
            with _current(self.ctx):
                self._check_limits()
                self._allocate()
        except BaseException:
            self.release()
            raise

    # -- setup --------------------------------------------------------------------------------------
    def _new(self, obj: Any) -> Any:
        self._objects.append(obj)
        return obj

    def _allocate(self) -> None:
        import moderngl

        m, ctx = self.manifest, self.ctx
        ctx.clear_errors()
        for name, t in m["textures"].items():
            size = (t["width"] * texel_span(t), t["height"])
            fmt = texture_format(t)
            what = (
                f"texture {name!r} ({size[0]}x{size[1]} {_GL_FORMATS[fmt][1]}, "
                f"{t['width'] * t['height'] * texel_bytes(t)} bytes)"
            )
            try:
                tex = self._new(ctx.texture(size, 4, dtype=_GL_FORMATS[fmt][0]))
            except Exception as err:
                raise GlcompError(f"{what} could not be allocated: {err}") from None
            error = ctx.error
            if error != "GL_NO_ERROR":
                total = m.get("memory", {}).get("texture_bytes", "?")
                raise GlcompError(
                    f"{what} could not be allocated: {error} (the bundle needs {total} bytes of textures)"
                )
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)
            tex.repeat_x = tex.repeat_y = False
            self.textures[name] = tex
        vbo = self._new(ctx.buffer(_QUAD.tobytes()))
        vert = self.bundle.shaders[m["vertex_shader"]]
        kernel_of = {d["program"]: d["kernel"] for e in m["entries"].values() for d in e["draws"]}
        for pid, p in m["programs"].items():
            frag = self.bundle.shaders[p["fragment"]]
            try:  # exact outputs where the driver takes them, else the bundle's shader as it is
                prog = self._new(ctx.program(vertex_shader=vert, fragment_shader=exact_outputs(frag)))
            except Exception:
                try:
                    prog = self._new(ctx.program(vertex_shader=vert, fragment_shader=frag))
                except Exception as err:
                    raise _compile_error(kernel_of.get(pid, pid), frag, err) from None
            self.programs[pid] = prog
            self.vaos[pid] = self._new(ctx.vertex_array(prog, [(vbo, "2f", "a_position")]))
            # A sampler's texture unit is its place in the program's list, set once; uniforms a
            # driver optimised away are skipped; values are written only when they change.
            self._units[pid] = {s: unit for unit, s in enumerate(p["samplers"])}
            for s, unit in self._units[pid].items():
                if s in prog:
                    prog[s].value = unit
            self._active[pid] = {u for u in [*p["uniforms"], "u_page_offset"] if u in prog}
        for name in m["states"]:
            self._upload_state(name, self.bundle.weights[name])

    def _check_limits(self) -> None:
        from glcomp.format import DEFAULT_TEXTURE_BUDGET, texture_bytes

        info = _info_of(self.ctx)
        budget = DEFAULT_TEXTURE_BUDGET if self._texture_budget is None else self._texture_budget
        if texture_bytes(self.manifest) > budget:
            raise GlcompError(
                f"the bundle's textures take {texture_bytes(self.manifest)} bytes, more than the budget of "
                f"{budget} bytes (texture_budget_bytes)"
            )
        need = max(
            [t["width"] * texel_span(t) for t in self.manifest["textures"].values()]
            + [t["height"] for t in self.manifest["textures"].values()]
            + [1]
        )
        if info["max_texture_size"] and need > info["max_texture_size"]:
            raise GlcompError(
                f"the bundle needs {need}-texel textures; {info['renderer']} allows "
                f"{info['max_texture_size']}"
            )
        outputs = max([p["outputs"] for p in self.manifest["programs"].values()] + [1])
        if info["max_draw_buffers"] and outputs > info["max_draw_buffers"]:
            raise GlcompError(
                f"the bundle needs {outputs} draw buffers; {info['renderer']} has {info['max_draw_buffers']}"
            )
        units = info["max_texture_units"]
        draws = [d for e in self.manifest["entries"].values() for d in e["draws"]]
        for pid, p in self.manifest["programs"].items():
            if units and len(p["samplers"]) > units:
                kernel = next((d["kernel"] for d in draws if d["program"] == pid), pid)
                raise GlcompError(
                    f"program {pid} (kernel {kernel}) reads {len(p['samplers'])} textures; "
                    f"{info['renderer']} has {units} texture units (MAX_TEXTURE_IMAGE_UNITS): "
                    f"compile with max_texture_units={units}"
                )

    def _check_usable(self) -> None:
        if self._released:
            raise GlcompError("this GL runtime was released; create a new one to run the bundle")

    @_gl_call
    def info(self) -> dict[str, Any]:
        """What `context_info` says about this runtime's context."""
        return _info_of(self.ctx)

    def _texture(self, ref: Any) -> Any:
        if isinstance(ref, str):
            return self.textures[ref]
        st = self.manifest["states"][ref["state"]]
        which = self.parity[ref["state"]] ^ (1 if ref["version"] == "next" else 0)
        return self.textures[st["textures"][which][ref["page"]]]

    def _write(self, refs: list[Any], array: np.ndarray, layout: dict[str, Any]) -> None:
        for ref, page in zip(refs, pack(array, layout), strict=True):
            tex = self._texture(ref)
            tex.write(page.astype(_NUMPY_DTYPES[tex.dtype]).tobytes())

    def _read(self, refs: list[Any], layout: dict[str, Any]) -> np.ndarray:
        """The values of the textures `refs` as float32 (RGBA16F texels are widened exactly)."""
        pages = []
        for ref in refs:
            tex = self._texture(ref)
            data = np.frombuffer(tex.read(), dtype=_NUMPY_DTYPES[tex.dtype]).astype(np.float32)
            pages.append(data.reshape(tex.height, -1, 4))  # rgba8: 4 bytes a float, 1/4 the GL width
        return unpack(pages, layout)

    def _state_refs(self, name: str) -> list[dict[str, Any]]:
        pages = self.manifest["states"][name]["layout"]["pages"]
        return [{"state": name, "version": "cur", "page": p} for p in range(pages)]

    def _upload_state(self, name: str, value: Any) -> None:
        st = self.manifest["states"][name]
        self._write(self._state_refs(name), np.asarray(value, np.float32), st["layout"])

    def _read_states(self, roles: Iterable[str]) -> dict[str, np.ndarray]:
        return {
            name: self._read(self._state_refs(name), st["layout"])
            for name, st in self.manifest["states"].items()
            if st["role"] in roles
        }

    def _state_shapes(self, roles: Iterable[str]) -> dict[str, tuple[int, ...]]:
        return {
            name: tuple(st["layout"]["shape"])
            for name, st in self.manifest["states"].items()
            if st["role"] in roles
        }

    def _framebuffer(self, targets: list[Any]) -> Any:
        texs = [self._texture(r) for r in targets]
        key = tuple(id(t) for t in texs)
        if key not in self._fbos:
            self._fbos[key] = self._new(self.ctx.framebuffer(color_attachments=texs))
        return self._fbos[key]

    # -- execution --------------------------------------------------------------------------------
    @_gl_call
    def run(self, entry: str, inputs: dict[str, Any], read: list[str] | None = None) -> dict[str, np.ndarray]:
        """Upload `inputs`, run the entry point's draws, flip updated states, read back `read`."""
        return self._run(entry, inputs, read)

    def _run(
        self, entry: str, inputs: dict[str, Any], read: list[str] | None = None, *, visible: bool = False
    ) -> dict[str, np.ndarray]:
        """Run `entry` and read back `read` (None: every output, or with `visible` those the
        runtime call returns, not the inspector's)."""
        m = self.manifest
        if entry not in m["entries"]:
            raise GlcompError(f"{entry}: not in this bundle (compile with a loss and an optimizer)")
        e = m["entries"][entry]
        if read is None and visible:
            read = visible_outputs(e)
        specs = {name: m["inputs"][name] for name in e["inputs"]}
        feeds = check_feeds(entry, specs, inputs)
        for name, value in feeds.items():
            self._write(e["inputs"][name], value.astype(np.float32), m["inputs"][name]["layout"])
        for d in e["draws"]:
            self._draw(d)
        outputs = {}
        for name in read if read is not None else list(e["outputs"]):
            out = e["outputs"][name]
            outputs[name] = self._read(out["textures"], out["layout"])
        for name in e["updates"]:
            self.parity[name] ^= 1
        self._last_entry = entry  # whose outputs rt.inspect reads
        if entry == "train_step":
            for name in self.counters:
                self.counters[name] = self.counters[name] + 1
        return outputs

    def _draw(self, d: dict[str, Any]) -> None:
        import moderngl

        pid = d["program"]
        prog, units, active, written = self.programs[pid], self._units[pid], self._active[pid], self._written
        for sampler, ref in d["samplers"].items():
            self._texture(ref).use(location=units[sampler])
        values = {
            u: int(src["int"]) if "int" in src else float(self.hyper[src["hyper"]])
            for u, src in d["uniforms"].items()
        }
        values["u_page_offset"] = d["page_offset"]
        for uniform, value in values.items():
            if uniform in active and written.get((pid, uniform)) != value:
                prog[uniform].value = value
                written[pid, uniform] = value
        fbo = self._framebuffer(d["targets"])
        fbo.use()
        width, height = d["viewport"]
        span = 4 if fbo.color_attachments[0].dtype == "f1" else 1  # rgba8: 4 fragments a texel
        self.ctx.viewport = (0, 0, width * span, height)
        if d.get("blend"):
            self.ctx.enable(moderngl.BLEND)
            self.ctx.blend_func = moderngl.ONE, moderngl.ONE
        else:
            self.ctx.disable(moderngl.BLEND)
        self.vaos[d["program"]].render(moderngl.TRIANGLES, vertices=3)

    # -- the runtime interface --------------------------------------------------------------------
    @_gl_call
    def predict(self, *args: Any, **inputs: Any) -> np.ndarray:
        refuse_positional("predict", args, self._input_names("predict"))
        out = self._run("predict", inputs, visible=True)
        return out["output"] if list(out) == ["output"] else out

    @_gl_call
    def gradients(self, *args: Any, **inputs: Any) -> dict[str, np.ndarray]:
        refuse_positional("gradients", args, self._input_names("gradients"))
        out = self._run("gradients", inputs, visible=True)
        return {k[5:]: v for k, v in out.items() if k.startswith("grad:")}

    @_gl_call
    def train_step(self, *args: Any, **inputs: Any) -> float:
        """One forward, backward and optimizer step; returns the loss (nan or inf when the
        training diverged: the step is taken all the same)."""
        refuse_positional("train_step", args, self._input_names("train_step"))
        out = self._run("train_step", inputs, read=["loss"])
        return float(out["loss"])

    def _input_names(self, entry: str) -> list[str]:
        e = self.manifest["entries"].get(entry)
        return list(e["inputs"]) if e else []

    @_gl_call
    def train_steps(self, batches: Iterable[dict[str, Any]], read_every: int = 0) -> list[float]:
        """Run one train step per batch (a dict of inputs). The loss is read back only every
        `read_every` steps and after the last one (0: only the last), so the GPU is not stalled
        by a readback each step; returns the losses that were read.

        Divergence is detected where a loss is read: a nan or infinite loss raises GlcompError
        naming the step (the steps up to it have been taken)."""
        losses: list[float] = []
        batches = list(batches)
        for i, batch in enumerate(batches):
            read = i == len(batches) - 1 or bool(read_every and (i + 1) % read_every == 0)
            out = self._run("train_step", batch, read=["loss"] if read else [])
            if read:
                losses.append(check_read_loss(float(out["loss"]), i + 1, read_every))
        return losses

    @_gl_call
    def inspect(self, name: str) -> np.ndarray:
        """The tensor `name` as the plan computed it (a float32 array of the plan's shape): a
        state (parameter, buffer, optimizer state) as it is now, a counter, or a tensor of the
        last entry point run (its outputs, and what the bundle kept with ``inspect=[...]``; see
        docs/inspect.md). Reading changes nothing. GlcompError listing near matches for a name
        the bundle does not hold, or naming the entries that compute it."""
        from glcomp.runtime.inspection import inspectable, not_held, output_key

        m = self.manifest
        if name in m["states"]:
            return self._read(self._state_refs(name), m["states"][name]["layout"])
        if name in self.counters:
            return np.array(self.counters[name], np.int64)
        last = self._last_entry
        key = output_key(m["entries"][last], name) if last is not None else None
        if key is None:
            raise not_held(name, inspectable(m), last, kept=False)
        out = m["entries"][last]["outputs"][key]
        # a state written by the entry was flipped after it: its "next" texture is "cur" now
        updated = set(m["entries"][last]["updates"])

        def now(r: Any) -> Any:
            flipped = isinstance(r, dict) and r["version"] == "next" and r["state"] in updated
            return {**r, "version": "cur"} if flipped else r

        refs = [now(r) for r in out["textures"]]
        return self._read(refs, out["layout"])

    def gl_objects(self) -> int:
        """How many GL objects this runtime holds (constant after the first call of each entry
        point; 0 once released)."""
        return len(self._objects)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate (a finite number >= 0) used by the following train steps."""
        self._check_usable()
        self.hyper["lr"] = check_lr(lr)

    @_gl_call
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, buffers and counters by their torch names (copies), every value an np.ndarray
        (integer buffers such as ``num_batches_tracked`` 0-d int64 arrays)."""
        out = self._read_states(("param", "buffer"))
        out |= {k: np.array(v, np.int64) for k, v in self.counters.items()}
        return out

    def save_weights(self, path: Any) -> Any:
        """Write `state_dict()` to the safetensors file `path`, atomically: the parameters and
        buffers by their torch names and nothing else (no optimizer state, step or random-number
        counters), so the torch twin of the model loads it with
        ``model.load_state_dict(safetensors.torch.load_file(path), strict=True)``. Returns the
        path (see glcomp.runtime.weights)."""
        from glcomp.runtime.weights import save_weights

        carried = carried_names(self._options())
        return save_weights(path, {k: v for k, v in self.state_dict().items() if k not in carried})

    def _options(self) -> dict[str, Any]:
        """The compile options kept in the bundle's program.json ({} without one)."""
        program = getattr(self.bundle, "program", None)
        return program.get("options", {}) if isinstance(program, dict) else {}

    @_gl_call
    def reset_state(self, names: Any = None) -> None:
        """Zero the state carried across batches (glcomp.compile's ``carry=``): every carried
        input, or those in `names` (one name or several); GlcompError for any other name."""
        shapes = self._state_shapes(("buffer",))
        for name in carried_names(self._options(), names):
            self._upload_state(name, np.zeros(shapes[name], np.float32))

    @_gl_call
    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer state (``opt.<param>.<slot>``, ``opt.step``) as it is now."""
        return self._read_states(("state",))

    @_gl_call
    def reset_optimizer(self) -> None:
        """Set every optimizer state (moments, momentum, the step count ``opt.step``) to zero."""
        self._reset_optimizer()

    def _reset_optimizer(self) -> None:
        for name, shape in self._state_shapes(("state",)).items():
            self._upload_state(name, np.zeros(shape, np.float32))

    @_gl_call
    def load_state_dict(
        self, state: Mapping[str, Any], optimizer: str | Mapping[str, Any] | None = None
    ) -> None:
        """Load parameters, buffers and counters (every key, right shapes, finite values).

        ``optimizer``: None keeps the optimizer state as it is, ``"reset"`` zeroes it (as
        `reset_optimizer`), a dict from `optimizer_state()` restores it. Everything is checked
        before anything is loaded."""
        from glcomp.state import check_state

        shapes = self._state_shapes(("param", "buffer")) | {k: () for k in self.counters}
        check_state(state, shapes, "runtime")
        opt_shapes = self._state_shapes(("state",))
        check_optimizer_option(optimizer, opt_shapes)
        for k in shapes:
            if k in self.counters:
                self.counters[k] = np.array(state[k], dtype=np.int64)
            else:
                self._upload_state(k, np.asarray(state[k], np.float32).reshape(shapes[k]))
        if optimizer == "reset":
            self._reset_optimizer()
        elif isinstance(optimizer, Mapping):
            for k, shape in opt_shapes.items():
                self._upload_state(k, np.asarray(optimizer[k], np.float32).reshape(shape))

    # -- lifetime ---------------------------------------------------------------------------------
    def release(self) -> None:
        """Free every GL object this runtime created (and its context if it owns one). Safe to
        call more than once; other runtimes, even on the same context, are not touched."""
        self._released = True
        self._finalizer()
        for objects in (self._fbos, self.vaos, self.programs, self.textures):
            objects.clear()

    def __enter__(self) -> GLRuntime:
        self._check_usable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @_gl_call
    def save(self, directory: Any) -> Any:
        """Save this runtime as a bundle (atomically, see `Bundle.save`) holding its current
        state: parameters, buffers, optimizer state, step counters and learning rate, read back
        from the textures. ``glcomp.load(directory)`` resumes from exactly this state."""
        weights: dict[str, np.ndarray] = {}
        for name, st in self.manifest["states"].items():
            refs = [{"state": name, "version": "cur", "page": p} for p in range(st["layout"]["pages"])]
            weights[name] = self._read(refs, st["layout"])
        weights |= {k: np.asarray(v, np.int64) for k, v in self.counters.items()}
        return self.bundle.with_state(weights, self.hyper["lr"]).save(directory)
