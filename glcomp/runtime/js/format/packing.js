// The packing rule of tensors into texture pages, as glcomp/format/packing.py: a row of the
// layout's last axis fills whole RGBA texels (the last one padded), rows follow one another,
// pages of width x height texels (tests/format/test_format_packing.py checks both place every element
// alike).

/** Pack a flat row-major Float32Array of the layout's shape into pages of width*height RGBA texels. */
export function pack(flat, lay) {
  const { rows, row_len: rowLen, row_texels: rowTexels, width, height, pages } = lay;
  const pageSize = width * height * 4;
  const texels = new Float32Array(pages * pageSize);
  if (rowLen === rowTexels * 4) texels.set(flat.subarray(0, rows * rowLen));
  else for (let r = 0; r < rows; r++) texels.set(flat.subarray(r * rowLen, (r + 1) * rowLen), r * rowTexels * 4);
  const out = [];
  for (let p = 0; p < pages; p++) out.push(texels.subarray(p * pageSize, (p + 1) * pageSize));
  return out;
}

/** Inverse of `pack`: pages of RGBA floats -> a flat row-major Float32Array. */
export function unpack(pages, lay) {
  const { rows, row_len: rowLen, row_texels: rowTexels } = lay;
  let all = pages[0];
  if (pages.length > 1) {
    all = new Float32Array(pages.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of pages) { all.set(p, o); o += p.length; }
  }
  const out = new Float32Array(rows * rowLen);
  if (rowLen === rowTexels * 4) out.set(all.subarray(0, rows * rowLen));
  else for (let r = 0; r < rows; r++) out.set(all.subarray(r * rowTexels * 4, r * rowTexels * 4 + rowLen), r * rowLen);
  return out;
}
