import { test } from "node:test";
import assert from "node:assert/strict";
import { sharedState, type AdminState } from "../../gateway/http/admin.js";
import { FailedAuthThrottle } from "../../gateway/http/bearer.js";
import { ManualClock } from "../harness/manual-clock.js";

test("admin - wrong-token throttle: a burst, then one attempt per refill, per client; the oldest client forgotten past the bound", () => {
  const t = new FailedAuthThrottle(3, 1 / 6, 2);
  const now = 1_000_000;
  for (let i = 0; i < 3; i++) {
    assert.equal(t.waitS("a", now), 0);
    t.failed("a", now);
  }
  assert.equal(t.waitS("a", now), 6, "the burst spent: one more in 6 s");
  assert.equal(t.waitS("a", now + 3000), 3);
  assert.equal(t.waitS("a", now + 6000), 0);
  assert.equal(t.waitS("b", now), 0, "another address is not held back");
  t.failed("b", now);
  t.failed("c", now); // a third client: "a" is forgotten (bounded memory), and may try again
  assert.equal(t.waitS("a", now), 0);
});

test("admin - the console state is read once per period however many ask; a failed read is not kept", async () => {
  let reads = 0;
  let fail = false;
  const read = async (): Promise<AdminState> => {
    reads++;
    if (fail) throw new Error("down");
    return { at: reads } as unknown as AdminState;
  };
  const clock = new ManualClock();
  const get = sharedState(read, 50, clock);
  const all = await Promise.all(Array.from({ length: 10 }, () => get()));
  assert.equal(reads, 1);
  assert.ok(all.every((s) => s === all[0]));
  clock.advance(60);
  fail = true;
  await assert.rejects(get(), /down/);
  fail = false;
  await get();
  assert.equal(reads, 3, "the failed read was not served again");
});
