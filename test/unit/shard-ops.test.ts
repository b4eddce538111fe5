import { test } from "node:test";
import assert from "node:assert/strict";
import { copyProgress } from "../../worker/shard-ops.js";

test("shard operations - a stream copy's progress line: how many of how many, the rate, the time left", () => {
  assert.equal(copyProgress("SHARD_3_REBUILD", 250_000, 1_000_000, 10_000), "stream SHARD_3_REBUILD: copied 250,000 of 1,000,000 messages (25%), 25,000/s, about 30 s left");
  assert.equal(copyProgress("S", 0, 10, 5000), "stream S: copied 0 of 10 messages (0%), 0/s, time left unknown");
  // a source that dropped repeats (the duplicate window) can end below its count; never above 100%
  assert.equal(copyProgress("S", 12, 10, 1000), "stream S: copied 12 of 10 messages (100%), 12/s, about 0 s left");
  assert.equal(copyProgress("S", 0, 0, 0), "stream S: copied 0 of 0 messages (100%), 0/s, time left unknown");
});
