/**
 * Preloaded (`--import`) into a gateway a test starts with TEST_UWS_PACKAGE set: `uWebSockets.js`
 * resolves to that folder instead (a package of test/harness/uws.ts that does not load), through
 * Node's own module hooks. Nothing else changes: the gateway loads it as it loads the real one.
 */
import { registerHooks } from "node:module";
import { pathToFileURL } from "node:url";

const to = process.env.TEST_UWS_PACKAGE;
if (to) {
  registerHooks({
    resolve: (specifier, context, next) => (specifier === "uWebSockets.js" ? next(pathToFileURL(`${to}/`).href, context) : next(specifier, context)),
  });
}
