import { test } from "node:test";
import assert from "node:assert/strict";
import { GATEWAY_LIVENESS } from "../../protocol/index.js";
import { GatewayRoster, answeredOf, type Gathered } from "../../gateway/http/roster.js";

const LIVE_MS = GATEWAY_LIVENESS.liveWithinS * 1000;

test("roster - this gateway is always there; others while heard within the liveness window, by the roster's own clock", () => {
  const r = new GatewayRoster("me", 1000);
  assert.deepEqual([...r.live(1000)], ["me"]);
  r.heardFrom("a", 2000);
  r.heardFrom("b", 2500);
  assert.deepEqual([...r.live(2000 + LIVE_MS)].sort(), ["a", "b", "me"]);
  assert.deepEqual([...r.live(2001 + LIVE_MS)].sort(), ["b", "me"], "a fell silent");
  r.heardFrom("a", 9000);
  assert.deepEqual([...r.live(9000)].sort(), ["a", "me"], "a heard again is back; b, silent since 2500, is not");
});

test("roster - warm only after two beats' time: before that a gateway may not have heard everyone", () => {
  const r = new GatewayRoster("me", 5000);
  assert.equal(r.warm(5000 + 2 * GATEWAY_LIVENESS.beatEveryMs - 1), false);
  assert.equal(r.warm(5000 + 2 * GATEWAY_LIVENESS.beatEveryMs), true);
});

const gathered = (expected: string[], answered: string[], redisKnown = true): Gathered => ({
  expected: new Set(expected),
  replies: answered.map((gateway) => ({ gateway })),
  redisKnown,
});

test("roster - an answer is whole only when every gateway there was to ask answered, Redis's set was read and the roster is warm", () => {
  assert.deepEqual(answeredOf(gathered(["a", "b"], ["a", "b"]), true), { answered: 2, live: 2, partial: false });
  assert.deepEqual(answeredOf(gathered(["a", "b"], ["a"]), true), { answered: 1, live: 2, partial: true }, "one did not answer");
  assert.deepEqual(answeredOf(gathered(["a", "b"], ["a", "b"], false), true), { answered: 2, live: 2, partial: true }, "Redis did not say");
  assert.deepEqual(answeredOf(gathered(["a", "b"], ["a", "b"]), false), { answered: 2, live: 2, partial: true }, "not warm yet");
  assert.deepEqual(answeredOf(gathered(["a"], ["a", "c"]), true), { answered: 2, live: 1, partial: false }, "one nobody expected answered too: counted, nothing missing");
});
