// Frames straight into input textures: an image input (a manifest input with an `image` record,
// see glcomp/transforms/preprocess.py) takes video elements, canvases, OffscreenCanvases,
// ImageBitmaps, VideoFrames or ImageData, uploaded by texSubImage2D into the input's texture at
// the frame's place in the frame sheet; the bundle's preprocessing kernel reads them there.
// No pixel passes through JavaScript and no 2-D canvas is drawn.
import { GlcompError } from "./util.js";

const has = (name) => typeof globalThis[name] === "function";

/** Whether `v` is a source texImage2D uploads from (the kinds an image input takes). */
export function isFrameSource(v) {
  if (v === null || typeof v !== "object") return false;
  return (has("HTMLVideoElement") && v instanceof HTMLVideoElement)
    || (has("HTMLCanvasElement") && v instanceof HTMLCanvasElement)
    || (has("HTMLImageElement") && v instanceof HTMLImageElement)
    || (has("OffscreenCanvas") && v instanceof OffscreenCanvas)
    || (has("ImageBitmap") && v instanceof ImageBitmap)
    || (has("VideoFrame") && v instanceof VideoFrame)
    || (has("ImageData") && v instanceof ImageData);
}

/** Whether `value` given for an input is frames: one source or an array of them. */
export function isFrames(value) {
  return isFrameSource(value) || (Array.isArray(value) && value.length > 0 && value.every(isFrameSource));
}

/** The pixel size of a frame source: [width, height]. */
export function frameSize(src) {
  if (has("HTMLVideoElement") && src instanceof HTMLVideoElement) return [src.videoWidth, src.videoHeight];
  if (has("VideoFrame") && src instanceof VideoFrame) return [src.displayWidth, src.displayHeight];
  if (has("HTMLImageElement") && src instanceof HTMLImageElement) return [src.naturalWidth, src.naturalHeight];
  return [src.width, src.height];
}

/** Upload the frames `value` (one source or an array of `image.batch`) of the image input
 *  `name` into `tex`, its texture (RGBA32F: each byte k arrives as k / 255, which the kernel
 *  rounds back to k). A frame of another size than the manifest declares, or the wrong count,
 *  is a GlcompError naming the input and the sizes. */
export function uploadFrames(gl, tex, name, image, value) {
  const frames = Array.isArray(value) ? value : [value];
  if (frames.length !== image.batch) {
    throw new GlcompError(`input ${JSON.stringify(name)} takes ${image.batch} frame(s) of ${image.width}x${image.height} pixels, got ${frames.length}`);
  }
  frames.forEach((src, n) => {
    const [w, h] = frameSize(src);
    if (w !== image.width || h !== image.height) {
      throw new GlcompError(`input ${JSON.stringify(name)}: frame ${n} is ${w}x${h} pixels, the bundle takes ${image.width}x${image.height} `
        + "(width x height; compile with image_input(batch, height, width) of the camera's size or ask getUserMedia for it)");
    }
  });
  const restore = [gl.UNPACK_FLIP_Y_WEBGL, gl.UNPACK_PREMULTIPLY_ALPHA_WEBGL, gl.UNPACK_COLORSPACE_CONVERSION_WEBGL]
    .map((p) => [p, gl.getParameter(p)]);
  gl.pixelStorei(gl.UNPACK_FLIP_Y_WEBGL, false);
  gl.pixelStorei(gl.UNPACK_PREMULTIPLY_ALPHA_WEBGL, false);
  gl.pixelStorei(gl.UNPACK_COLORSPACE_CONVERSION_WEBGL, gl.NONE); // the bytes as they are
  gl.activeTexture(gl.TEXTURE0);
  gl.bindTexture(gl.TEXTURE_2D, tex);
  try {
    frames.forEach((src, n) => {
      const x = (n % image.columns) * image.width;
      const y = Math.floor(n / image.columns) * image.frame_rows;
      gl.texSubImage2D(gl.TEXTURE_2D, 0, x, y, gl.RGBA, gl.FLOAT, src);
    });
  } finally {
    for (const [p, v] of restore) gl.pixelStorei(p, v);
    gl.bindTexture(gl.TEXTURE_2D, null);
  }
}
