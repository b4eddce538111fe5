import { test } from "node:test";
import assert from "node:assert/strict";
import { checkLog, type Dispatched, type LoggedEvent } from "../../conformance/checks.js";

const sent: Dispatched[] = [1, 2, 3, 4].map((i) => ({ id: `m${i}`, shard: 0, seq: BigInt(i) }));
const entry = (i: number, life = 1, seq = BigInt(i)): LoggedEvent => ({ ev: "entry", life, id: `m${i}`, seq: seq.toString() });
const cursor = (seq: number, life = 1): LoggedEvent => ({ ev: "cursor", life, seq: String(seq) });
const checks = (events: LoggedEvent[], opts = {}) => checkLog(events, sent, opts).map((v) => v.check);

test("conformance checks - every entry once and in order: nothing to report", () => {
  assert.deepEqual(checks([entry(1), cursor(1), entry(2), entry(3), entry(4)]), []);
});

test("conformance checks - an entry twice in one life is 'once'; a seq going back is 'order'", () => {
  assert.deepEqual(checks([entry(1), entry(2), entry(2), entry(3), entry(4)]), ["once", "order"]);
  assert.deepEqual(checks([entry(1), entry(3), entry(2), entry(4)]), ["order"]);
});

test("conformance checks - a missing entry is 'lost', unless the server declared it gone", () => {
  assert.deepEqual(checks([entry(1), entry(2), entry(4)]), ["lost"]);
  assert.deepEqual(checks([entry(1), entry(2), entry(4)], { gone: new Set(["m3"]) }), []);
});

test("conformance checks - after a crash, entries past the last stored cursor may come again; those at or below it may not", () => {
  // life 1 applied 1..3 and stored 2, then was killed: 3 again is the cost of the crash
  assert.deepEqual(checks([entry(1), entry(2), cursor(2), entry(3), entry(3, 2), entry(4, 2)]), []);
  // 2 again: its cursor was stored, so the SDK resumed below its own cursor
  assert.deepEqual(checks([entry(1), entry(2), cursor(2), entry(3), entry(2, 2), entry(3, 2), entry(4, 2)]), ["once"]);
});

test("conformance checks - after a clean stop nothing may come again, unless the case allows repeats in a later life", () => {
  const events = [entry(1), entry(2), cursor(2), { ev: "stopped", life: 1 }, entry(2, 2), entry(3, 2), entry(4, 2)];
  assert.deepEqual(checks(events), ["once"]);
  assert.deepEqual(checks(events, { repeatsAcrossLives: true }), []);
});

test("conformance checks - CURSOR_INVALID starts a generation that must hold every entry again", () => {
  const invalid: LoggedEvent = { ev: "cursor_invalid", life: 2 };
  assert.deepEqual(checks([entry(1), entry(2), invalid, entry(1, 2), entry(2, 2), entry(3, 2), entry(4, 2)]), []);
  assert.deepEqual(checks([entry(1), entry(2), entry(3), entry(4), invalid, entry(3, 2), entry(4, 2)]), ["lost"]);
});

test("conformance checks - an entry the kit never dispatched is 'unknown'", () => {
  assert.deepEqual(checks([entry(1), entry(2), entry(3), entry(4), { ev: "entry", life: 1, id: "other", seq: "9" }]), ["unknown"]);
});

test("conformance - docs/conformance.md lists every scenario, with its line", async () => {
  const { readFileSync } = await import("node:fs");
  const { SCENARIOS } = await import("../../conformance/scenarios.js");
  const doc = readFileSync(new URL("../../docs/conformance.md", import.meta.url), "utf8");
  for (const s of SCENARIOS) assert.ok(doc.includes(`| \`${s.name}\` | ${s.what} |`), `docs/conformance.md has no row for ${s.name}: "${s.what}"`);
});
