import { test } from "node:test";
import assert from "node:assert/strict";
import { Redis } from "ioredis";
import { GATEWAY_LIVENESS, REDIS_SCRIPTS } from "../../protocol/index.js";
import { scripted } from "../../protocol/io/index.js";

test("scripted: a client made with the scripts gets their typed calls; one made without is refused by name", () => {
  const withScripts = new Redis({ lazyConnect: true, scripts: { ...REDIS_SCRIPTS } });
  const bare = new Redis({ lazyConnect: true });
  try {
    const r = scripted(withScripts);
    for (const name of Object.keys(REDIS_SCRIPTS)) assert.equal(typeof (r as unknown as Record<string, unknown>)[name], "function", name);
    assert.throws(() => scripted(bare), (err: Error) => err instanceof TypeError && /lacks the jgApplyBatch script: make it with connectRedis/.test(err.message));
  } finally {
    withScripts.disconnect();
    bare.disconnect();
  }
});

test("gateway liveness: each figure well inside the next, so a gateway that beats is never silent to a worker", () => {
  const { beatEveryMs, reregisterAfterMs, liveWithinS, silentAfterS } = GATEWAY_LIVENESS;
  assert.ok(beatEveryMs * 3 <= liveWithinS * 1000, "live: several beats may be missed");
  assert.ok(liveWithinS * 1000 < reregisterAfterMs, "a gateway re-registers only after it stopped counting as live");
  assert.ok(reregisterAfterMs * 2 <= silentAfterS * 1000, "it re-registers well before workers drop its routes");
});
