import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { MAX_BODY_BYTES, MAX_ID_LENGTH, MAX_RECIPIENTS } from "../../protocol/index.js";
import { loadConfig } from "../../protocol/io/index.js";
import { BATCH_SHAPE, DispatchShapeGuard, maxDispatchBodyBytes, parseDispatchBatch, parseDispatchBody } from "../../gateway/http/dispatch-body.js";

const id = (c: string) => c.repeat(MAX_ID_LENGTH);
/** The largest request the Dispatcher accepts, as JSON.stringify writes it (indented, as a script might). */
function largestValid(maxBody: number, space?: number): string {
  const recipients = Array.from({ length: MAX_RECIPIENTS }, (_, i) => `${i.toString(36)}`.padEnd(MAX_ID_LENGTH, "u"));
  // every body byte a control character: the longest escape JSON has (\u0001)
  return JSON.stringify({ dispatch_id: id("d"), message_id: id("m"), lane: "l".repeat(32), recipients, body: "\u0001".repeat(maxBody) }, null, space);
}

const feedAll = (text: string, chunk = 65_536) => {
  const g = new DispatchShapeGuard();
  const bytes = Buffer.from(text);
  for (let i = 0; i < bytes.length; i += chunk) {
    const bad = g.feed(bytes.subarray(i, i + chunk));
    if (bad !== undefined) return { bad, at: i };
  }
  return undefined;
};

test("dispatch body - the byte limit is the largest valid request, documented figure for the default body limit", () => {
  const def = loadConfig({}).JETGATE_MAX_BODY_BYTES;
  assert.equal(maxDispatchBodyBytes(def), 1_194_240, "docs/security.md and docs/config.md quote this figure");
  for (const maxBody of [1, 1024, def, MAX_BODY_BYTES]) {
    for (const space of [undefined, 1]) {
      const text = largestValid(maxBody, space);
      assert.ok(Buffer.byteLength(text) <= maxDispatchBodyBytes(maxBody), `body ${maxBody}, indent ${space}: ${Buffer.byteLength(text)} > ${maxDispatchBodyBytes(maxBody)}`);
      assert.equal(feedAll(text), undefined);
    }
  }
  // and not far above it: the unindented largest request fills 89% of the limit (the rest is
  // room for whitespace between recipients)
  assert.ok(Buffer.byteLength(largestValid(def)) > 0.85 * maxDispatchBodyBytes(def));
});

test("dispatch body - the shape guard refuses at the byte that proves it: depth, fields, items", () => {
  const cases: [string, string, RegExp][] = [
    ["deep", "[".repeat(500_000), /nested deeper than 2 levels/],
    ["deep in an object", `{"recipients":[["a"]]}`, /nested deeper than 2 levels/],
    ["numbers", "[" + "1,".repeat(2_000_000) + "1]", /more than 8 fields/],
    ["recipients", `{"recipients":[${'"u",'.repeat(MAX_RECIPIENTS)}"u"]}`, /^recipients: must name at most 10000 recipients$/],
    ["numbers as recipients", `{"recipients":[${"1,".repeat(2_000_000)}1]}`, /^recipients: must name at most 10000 recipients$/],
    ["fields", `{${Array.from({ length: 20 }, (_, i) => `"k${i}":1`).join(",")}}`, /more than 8 fields/],
  ];
  for (const [name, text, re] of cases) {
    const r = feedAll(text);
    assert.ok(r !== undefined, name);
    assert.match(r.bad, re, name);
    assert.ok(r.at < 200_000, `${name}: refused within the first chunks, not at the end (${r.at})`);
  }
  // brackets and commas inside strings, escaped quotes included, do not count
  const tricky = JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["x"], body: '[[[{,,,,,,,,,,}]]]\\"[[[' + ",".repeat(20_000) });
  assert.equal(feedAll(tricky, 7), undefined);
});

test("dispatch body - property: the guard never refuses a valid request, however it is cut into chunks", () => {
  const idArb = fc.stringMatching(/^[A-Za-z0-9_-]{1,64}$/);
  fc.assert(
    fc.property(
      fc.record({ dispatch_id: idArb, message_id: idArb, lane: idArb, recipients: fc.uniqueArray(idArb, { minLength: 1, maxLength: 50 }), body: fc.string({ maxLength: 200 }) }),
      fc.integer({ min: 1, max: 64 }),
      fc.constantFrom(undefined, 2),
      (req, chunk, space) => {
        const text = JSON.stringify(req, null, space);
        assert.equal(feedAll(text, chunk), undefined);
        const parsed = parseDispatchBody(Buffer.from(text));
        assert.ok(parsed.ok);
        assert.equal(new TextDecoder().decode(parsed.request.body), req.body);
      },
    ),
    { numRuns: 300 },
  );
});

test("dispatch body - parse: not JSON, wrong shapes and both bodies get a named 400 reason", () => {
  const bad: [string, RegExp][] = [
    ["{", /^body is not JSON$/],
    ["[1]", /^request: /],
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: [1], body: "x" }), /^recipients\.0: /],
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body: "x", body_b64: "eA==" }), /exactly one of body and body_b64/],
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body_b64: "not base64!" }), /^body_b64: must be base64/],
    // Buffer.from("Q", "base64") is an empty buffer: these appended empty or cut bodies
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body_b64: "Q" }), /^body_b64: must be base64/],
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body_b64: "AAE" }), /^body_b64: must be base64/],
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body_b64: "AA=A" }), /^body_b64: must be base64/],
    // TextEncoder writes U+FFFD for a lone surrogate: the device would get other bytes than were sent
    [`{"dispatch_id":"a","message_id":"b","lane":"c","recipients":["u"],"body":"x\\ud800y"}`, /^body: must be text: it holds a lone UTF-16 surrogate/],
    [`{"dispatch_id":"a","message_id":"b","lane":"c","recipients":["u"],"body":"\\udc00"}`, /^body: must be text/],
    [JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body: "x", extra: 1 }), /^extra: Unrecognized key/], // an unknown field is named
  ];
  for (const [text, re] of bad) {
    const r = parseDispatchBody(Buffer.from(text));
    assert.ok(!r.ok, text);
    assert.match(r.error, re, text);
  }
  const b64 = parseDispatchBody(Buffer.from(JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body_b64: "AAEC" })));
  assert.ok(b64.ok);
  assert.deepEqual([...b64.request.body], [0, 1, 2]);
  for (const [text, bytes] of [["", []], ["AA==", [0]], ["AAE=", [0, 1]]] as const) {
    const r = parseDispatchBody(Buffer.from(JSON.stringify({ dispatch_id: "a", message_id: "b", lane: "c", recipients: ["u"], body_b64: text })));
    assert.ok(r.ok, text);
    assert.deepEqual([...r.request.body], bytes);
  }
  // a pair is text: an emoji stays what it was
  const pair = parseDispatchBody(Buffer.from(`{"dispatch_id":"a","message_id":"b","lane":"c","recipients":["u"],"body":"\\ud83d\\ude00"}`));
  assert.ok(pair.ok);
  assert.equal(new TextDecoder().decode(pair.request.body), "\u{1F600}");
});

test("dispatch body - the batch shape: 1000 dispatches, 10,000 recipients over all of them, four levels deep", () => {
  const feed = (text: string) => new DispatchShapeGuard(BATCH_SHAPE).feed(Buffer.from(text));
  const one = (n: number) => JSON.stringify({ dispatch_id: "d", message_id: "m", lane: "l", recipients: Array.from({ length: n }, (_, i) => `u${i}`), body: "[{,}]" });
  assert.equal(feed(`{"dispatches":[${Array.from({ length: 1000 }, () => one(10)).join(",")}]}`), undefined);
  assert.equal(feed(`{"dispatches":[${Array.from({ length: 2 }, () => one(5000)).join(",")}]}`), undefined);
  assert.match(feed(`{"dispatches":[${Array.from({ length: 1001 }, () => one(1)).join(",")}]}`)!, /^dispatches: at most 1000 dispatches in a batch$/);
  assert.match(feed(`{"dispatches":[${Array.from({ length: 3 }, () => one(4000)).join(",")}]}`)!, /^dispatches: at most 10000 recipients in a batch/);
  assert.match(feed(`{"dispatches":[{"recipients":[["x"]]}]}`)!, /^request: nested deeper than 4 levels$/);
  // a single request is still held to two levels
  assert.match(new DispatchShapeGuard().feed(Buffer.from(`{"dispatches":[{}]}`))!, /nested deeper than 2 levels/);
  const parsed = parseDispatchBatch(Buffer.from(`{"dispatches":[${one(2)},${one(3)}]}`));
  assert.ok(parsed.ok);
  assert.deepEqual(parsed.requests.map((r) => r.recipients.length), [2, 3]);
  const bad = parseDispatchBatch(Buffer.from(`{"dispatches":[${one(2)},{"dispatch_id":"a.b"}]}`));
  assert.ok(!bad.ok);
  assert.match(bad.error, /^dispatches\.1\./);
});
