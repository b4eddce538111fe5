/** The gateway's session timers: near delays on Node timers, far ones on one wheel (gateway/session/coarse-timers.ts). */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Clock } from "../../protocol/index.js";
import { CoarseTimers, WHEEL_AFTER_MS } from "../../gateway/session/coarse-timers.js";
import { SessionClock, type Deadline } from "../../gateway/session/clock.js";
import { ManualTimers } from "../harness/session-fakes.js";

const T0 = 1_700_000_000_250; // not on a whole second


/** A clock that does what `c` does, for a test to change one of its methods. */
function delegate(c: Clock): Clock {
  return {
    now: () => c.now(),
    monotonic: () => c.monotonic(),
    setTimeout: c.setTimeout.bind(c) as Clock["setTimeout"],
    clearTimeout: (h) => c.clearTimeout(h),
    setInterval: (f, ms) => c.setInterval(f, ms),
    clearInterval: (h) => c.clearInterval(h),
  };
}

test("coarse timers - a near delay is a timer of its own; far ones wait on one wheel, called at the start of their second", () => {
  const near = new ManualTimers(T0);
  const wheel = new CoarseTimers(near);
  const calls: [string, number][] = [];
  const at = (name: string) => () => void calls.push([name, near.now() - T0]);
  wheel.setTimeout(at("ack"), 1000, undefined);
  assert.equal(near.armed, 1, "the near delay is the near timers'");
  const delays = [WHEEL_AFTER_MS, 3_600_000, 3_600_000 + 500, 3_600_000 + 999, 7_200_000];
  delays.forEach((ms, i) => wheel.setTimeout(at(`far${i}`), ms, undefined));
  assert.equal(wheel.waiting, 5);
  assert.equal(near.armed, 2, "the five far delays share one timer: the wheel's");
  near.advance(7_200_000);
  const told = new Map(calls);
  assert.equal(told.get("ack"), 1000);
  delays.forEach((ms, i) => {
    const got = told.get(`far${i}`)!;
    assert.ok(got <= ms && got > ms - 1000, `far${i} (${ms} ms): called at ${got}, within the second before`);
    assert.equal((T0 + got) % 1000, 0, `far${i}: at the start of a second`);
  });
  assert.equal(wheel.waiting, 0);
  assert.equal(near.armed, 0, "an empty wheel arms nothing");
});

test("coarse timers - a cleared entry is never called; a near one is cleared on the near timers", () => {
  const near = new ManualTimers(T0);
  const wheel = new CoarseTimers(near);
  const calls: string[] = [];
  const a = wheel.setTimeout((n: string) => void calls.push(n), 120_000, "a");
  wheel.setTimeout((n: string) => void calls.push(n), 120_000, "b");
  const c = wheel.setTimeout((n: string) => void calls.push(n), 10, "c");
  wheel.clearTimeout(a);
  wheel.clearTimeout(c);
  wheel.clearTimeout(a); // twice: nothing
  assert.equal(wheel.waiting, 1);
  near.advance(200_000);
  assert.deepEqual(calls, ["b"]);
});

test("coarse timers - one entry that throws stops none of the others; the error still surfaces", () => {
  const near = new ManualTimers(T0);
  const wheel = new CoarseTimers(near);
  const calls: number[] = [];
  wheel.setTimeout(() => void calls.push(1), 90_000, undefined);
  wheel.setTimeout(() => {
    throw new Error("boom");
  }, 90_000, undefined);
  wheel.setTimeout(() => void calls.push(3), 90_000, undefined);
  wheel.setTimeout(() => void calls.push(4), 150_000, undefined);
  assert.throws(() => near.advance(90_000), /boom/);
  assert.deepEqual(calls, [1, 3]);
  near.advance(60_000);
  assert.deepEqual(calls, [1, 3, 4], "the wheel turns on after the throw");
});

test("coarse timers - a session's token expiry on the wheel is still told at its exact time, and a thousand idle sessions hold one timer", () => {
  const near = new ManualTimers(T0);
  const wheel = new CoarseTimers(near);
  const told: [number, Deadline, number][] = [];
  const clocks = Array.from({ length: 1000 }, (_, i) => new SessionClock({ onDeadline: (k) => void told.push([i, k, near.now() - T0]) }, wheel));
  clocks.forEach((c, i) => c.set("expiry", T0 + 3_600_000 + i * 7));
  assert.equal(near.armed, 1, "one timer for every idle session's expiry");
  assert.equal(wheel.waiting, 1000);
  near.advance(3_600_000 + 7 * 1000);
  assert.equal(told.length, 1000);
  for (const [i, kind, at] of told) {
    assert.equal(kind, "expiry");
    assert.equal(at, 3_600_000 + i * 7, `session ${i}: told to the millisecond`);
  }
});

test("coarse timers - an entry cleared by one called before it in the same turn is not called", () => {
  const near = new ManualTimers(T0);
  const wheel = new CoarseTimers(near);
  const calls: string[] = [];
  const handles: { second?: unknown } = {};
  wheel.setTimeout(() => (calls.push("first"), wheel.clearTimeout(handles.second)), 90_000, undefined);
  handles.second = wheel.setTimeout(() => void calls.push("second"), 90_000, undefined);
  near.advance(91_000);
  assert.deepEqual(calls, ["first"]);
});

test("coarse timers - a clock that jumps an hour on (a process paused) and back calls everything due, once, in time order", () => {
  const near = new ManualTimers(T0);
  let jump = 0;
  const jumpy: Clock = { ...delegate(near), now: () => near.now() + jump };
  const wheel = new CoarseTimers(jumpy);
  const calls: number[] = [];
  for (const [i, ms] of [120_000, 180_000, 7_200_000].entries()) wheel.setTimeout(() => void calls.push(i), ms, undefined);
  jump = 3_600_000; // an hour passes between two turns
  near.advance(1000);
  assert.deepEqual(calls, [0, 1], "the two due within the hour, not the one due later");
  jump = 0; // and back: nothing is lost or called twice, and a new entry is not held behind the hour
  wheel.setTimeout(() => void calls.push(3), 60_000, undefined);
  near.advance(61_000);
  assert.deepEqual(calls, [0, 1, 3]);
  near.advance(7_300_000);
  assert.deepEqual(calls, [0, 1, 3, 2]);
});
