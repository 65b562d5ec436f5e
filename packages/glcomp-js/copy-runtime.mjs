/* global console, process */
// Copies the browser runtime (glcomp/runtime/js: glcomp.js and every module it imports, found by
// following its relative imports) into dist/ before `npm pack`, and checks that this package's
// version is glcomp's (glcomp/_version.py, the one place). No dependencies.
import { copyFileSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { dirname, join, posix } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, "..", "..", "glcomp", "runtime", "js");
const dist = join(here, "dist");

const python = readFileSync(join(here, "..", "..", "glcomp", "_version.py"), "utf8");
const version = /__version__ = "([^"]+)"/.exec(python)?.[1];
const pkg = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
if (pkg.version !== version) {
  console.error(`package.json's version ${pkg.version} is not glcomp's ${version} (glcomp/_version.py)`);
  process.exit(1);
}

const wanted = new Set(); // paths relative to src, with "/" (format/manifest.js)
const visit = (name) => {
  if (wanted.has(name)) return;
  wanted.add(name);
  const text = readFileSync(join(src, name), "utf8");
  for (const m of text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+"(\.{1,2}\/[\w./-]+\.js)"/gms)) {
    const target = posix.normalize(posix.join(posix.dirname(name), m[1]));
    if (target.startsWith("../")) throw new Error(`${name} imports ${m[1]}, outside glcomp/runtime/js`);
    visit(target);
  }
};
visit("glcomp.js");

rmSync(dist, { recursive: true, force: true });
mkdirSync(dist);
for (const name of [...wanted].sort()) {
  mkdirSync(dirname(join(dist, name)), { recursive: true });
  copyFileSync(join(src, name), join(dist, name));
}
console.log(`dist/: ${[...wanted].sort().join(", ")}`);
