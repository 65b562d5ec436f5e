#!/usr/bin/env bash
# The browser runtime's npm package (packages/glcomp-js), as a page built with a bundler uses it:
# the TypeScript declarations checked with `tsc --noEmit` against a usage file, every export of
# glcomp.js declared, `npm pack`, then the tarball installed into a fresh project where
# `import { Runtime } from "glcomp"` resolves (node, and tsc through the package's `exports`).
# Run by scripts/test_wheel.sh (a step of scripts/test.sh). Needs npm; TypeScript is the
# package's pinned devDependency (npm ci).
set -euo pipefail
cd "$(dirname "$0")/../packages/glcomp-js"
pkg=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/glcomp-npm.XXXXXX")
trap 'rm -rf "$work"; rm -f "$pkg"/glcomp-*.tgz' EXIT

npm ci --no-audit --no-fund --loglevel=error
# (`npm run typecheck` checks check/usage.ts against the declarations in place; the same file is
# checked below through the installed package, which also proves its `exports` and `types`.)
tgz=$(npm pack --silent --pack-destination "$work" | tail -n 1)
# copy-runtime.mjs follows glcomp.js's imports: the Runtime's parts (runtime.js and the modules
# it is composed of) are in dist/
contents=$(tar -tzf "$work/$tgz")
for f in glcomp.js runtime.js context.js executor.js readback.js persistence.js; do
  grep -qx "package/dist/$f" <<<"$contents" || { echo "dist/$f is missing from $tgz" >&2; exit 1; }
done

mkdir "$work/app" && cd "$work/app"
echo '{ "name": "app", "private": true, "type": "module" }' >package.json
npm install --no-audit --no-fund --loglevel=error --offline "$work/$tgz"
node --input-type=module -e '
import * as glcomp from "glcomp";
import { readFileSync } from "node:fs";
if (typeof glcomp.Runtime?.load !== "function") throw new Error("Runtime.load is missing");
const dts = readFileSync("node_modules/glcomp/glcomp.d.ts", "utf8");
const undeclared = Object.keys(glcomp).filter((n) => !new RegExp(`export (declare )?(class|const|function) ${n}\\b`).test(dts));
if (undeclared.length) throw new Error(`glcomp.d.ts does not declare ${undeclared.join(", ")}`);
console.log(`glcomp ${JSON.parse(readFileSync("node_modules/glcomp/package.json", "utf8")).version}: ${Object.keys(glcomp).length} exports, all declared`);
'
cp "$pkg/check/usage.ts" .
cat >tsconfig.json <<'JSON'
{ "compilerOptions": { "target": "ES2022", "module": "ESNext", "moduleResolution": "Bundler", "lib": ["ES2022", "DOM"],
    "strict": true, "noEmit": true, "types": [] }, "files": ["usage.ts"] }
JSON
"$pkg/node_modules/.bin/tsc" --noEmit -p .
echo "npm package $tgz: packed, installed, imported and type-checked"
