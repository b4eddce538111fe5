import { test } from "node:test";
import assert from "node:assert/strict";
import { acceptDecision, capacityPlan, fileReserve, pauseMargin } from "../../gateway/http/capacity.js";
import { AcceptGuard } from "../../gateway/http/accept-guard.js";
import { ManualClock } from "../harness/manual-clock.js";

test("capacity - the reserve: a tenth of the limit, at least 64, at most 1,024", () => {
  assert.equal(fileReserve(400), 64);
  assert.equal(fileReserve(4096), 409);
  assert.equal(fileReserve(20_000), 1024);
  assert.equal(fileReserve(1_048_576), 1024);
});

test("capacity - devices taken at once: the limit less the files open at start and the reserve, or JETGATE_MAX_CONNECTIONS below that", () => {
  assert.deepEqual(capacityPlan(20_000, 50, 0), { limit: 20_000, baseline: 50, reserve: 1024, maxConnections: 18_926 });
  assert.equal(capacityPlan(20_000, 50, 5000).maxConnections, 5000);
  assert.equal(capacityPlan(20_000, 50, 18_926).clamped, undefined);
  const over = capacityPlan(20_000, 50, 100_000);
  assert.equal(over.maxConnections, 18_926);
  assert.match(over.clamped!, /^JETGATE_MAX_CONNECTIONS 100000 is above what 20000 open files allow \(18926: 50 open at start, 1024 kept back\); taking 18926: raise the limit \(ulimit -n\)/);
  // a limit below what is already open still takes one device, never zero or less
  assert.equal(capacityPlan(64, 100, 0).maxConnections, 1);
});

test("capacity - the listener pauses within the margin of the limit (or when the files cannot even be counted), resumes once half the reserve is free", () => {
  const limit = 4096;
  const reserve = fileReserve(limit);
  const margin = pauseMargin(reserve);
  assert.equal(margin, 102);
  assert.equal(acceptDecision(limit - margin - 1, limit, reserve, false), "keep");
  assert.equal(acceptDecision(limit - margin, limit, reserve, false), "pause");
  assert.equal(acceptDecision(undefined, limit, reserve, false), "pause");
  // paused: not back before half the reserve is free (no flapping at the edge)
  assert.equal(acceptDecision(limit - margin - 1, limit, reserve, true), "keep");
  assert.equal(acceptDecision(undefined, limit, reserve, true), "keep");
  assert.equal(acceptDecision(limit - Math.floor(reserve / 2), limit, reserve, true), "resume");
  assert.equal(pauseMargin(64), 16);
});

test("accept guard - counts the files at most every 50 times the count's cost (10 while paused, at most 5 s apart), pauses and resumes the listener once each", () => {
  const manual = new ManualClock();
  /** What the counts have cost so far: time that passes on the monotonic clock without firing timers. */
  let spent = 0;
  const clock = Object.assign(Object.create(manual) as ManualClock, { monotonic: () => manual.monotonic() + spent });
  let open = 100;
  let counts = 0;
  /** What a count costs, in ms. */
  let cost = 0;
  const events: string[] = [];
  const plan = capacityPlan(1000, 50, 0);
  const guard = new AcceptGuard(plan, {
    openFiles: () => {
      counts++;
      spent += cost;
      return open;
    },
    pause: () => events.push("pause"),
    resume: () => events.push("resume"),
    changed: (paused, n) => events.push(`${paused ? "paused" : "resumed"} at ${n}`),
  }, clock).start();
  manual.advance(1000);
  assert.equal(counts, 4, "cheap counts: every 250 ms");
  cost = 40;
  counts = 0;
  manual.advance(10_000);
  assert.equal(counts, 5, "a 40 ms count: every 2 s (50 times its cost)");
  cost = 400;
  counts = 0;
  manual.advance(20_000);
  assert.ok(counts >= 4 && counts <= 5, `a 400 ms count: at most 5 s apart (${counts} in 20 s)`);
  cost = 0;
  manual.advance(5000);
  open = plan.limit - pauseMargin(plan.reserve);
  manual.advance(300);
  assert.deepEqual(events, ["pause", `paused at ${open}`]);
  assert.equal(guard.accepting, false);
  cost = 40;
  counts = 0;
  manual.advance(4000);
  assert.ok(counts >= 7 && counts <= 10, `paused, a 40 ms count: every 400 ms, on the 250 ms ticks (10 times its cost; ${counts} in 4 s)`);
  cost = 0;
  manual.advance(5000);
  open = plan.limit - Math.floor(plan.reserve / 2);
  manual.advance(300);
  assert.deepEqual(events.slice(2), ["resume", `resumed at ${open}`]);
  assert.equal(guard.accepting, true);
  guard.stop();
  assert.equal(manual.pending, 0);
});
