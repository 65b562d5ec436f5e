// Hand-written declarations of glcomp's browser runtime (glcomp/runtime/js/glcomp.js), checked by
// `tsc --noEmit -p check` against check/usage.ts. Bundles come from the Python compiler:
// `glcomp.compile(...).save(dir)`.

/** The one error type: a mistake in a bundle, an input, or a missing browser capability. */
export class GlcompError extends Error {
  constructor(message: string);
  name: "GlcompError";
  /** "context-lost" when training stopped because the WebGL context was lost. */
  reason?: string;
  /** With reason "context-lost": the losses read before the loss. */
  losses?: number[];
}

/** Element types of a tensor read back or written as safetensors. */
export type DType = "float32" | "int64";

/** A tensor read back from the GPU: row-major data of `shape`. */
export interface Tensor {
  shape: number[];
  dtype: DType;
  data: Float32Array;
}

/** A nested array of numbers (any depth). */
export type NestedArray = number | NestedArray[];

/** What an input may be: a typed array, a plain or nested array, a number, or {shape, data};
 *  checked against the manifest's shape (class labels against num_classes). */
export type InputValue =
  | Float32Array
  | Float64Array
  | Int32Array
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | BigInt64Array
  | NestedArray
  | { shape: number[]; data: ArrayLike<number> };

/** Inputs of an entry point by name, e.g. {x, y}. */
export type Inputs = Record<string, InputValue>;

/** A bundle's files, when not fetched from a URL: file name -> contents. */
export type BundleFiles = Record<string, Blob | ArrayBuffer | ArrayBufferView | string>;

/** A bundle source: a base URL ("bundle/") or its files. */
export type BundleSource = string | URL | BundleFiles;

export interface LoadOptions {
  /** A canvas to take the WebGL context from (default: a new offscreen one). */
  canvas?: HTMLCanvasElement | OffscreenCanvas;
  /** "async" (default on WebGL 2: readbacks through pixel-pack buffers and fences) or "sync". */
  readback?: "async" | "sync";
  /** Passed to getContext. */
  contextAttributes?: WebGLContextAttributes;
  /** Called when the WebGL context is lost. */
  onContextLost?: ((info: { steps: number; kept: number }) => void) | null;
  /** Read the whole state back every this many train steps (default 100; 0: never). */
  keepWeightsEvery?: number;
  /** Bytes of textures a bundle may declare (default DEFAULT_TEXTURE_BUDGET). */
  textureBudgetBytes?: number;
  /** Loop iterations one draw may run (default DEFAULT_LOOP_BUDGET). */
  loopBudget?: number;
  /** Fragments x loop iterations an entry point may run (default DEFAULT_ENTRY_BUDGET). */
  entryBudget?: number;
  /** Origins a bundle URL may be fetched from besides the page's own. */
  allowOrigins?: string[];
  [option: string]: unknown;
}

export interface TrainOptions {
  /** Train steps to run (default: batches.length for an array). */
  steps?: number;
  /** Inputs per step: an array used in turn, or a function step -> inputs. */
  batches: Inputs[] | ((step: number) => Inputs);
  /** Called after each step's loss is read; returning false stops training. */
  onStep?: (step: number, loss: number) => unknown;
  /** Steps queued on the GPU before waiting for a loss (default 2). */
  inflight?: number;
  /** Yield to a zero-delay task (default) or to requestAnimationFrame between steps. */
  yieldTo?: "task" | "frame";
  /** Read the whole state back every this many steps (default: the keepWeightsEvery option). */
  keepEvery?: number;
}

/** What the WebGL context offers. */
export interface RuntimeInfo {
  renderer: string;
  /** Whether the renderer is a software one (SwiftShader, llvmpipe). */
  software: boolean;
  /** Whether a context made with failIfMajorPerformanceCaveat is refused (null: no canvas to probe). */
  performanceCaveat: boolean | null;
  warnings: string[];
  /** Which variant of a variant set was loaded and why, else null. */
  variant: unknown;
  [key: string]: unknown;
}

/** A bundle validated and read by `loadBundle`. */
export interface Bundle {
  manifest: Manifest;
  shaders: Record<string, string>;
  weights: Record<string, Float32Array>;
  counters: Record<string, number>;
}

/** A bundle's manifest.json (validated; see glcomp/format/manifest.schema.json). */
export interface Manifest {
  format: "glcomp-bundle";
  version: number;
  hyper: { lr: number; [name: string]: number };
  states: Record<string, { role: string; layout: { shape: number[]; [key: string]: unknown }; [key: string]: unknown }>;
  counters: Record<string, number>;
  entries: Record<string, { inputs: Record<string, unknown>; outputs: Record<string, unknown>; [key: string]: unknown }>;
  [key: string]: unknown;
}

/** Runs a glcomp bundle with WebGL 2 (GLSL ES 3.00 bundles) or WebGL 1 (GLSL ES 1.00 bundles). */
export class Runtime {
  /** Load, validate and set up a bundle (a base URL or its files). */
  static load(source: BundleSource, options?: LoadOptions): Promise<Runtime>;
  constructor(bundle: Bundle, options?: LoadOptions);

  readonly bundle: Bundle;
  readonly manifest: Manifest;
  /** Learning rate and the other hyper-parameters. */
  hyper: { lr: number; [name: string]: number };
  /** Step counters (e.g. BatchNorm's num_batches_tracked). */
  counters: Record<string, number>;
  /** Train steps run since load. */
  steps: number;
  /** Draw calls issued so far. */
  drawCalls: number;
  onContextLost: ((info: { steps: number; kept: number }) => void) | null;

  info(): RuntimeInfo;
  /** Live GL objects this runtime owns, by kind (all zero after dispose()). */
  liveObjects(): Record<"textures" | "framebuffers" | "programs" | "shaders" | "buffers" | "syncs", number>;

  /** The model's output (or {name: tensor} for several outputs). */
  predict(inputs: Inputs): Promise<Tensor | Record<string, Tensor>>;
  /** Loss and parameter gradients (train mode, no update). */
  gradients(inputs: Inputs): Promise<{ loss: number } & Record<string, Tensor | number>>;
  /** One optimizer step; resolves to the loss. */
  trainStep(inputs: Inputs): Promise<number>;
  /** Train several steps; resolves to the losses. */
  train(options: TrainOptions): Promise<number[]>;
  /** Set the learning rate (a finite number >= 0). */
  setLr(lr: number): void;
  /** A named tensor (a state, a counter, or one of the last entry run; docs/inspect.md). */
  inspect(name: string): Promise<Tensor>;
  /** Set by `load`: where the steps run, and why a worker was not used. */
  thread?: "main";
  fallbackReason?: string;

  /** Parameters, float buffers and counters by torch name (with `optimizer`: optimizer state too). */
  getWeights(options?: { optimizer?: boolean }): Record<string, { shape: number[]; dtype: DType; data: Float32Array | number[] }>;
  /** Load parameters, buffers and counters (all of them, shapes checked, finite). */
  setWeights(state: Record<string, { shape?: number[]; data: ArrayLike<number> } | ArrayLike<number>>): void;
  /** The inputs carried across batches (glcomp.compile's `carry=`; [] without it). */
  readonly carriedState: string[];
  /** Zero the carried state: all of it, or the named inputs (GlcompError for any other name). */
  resetState(names?: string | string[]): void;
  /** The weights as a safetensors file (torch names; `optimizer` adds the optimizer state). */
  exportSafetensors(options?: { optimizer?: boolean }): ArrayBuffer;
  /** Save everything that training changes in IndexedDB under `key`. */
  saveToIndexedDB(key: string, options?: { dbName?: string }): Promise<void>;
  /** Restore what saveToIndexedDB stored; false when nothing is stored under `key`. */
  loadFromIndexedDB(key: string, options?: { dbName?: string }): Promise<boolean>;

  /** Whether the WebGL context is lost (until restore()). */
  readonly contextLost: boolean;
  /** The step count of the weights restore() brings back. */
  readonly keptSteps: number;
  /** Read the whole state back and keep it for restore(); resolves to its step count. */
  snapshot(): Promise<number>;
  keptState(): { steps: number; weights: Record<string, Float32Array>; counters: Record<string, number> };
  /** After webglcontextrestored: rebuild every GL object and upload the kept state. */
  restore(): Promise<void>;
  /** Delete every GL object this runtime created. */
  dispose(): void;
}

/** Target limits of the mobile presets (suggested when a bundle does not fit a device). */
export const PRESETS: Record<"webgl1-mobile" | "webgl2-mobile", { max_texture_size: number; max_draw_buffers: number; max_texture_units: number }>;

/** Resolve on the next event-loop task. */
export function nextTask(): Promise<void>;

// -- bundle format and validation -----------------------------------------------------------
export const FORMAT: "glcomp-bundle";
export const VERSIONS: number[];
export const MAX_SIDE: number;
export const DEFAULT_TEXTURE_BUDGET: number;
export const DEFAULT_LOOP_BUDGET: number;
export const DEFAULT_ENTRY_BUDGET: number;
export const TEXEL_BYTES: { f32: number; f16: number; rgba8: number };
export const EXACT_FORMATS: string[];
export const SHADERS_FILE: string;
export function validateManifest(manifest: unknown, shaderNames: Iterable<string>, options?: { textureBudgetBytes?: number; loopBudget?: number; entryBudget?: number }): void;
export function checkShaders(manifest: Manifest, shaders: Record<string, string>): void;
export function shaderLoopBound(source: string, where: string): number;
export function shaderPath(version: number, name: string): string;
export function textureFormat(texture: { format?: string }): "f32" | "f16" | "rgba8";
export function texelSpan(texture: { format?: string }): number;

// -- files and inputs -----------------------------------------------------------------------
/** Load and validate a bundle without creating a runtime. */
export function loadBundle(source: BundleSource, options?: LoadOptions): Promise<Bundle>;
export function parseJson(bytes: ArrayBuffer | ArrayBufferView, where: string): unknown;
/** Parse a safetensors file: {name: {dtype, shape, data}}. */
export function parseSafetensors(buffer: ArrayBuffer | ArrayBufferView, where?: string): Record<string, { dtype: string; shape: number[]; data: Float32Array | Float64Array | BigInt64Array | Int32Array | Uint8Array | ArrayBufferView }>;
/** Write tensors as a safetensors file. */
export function writeSafetensors(tensors: Record<string, { dtype: string; shape: number[]; data: ArrayLike<number> | ArrayBufferView }>): ArrayBuffer;
export function sha256(data: ArrayBuffer | ArrayBufferView | string): Promise<string>;
export function sha256Sync(bytes: ArrayBuffer | ArrayBufferView): string;
export function unpackShaders(bytes: ArrayBuffer | ArrayBufferView, wanted: string[]): Record<string, string>;
export function pack(flat: Float32Array, layout: Record<string, unknown>): Float32Array[];
export function unpack(pages: Float32Array[], layout: Record<string, unknown>): Float32Array;
/** Check one input against its spec; returns it as a flat array. */
export function checkInput(name: string, spec: { shape: number[]; dtype?: string; num_classes?: number }, value: InputValue): Float32Array | Int32Array;
/** Check an entry point's inputs: every name known, none missing, each checked by checkInput. */
export function checkFeeds(entry: string, specs: Record<string, { shape: number[]; dtype?: string; num_classes?: number }>, given: Inputs): Record<string, Float32Array | Int32Array>;
/** Offer `bytes` to the user as a download named `filename`. */
export function downloadBytes(bytes: ArrayBuffer | ArrayBufferView | Blob, filename: string): void;

/** The Runtime API in a dedicated Worker with an OffscreenCanvas WebGL context (docs/worker.md). */
export class WorkerRuntime {
  static load(source: BundleSource, options?: LoadOptions): Promise<WorkerRuntime>;
  readonly thread: "worker";
  readonly manifest: Manifest;
  /** Train steps run since load, as of the worker's last reply. */
  steps: number;
  info(): RuntimeInfo & { thread: "worker" };
  predict(inputs: Inputs, options?: { transfer?: boolean }): Promise<Tensor | Record<string, Tensor>>;
  gradients(inputs: Inputs, options?: { transfer?: boolean }): Promise<{ loss: number } & Record<string, Tensor | number>>;
  trainStep(inputs: Inputs, options?: { transfer?: boolean }): Promise<number>;
  train(options: { steps?: number; batches: Inputs[]; onStep?: (step: number, loss: number) => unknown; inflight?: number;
    keepEvery?: number; progressEvery?: number; transfer?: boolean }): Promise<number[]>;
  inspect(name: string): Promise<Tensor>;
  setLr(lr: number): Promise<void>;
  getWeights(options?: { optimizer?: boolean }): Promise<Record<string, { shape: number[]; dtype: DType; data: Float32Array | BigInt64Array }>>;
  setWeights(state: Record<string, { shape?: number[]; data: ArrayLike<number> } | ArrayLike<number>> | ArrayBuffer): Promise<void>;
  /** The inputs carried across batches (Runtime.carriedState). */
  readonly carriedState: string[];
  /** Zero the carried state in the worker: all of it, or the named inputs. */
  resetState(names?: string | string[]): Promise<void>;
  exportSafetensors(options?: { optimizer?: boolean }): Promise<ArrayBuffer>;
  snapshot(): Promise<number>;
  liveObjects(): Promise<Record<string, number>>;
  saveToIndexedDB(key: string, options?: { dbName?: string }): Promise<void>;
  loadFromIndexedDB(key: string, options?: { dbName?: string }): Promise<boolean>;
  /** End the worker; resolves to its runtime's live GL objects after dispose (all zero). */
  dispose(): Promise<Record<string, number> | null>;
}

/** Load a bundle in a Worker ("auto", the default: where workers have OffscreenCanvas WebGL, else
 *  on the main thread; true: a worker or an error; false: the main thread). */
export function load(source: BundleSource, options?: LoadOptions & { worker?: boolean | "auto"; workerUrl?: string | URL }): Promise<Runtime | WorkerRuntime>;
/** Whether this browser has Worker and OffscreenCanvas. */
export function workerSupported(): boolean;
