"""The moderngl runtime: executes a bundle's manifest with OpenGL draw calls.

It knows nothing about ops: it allocates the textures the manifest lists (once), compiles the
programs (once), uploads inputs, runs an entry point's draws in order and reads back only the
outputs asked for. Parameters and optimizer state live in two texture sets each; an update
writes the `next` set and the runtime flips which set is current afterwards.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.runtime.feeds import check_feeds
from glcomp.runtime.packing import pack, unpack

_QUAD = np.array([-1.0, -1.0, 3.0, -1.0, -1.0, 3.0], dtype="f4")  # one triangle covers the viewport


def create_context(backends: tuple[str | None, ...] = ("egl", None)) -> Any:
    """A headless OpenGL context: EGL first (Mesa llvmpipe or a GPU driver), then the default."""
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
            return moderngl.create_context(standalone=True, require=330, **kwargs)
        except Exception as err:
            errors.append(f"{backend or 'default'}: {err}")
    raise GlcompError(
        "no OpenGL context could be created (tried " + "; ".join(errors) + "). "
        "Install Mesa's EGL/llvmpipe (apt-get install libegl1 libgl1-mesa-dri) or use "
        "prog.runtime('reference'), which needs no GPU."
    )


def context_info(ctx: Any) -> dict[str, Any]:
    info = ctx.info
    return {
        "renderer": info.get("GL_RENDERER"),
        "vendor": info.get("GL_VENDOR"),
        "version": info.get("GL_VERSION"),
        "max_texture_size": info.get("GL_MAX_TEXTURE_SIZE"),
        "max_draw_buffers": info.get("GL_MAX_DRAW_BUFFERS"),
        "max_texture_units": info.get("GL_MAX_TEXTURE_IMAGE_UNITS"),
    }


_PROBE_VERT = "#version 330\nin vec2 a_position;\nvoid main() { gl_Position = vec4(a_position, 0.0, 1.0); }\n"
_PROBE_FRAG = "#version 330\nout vec4 color;\nvoid main() { color = vec4(1.5, -2.0, 0.25, 65536.0); }\n"


def probe_float_targets(ctx: Any) -> dict[str, bool]:
    """Whether RGBA32F textures can be rendered to (values outside [0, 1] survive) and blended
    additively (ONE, ONE) into, checked by drawing one pixel and reading it back."""
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


class GLRuntime:
    """Runs a Bundle through moderngl; the same interface as the reference runtime."""

    def __init__(self, bundle: Any, ctx: Any = None) -> None:
        import moderngl

        self.bundle = bundle
        m = bundle.manifest
        self.manifest = m
        self.ctx = ctx if ctx is not None else create_context()
        self._check_limits()
        self.hyper = dict(m["hyper"])
        self.counters = {k: np.array(bundle.weights[k]) for k in m["counters"]}
        self.textures: dict[str, Any] = {}
        for name, t in m["textures"].items():
            tex = self.ctx.texture((t["width"], t["height"]), 4, dtype="f4")
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)
            tex.repeat_x = tex.repeat_y = False
            self.textures[name] = tex
        self.parity = {name: 0 for name in m["states"]}
        self._vbo = self.ctx.buffer(_QUAD.tobytes())
        self.programs: dict[str, Any] = {}
        self.vaos: dict[str, Any] = {}
        self._fbos: dict[tuple[int, ...], Any] = {}
        vert = bundle.shaders[m["vertex_shader"]]
        kernel_of = {d["program"]: d["kernel"] for e in m["entries"].values() for d in e["draws"]}
        for pid, p in m["programs"].items():
            frag = bundle.shaders[p["fragment"]]
            try:
                prog = self.ctx.program(vertex_shader=vert, fragment_shader=frag)
            except Exception as err:
                raise _compile_error(kernel_of.get(pid, pid), frag, err) from None
            self.programs[pid] = prog
            self.vaos[pid] = self.ctx.vertex_array(prog, [(self._vbo, "2f", "a_position")])
        for name in m["states"]:
            self._upload_state(name, bundle.weights[name])

    # -- setup --------------------------------------------------------------------------------------
    def _check_limits(self) -> None:
        info = context_info(self.ctx)
        need = max(
            [t["width"] for t in self.manifest["textures"].values()]
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

    def info(self) -> dict[str, Any]:
        return context_info(self.ctx)

    def _texture(self, ref: Any) -> Any:
        if isinstance(ref, str):
            return self.textures[ref]
        st = self.manifest["states"][ref["state"]]
        which = self.parity[ref["state"]] ^ (1 if ref["version"] == "next" else 0)
        return self.textures[st["textures"][which][ref["page"]]]

    def _write(self, refs: list[Any], array: np.ndarray, layout: dict[str, Any]) -> None:
        for ref, page in zip(refs, pack(array, layout), strict=True):
            self._texture(ref).write(page.tobytes())

    def _read(self, refs: list[Any], layout: dict[str, Any]) -> np.ndarray:
        pages = []
        for ref in refs:
            tex = self._texture(ref)
            data = np.frombuffer(tex.read(), dtype=np.float32)
            pages.append(data.reshape(tex.height, tex.width, 4))
        return unpack(pages, layout)

    def _upload_state(self, name: str, value: np.ndarray) -> None:
        st = self.manifest["states"][name]
        refs = [{"state": name, "version": "cur", "page": p} for p in range(st["layout"]["pages"])]
        self._write(refs, np.asarray(value, np.float32), st["layout"])

    def _framebuffer(self, targets: list[Any]) -> Any:
        texs = [self._texture(r) for r in targets]
        key = tuple(id(t) for t in texs)
        if key not in self._fbos:
            self._fbos[key] = self.ctx.framebuffer(color_attachments=texs)
        return self._fbos[key]

    # -- execution --------------------------------------------------------------------------------
    def run(self, entry: str, inputs: dict[str, Any], read: list[str] | None = None) -> dict[str, np.ndarray]:
        """Upload `inputs`, run the entry point's draws, flip updated states, read back `read`."""
        m = self.manifest
        if entry not in m["entries"]:
            raise GlcompError(f"{entry}: not in this bundle (compile with a loss and an optimizer)")
        e = m["entries"][entry]
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
        return outputs

    def _draw(self, d: dict[str, Any]) -> None:
        import moderngl

        prog = self.programs[d["program"]]
        for unit, (sampler, ref) in enumerate(d["samplers"].items()):
            self._texture(ref).use(location=unit)
            if sampler in prog:
                prog[sampler].value = unit
        for uniform, src in d["uniforms"].items():
            if uniform in prog:
                prog[uniform].value = float(self.hyper[src["hyper"]])
        if "u_page_offset" in prog:
            prog["u_page_offset"].value = d["page_offset"]
        fbo = self._framebuffer(d["targets"])
        fbo.use()
        self.ctx.viewport = (0, 0, *d["viewport"])
        if d.get("blend"):
            self.ctx.enable(moderngl.BLEND)
            self.ctx.blend_func = moderngl.ONE, moderngl.ONE
        else:
            self.ctx.disable(moderngl.BLEND)
        self.vaos[d["program"]].render(moderngl.TRIANGLES, vertices=3)

    # -- the runtime interface --------------------------------------------------------------------
    def predict(self, **inputs: Any) -> np.ndarray:
        out = self.run("predict", inputs)
        return out["output"] if list(out) == ["output"] else out

    def gradients(self, **inputs: Any) -> dict[str, np.ndarray]:
        out = self.run("gradients", inputs)
        return {k[5:]: v for k, v in out.items() if k.startswith("grad:")}

    def train_step(self, **inputs: Any) -> float:
        out = self.run("train_step", inputs, read=["loss"])
        for name in self.counters:
            self.counters[name] = self.counters[name] + 1
        return float(out["loss"])

    def train_steps(self, batches: Any, read_every: int = 0) -> list[float]:
        """Run one train step per batch (a dict of inputs). The loss is read back only every
        `read_every` steps and after the last one (0: only the last), so the GPU is not stalled
        by a readback each step; returns the losses that were read."""
        losses = []
        batches = list(batches)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            read = last or (read_every and (i + 1) % read_every == 0)
            out = self.run("train_step", batch, read=["loss"] if read else [])
            for name in self.counters:
                self.counters[name] = self.counters[name] + 1
            if read:
                losses.append(float(out["loss"]))
        return losses

    def gl_objects(self) -> int:
        """How many GL objects this runtime holds (constant after construction)."""
        return len(self.textures) + len(self.programs) + len(self.vaos) + len(self._fbos) + 1

    def set_lr(self, lr: float) -> None:
        self.hyper["lr"] = float(lr)

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {}
        for name, st in self.manifest["states"].items():
            if st["role"] in ("param", "buffer"):
                refs = [{"state": name, "version": "cur", "page": p} for p in range(st["layout"]["pages"])]
                out[name] = self._read(refs, st["layout"])
        out |= {k: v.copy() for k, v in self.counters.items()}
        return out

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer state (``opt.<param>.<slot>``, ``opt.step``) as it is now."""
        out = {}
        for name, st in self.manifest["states"].items():
            if st["role"] == "state":
                refs = [{"state": name, "version": "cur", "page": p} for p in range(st["layout"]["pages"])]
                out[name] = self._read(refs, st["layout"])
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from glcomp.nn.module import check_state

        shapes = {
            k: tuple(st["layout"]["shape"])
            for k, st in self.manifest["states"].items()
            if st["role"] in ("param", "buffer")
        }
        shapes |= {k: () for k in self.counters}
        check_state(state, shapes, "runtime")
        for k in shapes:
            if k in self.counters:
                self.counters[k] = np.array(state[k], dtype=np.int64)
            else:
                self._upload_state(k, np.asarray(state[k], np.float32).reshape(shapes[k]))

    def release(self) -> None:
        """Free every GL object this runtime created."""
        for obj in [
            *self._fbos.values(),
            *self.vaos.values(),
            *self.programs.values(),
            *self.textures.values(),
            self._vbo,
        ]:
            obj.release()
        self._fbos.clear()
        self.vaos.clear()
        self.programs.clear()
        self.textures.clear()

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
