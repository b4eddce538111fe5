// Lint: typescript-eslint's recommended rules plus the type-aware ones that catch async mistakes
// (a dropped promise in a socket handler is a lost entry or a crashed process).
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["node_modules/", "dist/", "coverage/", "k8s/", "client/demo/jetgate.js", ".tmp/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      "@typescript-eslint/no-floating-promises": [
        "error",
        // node:test tracks the promises of test() and describe() itself.
        { allowForKnownSafeCalls: [{ from: "package", name: ["test", "it", "describe", "suite"], package: "node:test" }] },
      ],
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/await-thenable": "error",
      "@typescript-eslint/consistent-type-imports": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      eqeqeq: ["error", "always"],
      "no-console": "off",
    },
  },
  // The import graph (no circle, the tiers apart, the pure core free of I/O and Node modules) is
  // checked by dependency-cruiser (.dependency-cruiser.cjs), also in `npm run lint`. What a graph
  // cannot see: the pure core reads no process state and never exits.
  {
    files: ["protocol/*.ts"],
    rules: {
      "no-restricted-globals": ["error", { name: "process", message: "protocol/'s pure core uses no process (env, argv, exit, stdout): take it as a parameter, or put the code in protocol/io/." }],
    },
  },
  {
    files: ["**/*.js", "**/*.mjs", "**/*.cjs"],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { URL: "readonly", process: "readonly", console: "readonly", module: "writable" },
    },
  },
);
