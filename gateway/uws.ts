/**
 * Loads uWebSockets.js and checks that its native binary is what runs.
 *
 * The npm build we use (installed under the `uWebSockets.js` alias) silently falls back to a slow
 * pure-JS implementation when its binary does not load for this Node/glibc. A gateway on the
 * fallback would serve a fraction of its rated connections, so it refuses to start unless
 * JETGATE_ALLOW_UWS_FALLBACK=true.
 */
import { createRequire } from "node:module";
import type * as Uws from "uWebSockets.js";
import { JetgateError } from "../protocol/index.js";

export class UwsFallbackError extends JetgateError {
  constructor() {
    super(
      "UWS_FALLBACK",
      "uWebSockets.js could not load its native binary for this platform and fell back to a pure-JS implementation; " +
        "set JETGATE_ALLOW_UWS_FALLBACK=true to run anyway (much slower), or install a uWebSockets.js build for this Node version",
    );
  }
}

export interface LoadedUws {
  uws: typeof Uws;
  native: boolean;
}

export function loadUws(allowFallback: boolean): LoadedUws {
  const require = createRequire(import.meta.url);
  const uws = require("uWebSockets.js") as typeof Uws;
  // The native module shows up in require.cache as uws_<platform>_<arch>_<abi>.node (upstream and
  // this build name it alike). Other .node files prove nothing: the fallback loads ws's addons.
  const native = Object.keys(require.cache).some((k) => /[/\\]uws_[^/\\]+\.node$/.test(k));
  if (!native && !allowFallback) throw new UwsFallbackError();
  return { uws, native };
}
