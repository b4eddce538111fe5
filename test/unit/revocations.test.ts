import { test } from "node:test";
import assert from "node:assert/strict";
import { SignJWT } from "jose";
import fc from "fast-check";
import {
  MAX_ISSUED_BEFORE_AHEAD_S,
  Revocations,
  defaultIssuedBefore,
  isMetaField,
  issuedBeforeProblem,
  parseRevocation,
  revocationExpiry,
  revocationField,
  type Revocation,
} from "../../gateway/hub/revocations.js";
import { CLOCK_TOLERANCE_S, tokenVerifier } from "../../gateway/jwt.js";
import { fieldHashes } from "../../gateway/hub/revocation-table.js";
import { disconnectFor, ControlReplySchema, DisconnectRequestSchema } from "../../gateway/http/control.js";
import { CloseCode, reconnectPolicy } from "../../protocol/index.js";

const NOW = 1_800_000_000_000;

/** A list as a load leaves it: these added, and loaded. */
function listOf(...rs: Revocation[]): Revocations {
  const r = new Revocations();
  for (const x of rs) r.add(x);
  r.loaded = true;
  return r;
}

test("revocations - a user's revocation covers every device; a device's only that device; iat at or after `before` passes; no iat never does", () => {
  const r = listOf({ user: "ann", before: 1000, expires: NOW + 1 }, { user: "bob", device: "phone", before: 2000, expires: NOW + 1 });
  assert.equal(r.revoked("ann", "phone", 999, NOW), true);
  assert.equal(r.revoked("ann", "tablet", 999, NOW), true);
  assert.equal(r.revoked("ann", "phone", 1000, NOW), false, "issued at `before`: not revoked");
  assert.equal(r.revoked("ann", "phone", undefined, NOW), true, "a token without iat cannot be shown to be newer");
  assert.equal(r.revoked("bob", "phone", 1999, NOW), true);
  assert.equal(r.revoked("bob", "tablet", 1999, NOW), false);
  assert.equal(r.revoked("bob", "tablet", undefined, NOW), false, "no revocation for that device or the user");
  assert.equal(r.revoked("carl", "phone", undefined, NOW), false);
});

test("revocations - the later `before` and the later expiry of two win, whichever arrives first; expired ones are forgotten", () => {
  const r = listOf({ user: "ann", before: 2000, expires: NOW + 10 }, { user: "ann", before: 1000, expires: NOW + 20 });
  assert.equal(r.revoked("ann", "d", 1500, NOW), true, "the later before stays");
  r.add({ user: "ann", before: 500, expires: NOW + 5 });
  assert.equal(r.revoked("ann", "d", 1999, NOW + 15), true, "an older one read later (a load merges, never replaces: one heard over NATS may be newer)");
  assert.equal(r.prune(NOW + 15), false);
  assert.equal(r.size, 1, "the earlier expiry left behind in the queue does not forget the field");
  assert.equal(r.revoked("ann", "d", 1999, NOW + 20), false, "past its expiry it no longer applies");
  r.prune(NOW + 20);
  assert.equal(r.size, 0);
  assert.equal(new Revocations().loaded, false, "not loaded until a read from Redis");
});

test("revocations - prune forgets at most `max` per call and says whether more are due; property: the same as forgetting every expired one", () => {
  const r = listOf(...Array.from({ length: 12 }, (_, i) => ({ user: `u${i}`, before: 1, expires: NOW + i })));
  assert.equal(r.prune(NOW + 9, 4), true);
  assert.equal(r.size, 8);
  assert.equal(r.prune(NOW + 9, 4), true);
  assert.equal(r.prune(NOW + 9, 4), false, "the tenth was the last due");
  assert.equal(r.size, 2);
  // adds and prunes interleaved: a field forgotten and added again, a slot used again, times left behind in the queue
  type Op = { add: Revocation } | { pruneAt: number; max: number };
  const op = fc.oneof(
    fc.record({ add: fc.record({ user: fc.constantFrom("a", "b", "c", "d"), before: fc.nat(5), expires: fc.integer({ min: 0, max: 200 }) }) }),
    fc.record({ pruneAt: fc.integer({ min: 0, max: 200 }), max: fc.integer({ min: 1, max: 3 }) }),
  );
  fc.assert(fc.property(fc.array(op, { maxLength: 60 }), (ops: Op[]) => {
    const list = listOf();
    const model = new Map<string, { before: number; expires: number }>();
    let at = 0;
    for (const o of ops) {
      if ("add" in o) {
        const had = model.get(o.add.user);
        model.set(o.add.user, { before: Math.max(had?.before ?? 0, o.add.before), expires: Math.max(had?.expires ?? 0, o.add.expires) });
        list.add(o.add);
      } else {
        at = Math.max(at, o.pruneAt);
        while (list.prune(at, o.max));
        for (const [u, m] of model) if (m.expires <= at) model.delete(u);
        assert.equal(list.size, model.size);
      }
      for (const [u, m] of model) {
        if (m.expires <= at) continue;
        assert.equal(list.revoked(u, undefined, m.before - 1, at), true, `${u} covers iat ${m.before - 1}`);
        assert.equal(list.revoked(u, undefined, m.before, at), false, `${u} does not cover iat ${m.before}`);
      }
    }
  }), { numRuns: 300 });
});

test("revocations - thousands held, forgotten and added again (the list grows and reuses its room)", () => {
  const list = listOf();
  for (let i = 0; i < 5000; i++) list.add({ user: `u${i}`, before: 10, expires: i < 2500 ? NOW : NOW + 10 });
  assert.equal(list.size, 5000);
  list.prune(NOW);
  assert.equal(list.size, 2500);
  for (let i = 0; i < 2500; i++) list.add({ user: `v${i}`, device: "d", before: 20, expires: NOW + 20 });
  assert.equal(list.size, 5000);
  for (let i = 0; i < 2500; i++) {
    assert.equal(list.revoked(`u${i}`, "d", 9, NOW), false, "forgotten");
    assert.equal(list.revoked(`u${2500 + i}`, "d", 9, NOW), true);
    assert.equal(list.revoked(`v${i}`, "d", 19, NOW + 15), true);
    assert.equal(list.revoked(`v${i}`, "e", 19, NOW + 15), false, "another device");
  }
});

test("revocations - two fields whose first hash collides (one chain) are held, checked and forgotten apart", () => {
  const seen = new Map<number, string>();
  let pair: [string, string] | undefined;
  for (let i = 0; pair === undefined; i++) {
    const f = `u:c${i}`;
    const h1 = fieldHashes(f)[0];
    const other = seen.get(h1);
    if (other !== undefined) pair = [other, f];
    seen.set(h1, f);
  }
  const [a, b] = pair.map((f) => f.slice(2)) as [string, string];
  assert.notEqual(fieldHashes(`u:${a}`)[1], fieldHashes(`u:${b}`)[1], "the second hash tells them apart");
  for (const firstGoes of [a, b]) {
    const list = listOf({ user: a, before: 10, expires: NOW + 1 }, { user: b, before: 20, expires: NOW + 2 });
    assert.equal(list.size, 2);
    assert.deepEqual([list.revoked(a, undefined, 15, NOW), list.revoked(b, undefined, 15, NOW)], [false, true]);
    list.add({ user: firstGoes === a ? b : a, before: 1, expires: NOW + 3 }); // the other outlives it
    list.prune(firstGoes === a ? NOW + 1 : NOW + 2);
    const other = firstGoes === a ? b : a;
    assert.deepEqual([list.size, list.revoked(firstGoes, undefined, 0, NOW + 2), list.revoked(other, undefined, 0, NOW + 2)], [1, false, true], `${firstGoes} forgotten first`);
    list.add({ user: firstGoes, before: 5, expires: NOW + 10 });
    assert.deepEqual([list.size, list.revoked(firstGoes, undefined, 4, NOW + 2), list.revoked(other, undefined, 4, NOW + 2)], [2, true, true], "added again");
  }
});

test("revocations - kept while the verifier can accept a token it covers: max lifetime 60 s, a token issued 1 s before issued_before with exp - iat = 65 s, and one without iat", async () => {
  const MAX = 60;
  const secret = new TextEncoder().encode("s");
  let clock = 0;
  const verifier = await tokenVerifier({ secret: "s", maxLifetimeS: MAX, now: () => clock });
  const sign = (iat: number | undefined, exp: number) => {
    const t = new SignJWT({}).setProtectedHeader({ alg: "HS256" }).setSubject("ann").setExpirationTime(exp);
    return (iat === undefined ? t : t.setIssuedAt(iat)).sign(secret);
  };
  // where in its second the call lands, and an issued_before a minute back
  for (const [callAt, givenBefore] of [[NOW, undefined], [NOW + 1, undefined], [NOW + 999, undefined], [NOW + 400, NOW / 1000 - 60]] as const) {
    const before = givenBefore ?? defaultIssuedBefore(callAt);
    const r = listOf({ user: "ann", before, expires: revocationExpiry(before, callAt, MAX) });
    const longest = MAX + CLOCK_TOLERANCE_S;
    const tokens = [
      { what: "iat = issued_before - 1, exp - iat = 65", iat: before - 1, token: await sign(before - 1, before - 1 + longest) },
      { what: "no iat, exp as far as the verifier takes at the call", iat: undefined, token: await sign(undefined, Math.floor(callAt / 1000) + longest) },
    ];
    for (const t of tokens) {
      let accepted = 0;
      for (clock = callAt; clock <= callAt + (longest + 3 * CLOCK_TOLERANCE_S) * 1000; clock += 250) {
        if (!(await verifier.verify(t.token).then(() => true, () => false))) continue;
        accepted++;
        assert.equal(r.revoked("ann", "phone", t.iat, clock), true, `${t.what}: the verifier accepts it ${clock - callAt} ms after the call, and the revocation is gone`);
      }
      assert.ok(accepted > 0, `${t.what}: the verifier takes it at the call`);
    }
  }
});

test("revocations - a revoke without issued_before covers a token minted earlier in the same second; a token issued at issued_before passes", () => {
  const callAt = NOW + 700;
  const before = defaultIssuedBefore(callAt);
  const r = listOf({ user: "ann", before, expires: revocationExpiry(before, callAt, 60) });
  assert.equal(r.revoked("ann", "phone", Math.floor((NOW + 200) / 1000), callAt), true, "minted 0.5 s before the call, in its second");
  assert.equal(r.revoked("ann", "phone", before, callAt), false, "a token the backend mints with iat = the answer's issued_before");
});

test("revocations - an issued_before more than 60 s ahead is refused by name; one in ms is told so", () => {
  const nowS = NOW / 1000;
  assert.equal(issuedBeforeProblem(nowS - 86_400, NOW), undefined);
  assert.equal(issuedBeforeProblem(nowS + MAX_ISSUED_BEFORE_AHEAD_S, NOW), undefined);
  assert.equal(issuedBeforeProblem(defaultIssuedBefore(NOW + 999), NOW + 999), undefined, "the default is always taken");
  assert.match(issuedBeforeProblem(nowS + 61, NOW)!, /^issued_before: 1800000061 is 61 s ahead; at most 60 s ahead is taken, since a later call cannot lower it$/);
  assert.match(issuedBeforeProblem(NOW, NOW)!, /is 1798200000000 s ahead \(it looks like milliseconds: issued_before is in unix seconds\)/);
});

test("revocations - the Redis hash: fields and values that do not parse are refused, the sweep's field is not a revocation", () => {
  assert.equal(revocationField("ann"), "u:ann");
  assert.equal(revocationField("ann", "phone"), "d:ann:phone");
  assert.deepEqual(parseRevocation("u:ann", `1000/${NOW}`), { user: "ann", before: 1000, expires: NOW });
  assert.deepEqual(parseRevocation("d:bob:phone", `2000/${NOW}`), { user: "bob", device: "phone", before: 2000, expires: NOW });
  assert.deepEqual(parseRevocation(`u:${"a".repeat(64)}`, "1/2"), { user: "a".repeat(64), before: 1, expires: 2 });
  for (const [field, value] of [
    ["u:a.b", `1/${NOW}`], ["x:ann", `1/${NOW}`], ["u:carl", "soon"], ["d:dan", `1/${NOW}`], ["u:", "1/2"], [`u:${"a".repeat(65)}`, "1/2"],
    ["d:a:b:c", "1/2"], ["u:ann", `${2 ** 40 + 1}/2`], ["u:ann", `1/${2 ** 50 + 1}`], ["u:ann", "1/2/3"], ["u:ann", "-1/2"], ["u:ann", ""],
  ]) assert.equal(parseRevocation(field!, value!), undefined, `${field} = ${value}`);
  assert.equal(isMetaField(":sweep"), true);
  assert.equal(isMetaField("u:ann"), false);
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
