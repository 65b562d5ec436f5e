// glcomp browser runtime: loads a glcomp bundle (manifest.json, shaders.json, weights.safetensors),
// validates it as strictly as glcomp/format and runs its entry points with WebGL
// exactly like glcomp/runtime/gl.py does with moderngl. No dependencies; an ES module.
//
//   import { Runtime } from "./glcomp.js";
//   const rt = await Runtime.load("bundle/");           // or {"manifest.json": File, ...}
//   const loss = await rt.trainStep({ x: Float32Array, y: Int32Array });
//   const out = await rt.predict({ x });                 // {shape, dtype, data}
//   rt.dispose();//
// The modules: format/ (the bundle format, one module per glcomp/format module: manifest.js, its
// validation with the schema of manifest_schema.js and the interpreter of jsonschema.js;
// shaders.js, shader loop bounds and shaders.json; parse.js, JSON and safetensors; packing.js,
// tensors in texture pages), io.js (sha256, inputs, bundle loading), runtime.js (the Runtime
// class, composed of context.js: the context, capability probe and context loss; executor.js:
// textures, programs, draws; readback.js: fences and pixel-pack buffers; persistence.js:
// weights, snapshots, IndexedDB), util.js (the error type and helpers). This module re-exports their public API, so
// `import ... from "./glcomp.js"` keeps working.

export { GlcompError, nextTask } from "./util.js";
export {
  DEFAULT_ENTRY_BUDGET, DEFAULT_LOOP_BUDGET, DEFAULT_TEXTURE_BUDGET, EXACT_FORMATS, FORMAT, MAX_SIDE, SHADERS_FILE, TEXEL_BYTES, VERSIONS,
  shaderPath, texelSpan, textureFormat, validateManifest,
} from "./format/manifest.js";
export { checkShaders, shaderLoopBound, unpackShaders } from "./format/shaders.js";
export { parseJson, parseSafetensors, writeSafetensors } from "./format/parse.js";
export { pack, unpack } from "./format/packing.js";
export { checkFeeds, checkInput, downloadBytes, loadBundle, sha256, sha256Sync } from "./io.js";
export { PRESETS, Runtime } from "./runtime.js";
export { WorkerRuntime, load, workerSupported } from "./worker.js"; // training in a Worker (docs/worker.md)
