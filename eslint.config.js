// ESLint (flat config) for glcomp's browser runtime and the benchmark peers: ES modules in the
// browser, ESLint's recommended rules. Run by scripts/test.sh: `npx eslint glcomp/runtime/js glcomp/pages benchmarks/peers/*.js`.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["**/node_modules/**"] },
  js.configs.recommended,
  {
    files: ["**/*.js"],
    languageOptions: {
      ecmaVersion: 2024,
      sourceType: "module",
      globals: { ...globals.browser },
    },
    linterOptions: { reportUnusedDisableDirectives: "error" },
  },
];
