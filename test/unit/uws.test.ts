/**
 * The gateway's uWebSockets.js loader: the native binary or a named refusal, never a fallback.
 * The failing packages are real (test/harness/uws.ts): the loader's answers are the real ones.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { UWS_MIN_GLIBC, UwsLoadError, glibcVersion, loadUws, versionBelow } from "../../gateway/uws.js";
import { BINARY, brokenUwsPackage } from "../harness/uws.js";

const dir = mkdtempSync(join(tmpdir(), "jetgate-uws-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const WAYS_OUT = [/provisioned runtime/, /npm run -s runtime/, /node:24-trixie-slim/, new RegExp(`glibc >= ${UWS_MIN_GLIBC.replace(".", "\\.")} \\(Debian 13`)];

test("uws - the installed package loads its native binary for this Node", () => {
  const { uws, binary } = loadUws();
  assert.equal(basename(binary), BINARY);
  assert.equal(typeof uws.App, "function");
});

test("uws - a binary the C library refuses: one error naming the glibc found, the one needed, the loader's words and the ways out", () => {
  const broken = brokenUwsPackage(join(dir, "glibc"), "glibc");
  const err = (() => {
    try {
      loadUws(broken);
    } catch (e) {
      return e;
    }
    assert.fail("loaded a binary that asks for GLIBC_9.99");
  })();
  assert.ok(err instanceof UwsLoadError);
  assert.equal(err.code, "UWS_LOAD");
  assert.match(err.message, new RegExp(`could not load its native binary ${BINARY.replaceAll(".", "\\.")} \\(Node ${process.version.replaceAll(".", "\\.")}`));
  // the version the loader misses is the one needed; this process's glibc is the one found
  assert.match(err.message, new RegExp(`its binaries need glibc >= 9\\.99; this process runs on glibc ${glibcVersion()!.replace(".", "\\.")}\\n`));
  assert.match(err.message, /the loader said: .*GLIBC_9\.99' not found/);
  for (const way of WAYS_OUT) assert.match(err.message, way);
  assert.match(String((err.cause as Error).message), /GLIBC_9\.99/, "the loader's own error is the cause");
});

test("uws - a build that loads without a binary of its own (a pure-JS fallback) is refused", () => {
  const fallback = brokenUwsPackage(join(dir, "fallback"), "fallback");
  assert.throws(() => loadUws(fallback), (e: unknown) => {
    assert.ok(e instanceof UwsLoadError);
    assert.match(e.message, /loaded without a native binary of its own \(no uws_\*\.node in .*fallback\/\): a pure-JS fallback/);
    for (const way of WAYS_OUT) assert.match(e.message, way);
    return true;
  });
});

test("uws - a package that is not installed is named as such", () => {
  assert.throws(() => loadUws(join(dir, "nothing-here")), /the package is not installed \(npm ci\)/);
});

test("uws - versionBelow compares dotted versions by number", () => {
  assert.equal(versionBelow("2.36", "2.38"), true);
  assert.equal(versionBelow("2.41", "2.38"), false);
  assert.equal(versionBelow("2.38", "2.38"), false);
  assert.equal(versionBelow("2.9", "2.10"), true);
  assert.equal(versionBelow("3", "2.99"), false);
});
