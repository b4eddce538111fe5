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
  // The tiers (gateway/, worker/, client/) import no other tier and reach protocol/ only through its
  // entry points: index.js (the pure contract) and io/index.js (shared I/O); the device SDK only the
  // browser-safe device.js. protocol/'s pure files never import its I/O, NATS or Redis.
  {
    files: ["gateway/**/*.ts", "worker/**/*.ts"],
    rules: {
      "no-restricted-imports": ["error", {
        patterns: [
          { regex: "^\\.\\./(gateway|worker|client)/", message: "A tier imports no other tier: shared code lives in protocol/." },
          { regex: "^\\.\\./protocol/(?!index\\.js$|io/index\\.js$|device\\.js$)", message: "Import protocol/ through protocol/index.js (pure) or protocol/io/index.js (I/O)." },
        ],
      }],
    },
  },
  {
    files: ["client/**/*.ts"],
    rules: {
      "no-restricted-imports": ["error", {
        patterns: [
          { regex: "^\\.\\./(gateway|worker)/", message: "The SDK imports no server tier." },
          { regex: "^\\.\\./protocol/(?!device\\.js$)", message: "The SDK imports only protocol/device.js, the browser-safe part." },
        ],
        paths: ["ioredis", "@nats-io/transport-node", "@nats-io/jetstream", "@nats-io/kv", "uWebSockets.js", "pino"].map((name) => ({ name, message: "The SDK is browser-safe." })),
      }],
    },
  },
  {
    files: ["protocol/*.ts"],
    rules: {
      "no-restricted-imports": ["error", {
        patterns: [{ regex: "^\\./io/|^\\.\\./", message: "protocol/'s pure contract imports no I/O and no tier." }],
        paths: ["ioredis", "@nats-io/transport-node", "@nats-io/jetstream", "@nats-io/kv", "uWebSockets.js"].map((name) => ({ name, message: "protocol/'s pure contract talks to no server: put I/O in protocol/io/." })),
      }],
    },
  },
  {
    files: ["**/*.js", "**/*.mjs"],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { URL: "readonly", process: "readonly", console: "readonly" },
    },
  },
);
