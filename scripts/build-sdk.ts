/**
 * Browser build of the device SDK: one ES module, `client/demo/jetgate.js` (also what the demo page
 * loads). `npm run build:sdk`; `npm start` runs it first.
 */
import { build } from "esbuild";
import { fileURLToPath } from "node:url";

export const SDK_BUNDLE = fileURLToPath(new URL("../client/demo/jetgate.js", import.meta.url));

export async function buildSdk(): Promise<string> {
  await build({
    entryPoints: [fileURLToPath(new URL("../client/index.ts", import.meta.url))],
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    outfile: SDK_BUNDLE,
    minify: true,
    sourcemap: false,
    logLevel: "warning",
  });
  return SDK_BUNDLE;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  buildSdk().then(
    (f) => console.log(`built ${f}`),
    (err: unknown) => {
      console.error(err);
      process.exit(1);
    },
  );
}
