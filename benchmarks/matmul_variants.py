"""Standalone matmul shader variants (no glcomp) on one GL context: register blocking through MRT.

    python benchmarks/matmul_variants.py 1024 2048 4096     # every block shape / layout / form
    python benchmarks/matmul_variants.py v2 2048 4096       # k-major textures, unrolling

A fragment computes R rows x C column texels into R * C RGBA32F render targets; forms: "t" (A and
W (N x K) rows, textures K/4 wide), "tg" (the same in glcomp's packed layout: square power-of-two
textures), "r" (B as (K, N) rows), "kt" (k-major textures A^T, W^T); strided: the R rows of a
fragment are M/R apart instead of adjacent. Draws only, timed with ctx.finish(); sizes up to 1024
are checked against numpy. The H200 numbers are in benchmarks/RESULTS.md.
"""
# ruff: noqa: N803, N806 (M, N, K, R, C are the matrix and block sizes of the text)

import sys
import time

import moderngl
import numpy as np

ctx = moderngl.create_context(standalone=True, backend="egl")
print(ctx.info["GL_RENDERER"], ctx.info["GL_VERSION"], "max draw buffers", ctx.info["GL_MAX_DRAW_BUFFERS"])
VERT = "#version 300 es\nin vec2 p;\nvoid main() { gl_Position = vec4(p, 0.0, 1.0); }\n"
vbo = ctx.buffer(np.array([-1, -1, 3, -1, -1, 3], np.float32).tobytes())


def shader(M, N, K, R, C, form, strided, unroll):
    K4 = K // 4
    MR, NC = M // R, N // 4 // C  # fragments in y, x
    lines = ["#version 300 es", "precision highp float;", "precision highp int;"]
    lines += ["precision highp sampler2D;"]
    lines += ["uniform sampler2D A;", "uniform sampler2D B;"]
    for t in range(R * C):
        lines.append(f"layout(location = {t}) out vec4 o{t};")
    lines.append("void main() {")
    lines.append("  int fy = int(gl_FragCoord.y); int fx = int(gl_FragCoord.x);")
    for r in range(R):
        lines.append(f"  int row{r} = {f'fy + {r * MR}' if strided else f'fy * {R} + {r}'};")
    for c in range(C):
        lines.append(f"  int ct{c} = {f'fx + {c * NC}' if strided else f'fx * {C} + {c}'};")
    for r in range(R):
        for c in range(C):
            lines.append(f"  vec4 acc{r}_{c} = vec4(0.0);")
    lines.append(f"  for (int k = 0; k < {K4}; k += {unroll}) {{")
    for u in range(unroll):
        kk = f"k + {u}" if u else "k"
        lines.append("    {")
        for r in range(R if form not in ("tg", "kt") else 0):
            lines.append(f"    vec4 a{r} = texelFetch(A, ivec2({kk}, row{r}), 0);")
        if form == "tg":  # glcomp layout: texel t at (t & (w-1), t >> log2 w), rows K/4 texels long
            wl = max(0, ((M * K4) ** 0.5 - 1).__ceil__().bit_length())
            wa = 1 << wl
            for r in range(R):
                lines.append(f"    int ta{r} = row{r} * {K4} + {kk};")
                lines.append(f"    vec4 a{r} = texelFetch(A, ivec2(ta{r} & {wa - 1}, ta{r} >> {wl}), 0);")
            for c in range(C):
                for e in range(4):
                    lines.append(f"    int tw{c}_{e} = (4 * ct{c} + {e}) * {K4} + {kk};")
                    lines.append(
                        f"    vec4 w{c}_{e} = "
                        f"texelFetch(B, ivec2(tw{c}_{e} & {wa - 1}, tw{c}_{e} >> {wl}), 0);"
                    )
        if form == "kt":  # k-major textures: A^T (K/4 high, M wide), W^T (K/4 high, N wide)
            for r in range(R):
                lines.append(f"    vec4 a{r} = texelFetch(A, ivec2(row{r}, {kk}), 0);")
            for c in range(C):
                for e in range(4):
                    lines.append(f"    vec4 w{c}_{e} = texelFetch(B, ivec2(4 * ct{c} + {e}, {kk}), 0);")
        if form == "t":  # B given as W (N x K), texture K/4 wide, N high
            for c in range(C):
                for e in range(4):
                    lines.append(f"    vec4 w{c}_{e} = texelFetch(B, ivec2({kk}, 4 * ct{c} + {e}), 0);")
        if form in ("t", "tg", "kt"):
            for r in range(R):
                for c in range(C):
                    d = ", ".join(f"dot(a{r}, w{c}_{e})" for e in range(4))
                    lines.append(f"    acc{r}_{c} += vec4({d});")
        if form == "r":  # B (K x N), texture N/4 wide, K high
            for c in range(C):
                for e in range(4):
                    lines.append(f"    vec4 b{c}_{e} = texelFetch(B, ivec2(ct{c}, 4 * ({kk}) + {e}), 0);")
            for r in range(R):
                for c in range(C):
                    s = " + ".join(f"a{r}.{'xyzw'[e]} * b{c}_{e}" for e in range(4))
                    lines.append(f"    acc{r}_{c} += {s};")
        lines.append("    }")
    lines.append("  }")
    for r in range(R):
        for c in range(C):
            lines.append(f"  o{r * C + c} = acc{r}_{c};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def tex(arr, w, h):
    t = ctx.texture((w, h), 4, np.ascontiguousarray(arr, np.float32).tobytes(), dtype="f4")
    t.filter = (moderngl.NEAREST, moderngl.NEAREST)
    return t


def run(M, N, K, R, C, form, strided, unroll, a, b, check, reps=10):
    src = shader(M, N, K, R, C, form, strided, unroll)
    prog = ctx.program(vertex_shader=VERT, fragment_shader=src)
    if form == "kt":
        ta = tex(a.reshape(M, K // 4, 4).transpose(1, 0, 2), M, K // 4)
        tb = tex(b.reshape(N, K // 4, 4).transpose(1, 0, 2), N, K // 4)
    elif form == "tg":
        wl = max(0, ((M * K // 4) ** 0.5 - 1).__ceil__().bit_length())
        ta = tex(a, 1 << wl, M * K // 4 >> wl)
        tb = tex(b, 1 << wl, N * K // 4 >> wl)
    else:
        ta = tex(a, K // 4, M)
        tb = tex(b, K // 4, N) if form == "t" else tex(b, N // 4, K)
    ta.use(0)
    tb.use(1)
    prog["A"].value = 0
    prog["B"].value = 1
    MR, NC = M // R, N // 4 // C
    outs = [ctx.texture((NC, MR), 4, dtype="f4") for _ in range(R * C)]
    fbo = ctx.framebuffer(color_attachments=outs)
    vao = ctx.vertex_array(prog, [(vbo, "2f", "p")])
    fbo.use()
    ctx.viewport = (0, 0, NC, MR)
    vao.render(moderngl.TRIANGLES, vertices=3)
    ctx.finish()
    t0 = time.perf_counter()
    vao.render(moderngl.TRIANGLES, vertices=3)
    ctx.finish()
    once = time.perf_counter() - t0
    reps = max(2, min(reps, int(1.5 / max(once, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(reps):
        vao.render(moderngl.TRIANGLES, vertices=3)
    ctx.finish()
    ms = (time.perf_counter() - t0) / reps * 1e3
    err = None
    if check is not None:
        out = np.zeros((M, N), np.float32)
        for r in range(R):
            for c in range(C):
                v = np.frombuffer(outs[r * C + c].read(), np.float32).reshape(MR, NC, 4)
                rows = np.arange(MR) + r * MR if strided else np.arange(MR) * R + r
                cts = np.arange(NC) + c * NC if strided else np.arange(NC) * C + c
                for e in range(4):
                    out[np.ix_(rows, cts * 4 + e)] = v[:, :, e]
        err = float(np.abs(out - check).max() / np.abs(check).max())
    for o in [vao, fbo, *outs, ta, tb, prog]:
        o.release()
    return ms, err


def main2():
    rng = np.random.default_rng(0)
    for n in [int(s) for s in sys.argv[2:]]:
        a = rng.standard_normal((n, n)).astype(np.float32)
        w = rng.standard_normal((n, n)).astype(np.float32)
        ref = (a.astype(np.float64) @ w.T.astype(np.float64)) if n <= 1024 else None
        for R, C, form, strided, unroll in [
            (8, 1, "tg", False, 1),
            (8, 1, "tg", False, 4),
            (4, 2, "tg", False, 4),
            (8, 1, "kt", False, 1),
            (4, 2, "kt", False, 1),
            (4, 1, "kt", False, 1),
            (8, 1, "kt", True, 1),
            (2, 4, "kt", False, 1),
            (8, 1, "kt", False, 4),
        ]:
            ms, err = run(n, n, n, R, C, form, strided, unroll, a, w, ref)
            print(
                f"n={n} R={R} C={C} form={form} strided={int(strided)} unroll={unroll}: "
                f"{ms:.3f} ms {2 * n**3 / ms / 1e9:.3f} TFLOP/s err={err}",
                flush=True,
            )


def main():
    rng = np.random.default_rng(0)
    variants = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2), (2, 4), (1, 4), (1, 8)]
    results = []
    for n in [int(s) for s in sys.argv[1:]] or [1024, 2048, 4096]:
        a = rng.standard_normal((n, n)).astype(np.float32)
        w = rng.standard_normal((n, n)).astype(np.float32)  # W (N x K)
        ref_t = (a.astype(np.float64) @ w.T.astype(np.float64)) if n <= 1024 else None
        ref_r = (a.astype(np.float64) @ w.astype(np.float64)) if n <= 1024 else None
        cfgs = []
        for R, C in variants:
            cfgs.append((R, C, "t", False, 1))
        for R, C in [(8, 1), (4, 2), (2, 2), (4, 1), (1, 1)]:
            cfgs.append((R, C, "r", False, 1))
        for R, C in [(1, 1), (8, 1), (4, 2), (4, 1), (2, 2)]:
            cfgs.append((R, C, "tg", False, 1))
        for R, C in [(8, 1), (4, 2), (4, 1)]:
            cfgs.append((R, C, "t", True, 1))
            cfgs.append((R, C, "t", False, 2))
            cfgs.append((R, C, "r", True, 1))
        for R, C, form, strided, unroll in cfgs:
            ref = ref_r if form == "r" else ref_t
            try:
                ms, err = run(n, n, n, R, C, form, strided, unroll, a, w, ref)
            except Exception as ex:
                print("FAIL", n, R, C, form, strided, unroll, ex, flush=True)
                continue
            tf = 2 * n**3 / ms / 1e9
            results.append((n, R, C, form, strided, unroll, ms, tf, err))
            print(
                f"n={n} R={R} C={C} form={form} strided={int(strided)} unroll={unroll}: "
                f"{ms:.3f} ms {tf:.3f} TFLOP/s err={err}",
                flush=True,
            )
    # interleave cost: copy 8 targets into one texture
    n = 4096
    R, C = 8, 1
    src = ["#version 300 es", "precision highp float;", "precision highp int;"]
    src += ["precision highp sampler2D;"]
    src += [f"uniform sampler2D t{i};" for i in range(8)]
    src += [
        "out vec4 o;",
        "void main() {",
        "  ivec2 p = ivec2(gl_FragCoord.xy);",
        "  int r = p.y & 7;",
        "  ivec2 q = ivec2(p.x, p.y >> 3);",
        "  vec4 v = texelFetch(t0, q, 0);",
    ]
    src += [f"  if (r == {i}) v = texelFetch(t{i}, q, 0);" for i in range(1, 8)]
    src += ["  o = v;", "}"]
    prog = ctx.program(vertex_shader=VERT, fragment_shader="\n".join(src) + "\n")
    ins = [ctx.texture((n // 4, n // 8), 4, dtype="f4") for _ in range(8)]
    for i, t in enumerate(ins):
        t.use(i)
        prog[f"t{i}"].value = i
    out = ctx.texture((n // 4, n), 4, dtype="f4")
    fbo = ctx.framebuffer(color_attachments=[out])
    vao = ctx.vertex_array(prog, [(vbo, "2f", "p")])
    fbo.use()
    ctx.viewport = (0, 0, n // 4, n)
    vao.render(moderngl.TRIANGLES, vertices=3)
    ctx.finish()
    t0 = time.perf_counter()
    for _ in range(20):
        vao.render(moderngl.TRIANGLES, vertices=3)
    ctx.finish()
    print(f"interleave 8 -> 1 at 4096^2: {(time.perf_counter() - t0) / 20 * 1e3:.3f} ms", flush=True)
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        for n in [1024, 2048, 4096]:
            x = torch.randn(n, n, device="cuda")
            y = torch.randn(n, n, device="cuda")
            for _ in range(3):
                x @ y
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                x @ y
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / 20 * 1e3
            print(f"torch n={n}: {ms:.3f} ms {2 * n**3 / ms / 1e9:.2f} TFLOP/s", flush=True)
    except Exception as ex:
        print("torch failed", ex)


if __name__ == "__main__":
    if sys.argv[1:2] == ["v2"]:
        main2()
    else:
        main()
