/**
 * The one clock (protocol/clock.ts): the system's reads the runtime's time and timers; the manual
 * one (test/harness/manual-clock.ts) that tests step fires what falls due in time order.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { sleep, systemClock } from "../../protocol/index.js";
import { ManualClock } from "../harness/manual-clock.js";

test("system clock - now is wall time (within a second of Date.now), monotonic only grows", async () => {
  assert.ok(Math.abs(systemClock.now() - Date.now()) < 1000, `now ${systemClock.now()}, Date.now ${Date.now()}`);
  const a = systemClock.monotonic();
  await sleep(systemClock, 5);
  const b = systemClock.monotonic();
  assert.ok(b - a >= 4, `monotonic moved ${b - a} ms over a 5 ms sleep`);
});

test("system clock - setTimeout passes its arg; a cleared timeout or interval never fires", async () => {
  const got = await new Promise<string>((resolve) => systemClock.setTimeout((v: string) => resolve(v), 1, "the arg"));
  assert.equal(got, "the arg");
  const fired: string[] = [];
  const t = systemClock.setTimeout(() => void fired.push("timeout"), 5);
  const i = systemClock.setInterval(() => void fired.push("interval"), 5);
  systemClock.clearTimeout(t);
  systemClock.clearInterval(i);
  systemClock.clearTimeout(undefined);
  await sleep(systemClock, 30);
  assert.deepEqual(fired, []);
});

test("system clock - an interval fires until cleared", async () => {
  let n = 0;
  const i = systemClock.setInterval(() => n++, 2);
  await new Promise<void>((resolve) => {
    const poll = () => (n >= 3 ? resolve() : systemClock.setTimeout(poll, 2));
    poll();
  });
  systemClock.clearInterval(i);
  const at = n;
  await sleep(systemClock, 20);
  assert.equal(n, at, "nothing after the clear");
});

test("manual clock - time moves only on advance; two timeouts fire in time order, each at its own time", () => {
  const clock = new ManualClock(1_000_000);
  const log: string[] = [];
  clock.setTimeout((name: string) => void log.push(`${name} ${clock.monotonic()}`), 30, "late");
  clock.setTimeout((name: string) => void log.push(`${name} ${clock.monotonic()}`), 10, "early");
  clock.setTimeout(() => void log.push(`same time, armed last ${clock.monotonic()}`), 30);
  assert.equal(clock.now(), 1_000_000);
  assert.equal(clock.monotonic(), 0);
  clock.advance(9);
  assert.deepEqual(log, []);
  clock.advance(100);
  assert.deepEqual(log, ["early 10", "late 30", "same time, armed last 30"]);
  assert.equal(clock.now(), 1_000_109);
  assert.equal(clock.monotonic(), 109);
  assert.equal(clock.pending, 0);
});

test("manual clock - an interval fires k times over k periods, at each period's end", () => {
  const clock = new ManualClock();
  const at: number[] = [];
  const i = clock.setInterval(() => void at.push(clock.monotonic()), 1000);
  clock.advance(999);
  assert.deepEqual(at, []);
  clock.advance(4001);
  assert.deepEqual(at, [1000, 2000, 3000, 4000, 5000]);
  clock.clearInterval(i);
  clock.advance(10_000);
  assert.equal(at.length, 5);
  assert.equal(clock.pending, 0);
});

test("manual clock - a timeout armed by a callback and due within the advance fires within it, in order with the rest", () => {
  const clock = new ManualClock();
  const log: string[] = [];
  clock.setTimeout(() => {
    log.push(`first ${clock.monotonic()}`);
    clock.setTimeout(() => void log.push(`armed by first ${clock.monotonic()}`), 15);
  }, 10);
  clock.setTimeout(() => void log.push(`second ${clock.monotonic()}`), 20);
  clock.setTimeout(() => void log.push(`third ${clock.monotonic()}`), 30);
  clock.advance(50);
  assert.deepEqual(log, ["first 10", "second 20", "armed by first 25", "third 30"]);
});

test("manual clock - clear cancels a timeout, an interval, itself from its own callback; an unknown handle is ignored", () => {
  const clock = new ManualClock();
  const fired: string[] = [];
  const t = clock.setTimeout(() => void fired.push("timeout"), 10);
  clock.clearTimeout(t);
  clock.clearTimeout(undefined);
  let n = 0;
  const i = clock.setInterval(() => {
    fired.push(`interval ${++n}`);
    if (n === 2) clock.clearInterval(i);
  }, 10);
  clock.advance(100);
  assert.deepEqual(fired, ["interval 1", "interval 2"]);
  assert.equal(clock.pending, 0);
});

test("manual clock - sleep resolves once the clock is stepped past it", async () => {
  const clock = new ManualClock();
  let woke = false;
  const p = sleep(clock, 100).then(() => (woke = true));
  clock.advance(99);
  await Promise.resolve();
  assert.equal(woke, false);
  clock.advance(1);
  await p;
  assert.equal(woke, true);
});
