import { test } from "node:test";
import assert from "node:assert/strict";
import { MIN_NATS_SERVER, natsVersionProblem, parseServerVersion } from "../../protocol/index.js";

test("nats version - parses releases, pre-releases and a leading v", () => {
  assert.deepEqual(parseServerVersion("2.15.2"), [2, 15, 2]);
  assert.deepEqual(parseServerVersion("v2.12.1-RC.3"), [2, 12, 1]);
  assert.equal(parseServerVersion("garbage"), undefined);
});

test("nats version - the minimum and later pass; older, its pre-releases and unreadable versions are refused, naming the version", () => {
  assert.equal(MIN_NATS_SERVER, "2.12.1");
  for (const ok of ["2.12.1", "2.12.2", "2.13.0", "2.15.2", "3.0.0", "v2.14.0-beta.1"]) assert.equal(natsVersionProblem(ok), undefined, ok);
  for (const old of ["2.9.10", "2.11.9", "2.12.0", "1.99.99"]) {
    const p = natsVersionProblem(old);
    assert.match(p ?? "", new RegExp(`nats-server ${old.replace(/\./g, "\\.")} is too old: jetgate needs 2\\.12\\.1 or later`), old);
  }
  assert.match(natsVersionProblem("2.12.1-RC.2") ?? "", /pre-release of 2\.12\.1/);
  assert.match(natsVersionProblem(undefined) ?? "", /no readable version/);
  assert.match(natsVersionProblem("") ?? "", /no readable version \(""\)/);
});
