import { test } from "node:test";
import assert from "node:assert/strict";
import {
  kickSubject, frozenSubject, entrySubject, routedPushSubject, BROADCAST_PUSH_SUBJECT, ALL_PUSH_SUBJECTS, OPS_STATS_SUBJECT, ingressSubject, shardStream, userSubjects, parseEntrySubject, entryMsgId, ingressMsgId,
  InvalidIdError, InvalidShardError, assertId,
} from "../../protocol/index.js";

test("subjects - builders produce the documented names", () => {
  assert.equal(entrySubject(3, "alice", "chat"), "mbx.3.alice.chat");
  assert.equal(userSubjects(3, "alice"), "mbx.3.alice.*");
  assert.equal(routedPushSubject("gw-1"), "jetgate.push.gw.gw-1");
  assert.equal(BROADCAST_PUSH_SUBJECT, "jetgate.push.any", "one token fewer than any gateway's subject");
  assert.equal(kickSubject("gw-1"), "jetgate.kick.gw-1");
  assert.equal(ALL_PUSH_SUBJECTS, "jetgate.push.>", "covers routed and broadcast pushes");
  assert.equal(OPS_STATS_SUBJECT, "jetgate.ops.stats", "the name docs/examples/nats-permissions.conf keeps to jetgate's user");
  assert.equal(frozenSubject(7), "jetgate.frozen.7");
  assert.throws(() => kickSubject("a.b"), /gateway id/);
  assert.equal(ingressSubject("alice", "phone-1"), "in.alice.phone-1");
  assert.equal(shardStream(12), "MBX_12");
  assert.equal(entryMsgId("d-1", "alice"), "d-1:alice");
  assert.equal(ingressMsgId("alice", "phone-1", "c9"), "alice:phone-1:c9");
  assert.deepEqual(parseEntrySubject("mbx.3.alice.chat"), { shard: 3, user: "alice", lane: "chat" });
  assert.equal(parseEntrySubject("mbx.x.alice.chat"), undefined);
  assert.equal(parseEntrySubject("push.alice"), undefined);
});

test("subjects - unsafe ids never become subjects", () => {
  for (const bad of ["a.b", "a*", "a>", "a b", "", "x".repeat(65), "é", "a\nb"]) {
    assert.throws(() => routedPushSubject(bad), (e: unknown) => e instanceof InvalidIdError && e.kind === "gateway", JSON.stringify(bad));
    assert.throws(() => ingressSubject(bad, "d"), (e: unknown) => e instanceof InvalidIdError && e.kind === "user", JSON.stringify(bad));
    assert.throws(() => ingressSubject("ok", bad), (e: unknown) => e instanceof InvalidIdError && e.kind === "device");
    assert.throws(() => entrySubject(1, "ok", bad), (e: unknown) => e instanceof InvalidIdError && e.kind === "lane");
  }
  assert.throws(() => assertId("lane", "l".repeat(33)), /at most 32/);
  for (const bad of [-1, 1.5, 2 ** 32, Number.NaN, "1"]) {
    assert.throws(() => shardStream(bad as number), InvalidShardError, String(bad));
  }
});
