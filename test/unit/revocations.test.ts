import { test } from "node:test";
import assert from "node:assert/strict";
import { Revocations, parseRevocations, revocationField } from "../../gateway/revocations.js";
import { disconnectFor, ControlReplySchema, DisconnectRequestSchema } from "../../gateway/control.js";
import { CloseCode, reconnectPolicy } from "../../protocol/index.js";

const NOW = 1_800_000_000_000;

test("revocations - a user's revocation covers every device; a device's only that device; iat at or after `before` passes; no iat never does", () => {
  const r = new Revocations();
  r.load([{ user: "ann", before: 1000, expires: NOW + 1 }, { user: "bob", device: "phone", before: 2000, expires: NOW + 1 }], NOW);
  assert.equal(r.loaded, true);
  assert.equal(r.revoked("ann", "phone", 999, NOW), true);
  assert.equal(r.revoked("ann", "tablet", 999, NOW), true);
  assert.equal(r.revoked("ann", "phone", 1000, NOW), false, "issued at `before`: not revoked");
  assert.equal(r.revoked("ann", "phone", undefined, NOW), true, "a token without iat cannot be shown to be newer");
  assert.equal(r.revoked("bob", "phone", 1999, NOW), true);
  assert.equal(r.revoked("bob", "tablet", 1999, NOW), false);
  assert.equal(r.revoked("bob", "tablet", undefined, NOW), false, "no revocation for that device or the user");
  assert.equal(r.revoked("carl", "phone", undefined, NOW), false);
});

test("revocations - the later `before` of two wins, whichever arrives first; expired ones are forgotten", () => {
  const r = new Revocations();
  r.add({ user: "ann", before: 2000, expires: NOW + 10 });
  r.add({ user: "ann", before: 1000, expires: NOW + 20 });
  assert.equal(r.revoked("ann", "d", 1500, NOW), true, "the later before stays");
  r.load([{ user: "ann", before: 500, expires: NOW + 5 }], NOW);
  assert.equal(r.revoked("ann", "d", 1999, NOW), true, "a load merges, never replaces (one heard over NATS may be newer)");
  r.load([], NOW);
  assert.equal(r.revoked("ann", "d", 1999, NOW), true, "Redis lost the hash (a flush): what this gateway knows still applies");
  assert.equal(r.revoked("ann", "d", 1999, NOW + 20), false, "past its expiry it no longer applies");
  r.prune(NOW + 20);
  assert.equal(r.size, 0);
  assert.equal(new Revocations().loaded, false, "not loaded until a read from Redis");
});

test("revocations - the Redis hash: fields and values that do not parse are skipped", () => {
  assert.equal(revocationField("ann"), "u:ann");
  assert.equal(revocationField("ann", "phone"), "d:ann:phone");
  assert.deepEqual(parseRevocations({
    "u:ann": `1000/${NOW}`,
    "d:bob:phone": `2000/${NOW}`,
    "u:a.b": `1/${NOW}`,
    "x:ann": `1/${NOW}`,
    "u:carl": "soon",
    "d:dan": `1/${NOW}`,
  }), [{ user: "ann", before: 1000, expires: NOW }, { user: "bob", device: "phone", before: 2000, expires: NOW }]);
});

test("control - close codes of the two disconnect kinds, and what the SDK does after each", () => {
  assert.deepEqual(disconnectFor("signed_out", undefined), { close: CloseCode.SIGNED_OUT, reason: "signed out" });
  assert.deepEqual(disconnectFor("reconnect", "new token"), { close: CloseCode.RECONNECT_NOW, reason: "new token" });
  assert.equal(reconnectPolicy(CloseCode.SIGNED_OUT), "stop");
  assert.equal(reconnectPolicy(CloseCode.REPLACED), "stop");
  assert.equal(reconnectPolicy(CloseCode.RECONNECT_NOW), "now");
  assert.equal(reconnectPolicy(CloseCode.UNAUTHENTICATED), "backoff");
});

test("control - requests and answers are validated: bad ids, modes and shapes are refused", () => {
  assert.equal(DisconnectRequestSchema.safeParse({ user: "ann", mode: "signed_out" }).success, true);
  for (const bad of [{ user: "a.b", mode: "signed_out" }, { user: "ann", mode: "kick" }, { user: "ann" }, { user: "ann", mode: "reconnect", device: "a b" }]) {
    assert.equal(DisconnectRequestSchema.safeParse(bad).success, false, JSON.stringify(bad));
  }
  assert.equal(ControlReplySchema.safeParse({ gateway: "g", ended: -1 }).success, false);
  assert.equal(ControlReplySchema.safeParse({ gateway: "g", sessions: [{ user: "u", device: "d", since: 1 }] }).success, true);
});
