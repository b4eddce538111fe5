import { test } from "node:test";
import assert from "node:assert/strict";
import { copyProgress, progressReporter } from "../../worker/shard-ops.js";
import { terminal } from "../../worker/cli.js";

test("shard operations - a stream copy's progress line: how many of how many, the rate, the time left", () => {
  assert.equal(copyProgress("SHARD_3_REBUILD", 250_000, 1_000_000, 10_000), "stream SHARD_3_REBUILD: copied 250,000 of 1,000,000 messages (25%), 25,000/s, about 30 s left");
  assert.equal(copyProgress("S", 0, 10, 5000), "stream S: copied 0 of 10 messages (0%), 0/s, time left unknown");
  // a source that dropped repeats (the duplicate window) can end below its count; never above 100%
  assert.equal(copyProgress("S", 12, 10, 1000), "stream S: copied 12 of 10 messages (100%), 12/s, about 0 s left");
  assert.equal(copyProgress("S", 0, 0, 0), "stream S: copied 0 of 0 messages (100%), 0/s, time left unknown");
});

test("shard operations - progress: every check redraws a terminal's status line; without one, a line every 5 s", () => {
  const lines: string[] = [];
  const drawn: string[] = [];
  const onTerminal = progressReporter({ out: (l) => lines.push(l), status: (l) => drawn.push(l) }, 0);
  onTerminal("a", 400);
  onTerminal("b", 800);
  assert.deepEqual([drawn, lines], [["a", "b"], []]);
  const logged: string[] = [];
  const inLog = progressReporter({ out: (l) => logged.push(l) }, 0);
  for (const t of [400, 4_999, 5_000, 9_000, 10_100]) inLog(`at ${t}`, t);
  assert.deepEqual(logged, ["at 5000", "at 10100"]);
});

test("shard operations - a terminal's status line is redrawn in place and replaced by the next plain line", () => {
  let screen = "";
  const t = terminal((s) => (screen += s));
  t.out("frozen");
  t.status("copied 1 of 2");
  t.status("copied 2 of 2");
  t.out("done");
  t.out("next");
  assert.equal(screen, "frozen\n\r\x1b[2Kcopied 1 of 2\r\x1b[2Kcopied 2 of 2\r\x1b[2Kdone\nnext\n");
});
