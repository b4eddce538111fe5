import { test } from "node:test";
import assert from "node:assert/strict";
import { Redis } from "ioredis";
import { REDIS_SCRIPTS } from "../../protocol/index.js";
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
