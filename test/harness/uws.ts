/**
 * Copies of the installed uWebSockets.js that do not load natively, for the tests of the gateway's
 * refusal: real packages and a real binary, which the real loader refuses.
 *
 * - "glibc": the package as installed, its binary for this Node asking for GLIBC_9.99 instead of
 *   GLIBC_2.38 (the same bytes in its version needs, renamed): dlopen fails as it does on a glibc
 *   too old, naming the version it misses.
 * - "fallback": a package that loads with no binary at all, as builds with a pure-JS fallback do.
 */
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

export const INSTALLED_UWS = dirname(createRequire(import.meta.url).resolve("uWebSockets.js"));
export const BINARY = `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;

export function brokenUwsPackage(dir: string, how: "glibc" | "fallback"): string {
  mkdirSync(dir, { recursive: true });
  if (how === "fallback") {
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "uws-fallback", main: "index.js" }));
    writeFileSync(join(dir, "index.js"), "module.exports = { App() { throw new Error('pure JS'); } };\n");
    return dir;
  }
  for (const f of ["package.json", "uws.js"]) copyFileSync(join(INSTALLED_UWS, f), join(dir, f));
  const bin = readFileSync(join(INSTALLED_UWS, BINARY));
  const [from, to] = [Buffer.from("GLIBC_2.38\0"), Buffer.from("GLIBC_9.99\0")];
  let at = bin.indexOf(from);
  if (at === -1) throw new Error(`${BINARY} does not ask for GLIBC_2.38: this fixture needs another version to rename`);
  for (; at !== -1; at = bin.indexOf(from, at + 1)) to.copy(bin, at);
  writeFileSync(join(dir, BINARY), bin);
  return dir;
}
