/** A session's one timer (SessionClock): its deadlines told at their time, in order, on one armed timeout. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { systemClock } from "../../protocol/index.js";
import { MAX_DELAY_MS, SessionClock, type Deadline } from "../../gateway/session/clock.js";
import type { TimerPort } from "../../gateway/ports.js";
import { ManualTimers } from "../harness/session-fakes.js";

const T0 = 1_700_000_000_000;

function rig(onDeadline: (kind: Deadline, clock: SessionClock) => void = () => undefined) {
  const timers = new ManualTimers(T0);
  const told: [Deadline, number][] = [];
  const owner = {
    onDeadline(kind: Deadline) {
      told.push([kind, timers.now() - T0]);
      onDeadline(kind, clock);
    },
  };
  const clock = new SessionClock(owner, timers);
  return { timers, told, clock };
}

test("session clock - each deadline is told once, at its time, in time order; never more than one timer armed", () => {
  const { timers, told, clock } = rig();
  clock.set("expiry", T0 + 3000);
  clock.set("auth", T0 + 1000);
  clock.set("ack", T0 + 2000);
  assert.equal(timers.armed, 1);
  assert.deepEqual(timers.delays, [3000, 1000], "moved to the earlier AUTH deadline; the ACK's is later: not moved");
  timers.advance(999);
  assert.deepEqual(told, []);
  timers.advance(5000);
  assert.deepEqual(told, [["auth", 1000], ["ack", 2000], ["expiry", 3000]]);
  assert.equal(timers.armed, 0, "nothing left: no timer");
});

test("session clock - deadlines moved, cleared and stopped: the timer follows the earliest", () => {
  const table: { name: string; steps: (c: SessionClock) => void; want: [Deadline, number][]; armed: number }[] = [
    { name: "moved later (a REFRESH)", steps: (c) => (c.set("expiry", T0 + 1000), c.set("expiry", T0 + 5000)), want: [["expiry", 5000]], armed: 0 },
    { name: "moved earlier", steps: (c) => (c.set("expiry", T0 + 5000), c.set("expiry", T0 + 1000)), want: [["expiry", 1000]], armed: 0 },
    { name: "cleared (AUTH done)", steps: (c) => (c.set("auth", T0 + 1000), c.set("expiry", T0 + 4000), c.clear("auth")), want: [["expiry", 4000]], armed: 0 },
    { name: "cleared, the only one", steps: (c) => (c.set("auth", T0 + 1000), c.clear("auth")), want: [], armed: 0 },
    { name: "stopped (the session closed)", steps: (c) => (c.set("auth", T0 + 1000), c.set("ack", T0 + 500), c.stop()), want: [], armed: 0 },
    { name: "due at once: AUTH, then expiry, then ACK", steps: (c) => (c.set("ack", T0 + 100), c.set("expiry", T0 + 100), c.set("auth", T0 + 100)), want: [["auth", 100], ["expiry", 100], ["ack", 100]], armed: 0 },
    { name: "already past: told on the next turn, not at once", steps: (c) => c.set("expiry", T0 - 5), want: [["expiry", 1]], armed: 0 },
  ];
  for (const row of table) {
    const { timers, told, clock } = rig();
    row.steps(clock);
    assert.ok(timers.armed <= 1, `${row.name}: one timer at most`);
    assert.deepEqual(told, [], `${row.name}: nothing told while setting`);
    timers.advance(10_000);
    assert.deepEqual(told, row.want, row.name);
    assert.equal(timers.armed, row.armed, row.name);
  }
});

test("session clock - isSet says whether a deadline is pending; a deadline told is unset before it is told", () => {
  const seen: boolean[] = [];
  const { timers, clock } = rig((kind, c) => void seen.push(c.isSet(kind)));
  assert.equal(clock.isSet("ack"), false);
  clock.set("ack", T0 + 1000);
  assert.equal(clock.isSet("ack"), true);
  timers.advance(1000);
  assert.deepEqual(seen, [false]);
  assert.equal(clock.isSet("ack"), false);
});

test("session clock - a deadline set again while told (the next ACK flush) is armed after", () => {
  let flushes = 0;
  const { timers, told, clock } = rig((kind, c) => {
    if (kind === "ack" && ++flushes < 3) c.set("ack", c.now + 1000);
  });
  clock.set("ack", T0 + 1000);
  timers.advance(10_000);
  assert.deepEqual(told, [["ack", 1000], ["ack", 2000], ["ack", 3000]]);
  assert.equal(timers.armed, 0);
});

test("session clock - a deadline past Node's longest timeout is armed in steps and told at its time, not at once", () => {
  const { timers, told, clock } = rig();
  const far = 30 * 86_400_000; // a token valid for 30 days
  clock.set("expiry", T0 + far);
  assert.ok(timers.delays.every((d) => d <= MAX_DELAY_MS), `delays ${timers.delays.join(",")}`);
  timers.advance(MAX_DELAY_MS);
  assert.deepEqual(told, [], "woken early, told nothing");
  assert.equal(timers.armed, 1, "armed again for the rest");
  timers.advance(far - MAX_DELAY_MS - 1);
  assert.deepEqual(told, []);
  timers.advance(1);
  assert.deepEqual(told, [["expiry", far]]);
});

test("session clock - a far deadline (a token's expiry) is armed to the millisecond; a timer that wakes early is armed again for the rest", () => {
  const { timers, told, clock } = rig();
  const at = 3_600_000 + 1234;
  clock.set("expiry", T0 + at);
  assert.deepEqual(timers.delays, [at]);
  clock.set("ack", T0 + 1001);
  clock.clear("ack");
  assert.deepEqual(timers.delays, [at, 1001, at], "near deadlines too, and back to the far one");
  timers.advance(at - 1);
  assert.deepEqual(told, []);
  timers.advance(1);
  assert.deepEqual(told, [["expiry", at]]);
});

test("session clock - a timer that fires before the deadline (the wall clock a millisecond behind the timer's) tells nothing and waits for the rest", () => {
  const timers = new ManualTimers(T0);
  let behind = 0;
  const skewed: TimerPort = {
    now: () => timers.now() - behind,
    monotonic: () => timers.monotonic(),
    setTimeout: timers.setTimeout.bind(timers) as TimerPort["setTimeout"],
    clearTimeout: (h) => timers.clearTimeout(h),
    setInterval: (f, ms) => timers.setInterval(f, ms),
    clearInterval: (h) => timers.clearInterval(h),
  };
  const told: [Deadline, number][] = [];
  const clock = new SessionClock({ onDeadline: (k) => void told.push([k, skewed.now() - T0]) }, skewed);
  clock.set("expiry", T0 + 1000);
  behind = 1;
  timers.advance(1000);
  assert.deepEqual(told, [], "the timer ran, the deadline had not passed by the clock");
  assert.equal(timers.armed, 1, "armed again for the rest");
  timers.advance(1);
  assert.deepEqual(told, [["expiry", 1000]]);
});

test("session clock - on the system's timers (node:test's mock timers): told at its time, and nothing after stop", (t) => {
  t.mock.timers.enable({ apis: ["setTimeout", "Date"], now: T0 });
  // the system clock is monotonic (performance.now), which mock timers leave alone: follow the mocked time
  t.mock.method(performance, "now", () => Date.now() - performance.timeOrigin);
  const told: Deadline[] = [];
  const clock = new SessionClock({ onDeadline: (k) => void told.push(k) }, systemClock);
  clock.set("auth", T0 + 600);
  clock.set("expiry", T0 + 1500);
  t.mock.timers.tick(599);
  assert.deepEqual(told, []);
  t.mock.timers.tick(1);
  assert.deepEqual(told, ["auth"]);
  clock.stop();
  t.mock.timers.tick(5000);
  assert.deepEqual(told, ["auth"], "stopped: the expiry is never told");
});

test("session clock - the system's clock never steps: a wall clock set back an hour moves no deadline", (t) => {
  const before = systemClock.now();
  assert.ok(Math.abs(before - Date.now()) < 1000, "it reads as ms since the epoch");
  t.mock.timers.enable({ apis: ["Date"], now: Date.now() - 3_600_000 });
  const after = systemClock.now();
  assert.ok(after >= before && after - before < 1000, `${after - before} ms: not an hour back`);
});
