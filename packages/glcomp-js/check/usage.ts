// What a page built with a bundler writes; `tsc --noEmit -p check` type-checks it against
// ../glcomp.d.ts (resolved as the package "glcomp", as `npm install glcomp-<version>.tgz` does).
import { GlcompError, Runtime, parseSafetensors, writeSafetensors, type Tensor } from "glcomp";

export async function demo(x: Float32Array, y: Int32Array): Promise<number> {
  const rt = await Runtime.load("bundle/", { readback: "async", keepWeightsEvery: 50 });
  try {
    const first: number = await rt.trainStep({ x, y });
    const losses: number[] = await rt.train({
      steps: 10,
      batches: [{ x, y }],
      onStep: (step, loss) => step < 100 && Number.isFinite(loss),
    });
    rt.setLr(rt.hyper.lr / 2);
    const out = await rt.predict({ x });
    const logits: Tensor = "data" in out && out.data instanceof Float32Array ? (out as Tensor) : Object.values(out)[0];
    const file: ArrayBuffer = rt.exportSafetensors();
    const weights = parseSafetensors(file);
    writeSafetensors(weights);
    console.log(rt.info().renderer, rt.liveObjects().textures, logits.shape, first, losses.at(-1));
    return logits.data.length;
  } catch (err) {
    if (err instanceof GlcompError && err.reason === "context-lost") await rt.restore();
    throw err;
  } finally {
    rt.dispose();
  }
}
