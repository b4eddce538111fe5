// The import graph's rules, checked by `npm run lint` (dependency-cruiser): no circle anywhere, the
// tiers apart, and protocol/'s pure core free of I/O. ESLint (eslint.config.js) keeps `process` out
// of the pure core, which an import graph cannot see.
const TIERS = "^(gateway|worker|client)/";
const PURE = "^protocol/[^/]+\\.ts$";
module.exports = {
  forbidden: [
    {
      name: "no-circular",
      severity: "error",
      comment: "An import circle (type-only imports count): a module's meaning then depends on load order. Move what both need to a third module.",
      from: {},
      to: { circular: true },
    },
    {
      name: "tier-imports-no-tier",
      severity: "error",
      comment: "A tier (gateway/, worker/, client/) imports no other tier: shared code lives in protocol/.",
      from: { path: "^(gateway|worker|client)/" },
      to: { path: TIERS, pathNot: "^$1/" },
    },
    {
      name: "server-tiers-through-protocol-entries",
      severity: "error",
      comment: "gateway/ and worker/ reach protocol/ only through protocol/index.ts (the pure contract), protocol/io/index.ts (shared I/O) or protocol/device.ts.",
      from: { path: "^(gateway|worker)/" },
      to: { path: "^protocol/", pathNot: "^protocol/(index|device|io/index)\\.ts$" },
    },
    {
      name: "sdk-browser-safe",
      severity: "error",
      comment: "The device SDK imports only protocol/device.ts of protocol/, and no server library (client/node.ts, its Node adapter, may use Node modules).",
      from: { path: "^client/" },
      to: { path: "^protocol/(?!device\\.ts$)|node_modules/(ioredis|@nats-io|uWebSockets\\.js|pino)/" },
    },
    {
      name: "protocol-no-tier",
      severity: "error",
      comment: "protocol/ (pure core and io/) is what the tiers share: it imports none of them.",
      from: { path: "^protocol/" },
      to: { path: TIERS },
    },
    {
      name: "pure-core-no-io",
      severity: "error",
      comment: "protocol/'s pure core (protocol/*.ts) imports no I/O: not protocol/io/, no server library.",
      from: { path: PURE },
      to: { path: "^protocol/io/|node_modules/(ioredis|@nats-io|uWebSockets\\.js|pino|prom-client)/" },
    },
    {
      name: "pure-core-no-node",
      severity: "error",
      comment: "protocol/'s pure core imports no Node module: what needs one belongs in protocol/io/.",
      from: { path: PURE },
      to: { dependencyTypes: ["core"] },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "^(dist|node_modules|coverage|k8s|\\.tmp)/|^client/demo/jetgate\\.js$" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: {
      exportsFields: ["exports"],
      conditionNames: ["import", "require", "node", "default", "types"],
      extensions: [".ts", ".js", ".mjs", ".cjs", ".d.ts"],
    },
  },
};
