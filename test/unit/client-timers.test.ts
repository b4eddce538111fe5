/**
 * The SDK's timed parts on a manual clock (test/harness/manual-clock.ts), no socket: the heartbeat,
 * ACKs, token refresh, and the reconnect backoff; and what each close code makes the client do
 * (reconnectPolicy's ranges).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { CloseCode, DeviceClose } from "../../protocol/device.js";
import { PingHeartbeat } from "../../client/heartbeat.js";
import { Acks } from "../../client/acks.js";
import { TokenRefresh } from "../../client/token-refresh.js";
import { Backoff, afterClose } from "../../client/reconnect.js";
import { JetgateClientError, SessionReplacedError, SignedOutError } from "../../client/errors.js";
import { ManualClock } from "../harness/manual-clock.js";

/** A heartbeat whose pings and misses are logged with the time they happened. */
function heartbeat(clock: ManualClock) {
  const log: string[] = [];
  const hb = new PingHeartbeat(clock, () => log.push(`ping ${clock.now()}`), () => {
    log.push(`missed ${clock.now()}`);
    hb.stop(); // as the client does: it gives the socket up, which stops the heartbeat
  });
  return { hb, log };
}

test("client heartbeat - pings every hb while the server is heard; never gives up", () => {
  const clock = new ManualClock();
  const { hb, log } = heartbeat(clock);
  hb.heard();
  hb.start(2000);
  for (let i = 0; i < 10; i++) {
    clock.advance(1500);
    hb.heard(); // a frame from the server (a PONG, entries)
  }
  assert.deepEqual(log, ["ping 2000", "ping 4000", "ping 6000", "ping 8000", "ping 10000", "ping 12000", "ping 14000"]);
});

test("client heartbeat - nothing heard for more than 2 x hb + 5 s: missed, at the first tick past it, once", () => {
  const clock = new ManualClock();
  const { hb, log } = heartbeat(clock);
  hb.heard();
  hb.start(1000);
  clock.advance(20_000);
  // 7000 ms of silence is not yet more than 2 x 1000 + 5000
  assert.deepEqual(log, ["ping 1000", "ping 2000", "ping 3000", "ping 4000", "ping 5000", "ping 6000", "ping 7000", "missed 8000"]);
  assert.equal(clock.pending, 0, "stopped: no timer left");
});

test("client heartbeat - an hb under a second pings every second; a new start replaces the old interval; stop ends it", () => {
  const clock = new ManualClock();
  const { hb, log } = heartbeat(clock);
  hb.heard();
  hb.start(200);
  clock.advance(2000);
  assert.deepEqual(log, ["ping 1000", "ping 2000"]);
  hb.start(3000); // the next AUTH_OK
  clock.advance(3000);
  assert.deepEqual(log, ["ping 1000", "ping 2000", "ping 5000"], "one interval, the new one");
  hb.stop();
  clock.advance(60_000);
  assert.equal(log.length, 3);
  assert.equal(clock.pending, 0);
});

test("client acks - one ACK per `entries` applied, or after `ms` for fewer; none when nothing is unacked", () => {
  const clock = new ManualClock();
  const sent: number[] = [];
  const acks = new Acks(clock, { entries: 3, ms: 1000 }, () => sent.push(clock.now()));
  acks.count();
  acks.count();
  assert.deepEqual(sent, []);
  acks.count();
  assert.deepEqual(sent, [0], "the third entry");
  acks.count();
  clock.advance(999);
  assert.deepEqual(sent, [0]);
  clock.advance(1);
  assert.deepEqual(sent, [0, 1000], "one entry, after the interval");
  acks.flush();
  clock.advance(5000);
  assert.deepEqual(sent, [0, 1000], "nothing unacked: no ACK");
  assert.equal(clock.pending, 0);
});

test("client token refresh - after three quarters of what is left; a failed token() is asked again 5 s later; stop cancels", async () => {
  const clock = new ManualClock();
  const sent: string[] = [];
  let fail = true;
  let calls = 0;
  const refresh = new TokenRefresh(clock, () => {
    calls++;
    if (fail) throw new Error("offline");
    return `jwt${calls}`;
  }, (t) => sent.push(`${t} at ${clock.now()}`));
  refresh.schedule(undefined);
  assert.equal(clock.pending, 0, "an unknown expiry: no refresh");
  refresh.schedule(60_000);
  clock.advance(44_999);
  assert.equal(calls, 0);
  clock.advance(1);
  await Promise.resolve();
  assert.equal(calls, 1, "asked at 45 s");
  assert.deepEqual(sent, []);
  fail = false;
  clock.advance(5000);
  await Promise.resolve();
  assert.deepEqual(sent, ["jwt2 at 50000"]);
  refresh.schedule(clock.now() + 2000);
  refresh.stop();
  clock.advance(60_000);
  assert.equal(calls, 2, "stopped");
});

test("client backoff - full jitter under the exponential ceiling; reset, GOAWAY's retry_ms once, a requested reconnect at once", () => {
  const b = new Backoff({ baseMs: 100, capMs: 1000 }, () => 0.5);
  assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next()], [
    { attempt: 0, delayMs: 50 },
    { attempt: 1, delayMs: 100 },
    { attempt: 2, delayMs: 200 },
    { attempt: 3, delayMs: 400 },
    { attempt: 4, delayMs: 500 },
  ]);
  b.retryAfter(300);
  assert.deepEqual(b.next(), { attempt: 5, delayMs: 300 }, "GOAWAY replaces the delay");
  assert.deepEqual(b.next(), { attempt: 6, delayMs: 500 }, "once");
  b.reset();
  assert.deepEqual(b.next(), { attempt: 0, delayMs: 50 }, "after SYNCED: the first step");
  b.now();
  assert.deepEqual(b.next(), { attempt: 0, delayMs: 0 }, "asked by the backend: at once");
  assert.deepEqual(b.next(), { attempt: 1, delayMs: 100 }, "and from the first step if that fails");
});

test("client close codes - what the client does after each close, by reconnectPolicy's ranges", () => {
  const table: [number, string][] = [
    [CloseCode.RECONNECT_NOW, "now"],
    [4301, "now"],
    [4399, "now"],
    [CloseCode.SIGNED_OUT, "stop"],
    [CloseCode.REPLACED, "stop"],
    [4600, "stop"],
    [4650, "stop"],
    [4699, "stop"],
    [CloseCode.BAD_FRAME, "backoff"],
    [CloseCode.UNAUTHENTICATED, "backoff"],
    [CloseCode.SLOW_CONSUMER, "backoff"],
    [CloseCode.TOO_LARGE, "backoff"],
    [CloseCode.RATE_LIMITED, "backoff"],
    [CloseCode.INTERNAL, "backoff"],
    [CloseCode.UNAVAILABLE, "backoff"],
    [CloseCode.GOING_AWAY, "backoff"],
    [1006, "backoff"],
    [1000, "backoff"],
    [4299, "backoff"],
    [4599, "backoff"],
    [4700, "backoff"],
    ...Object.values(DeviceClose).filter((d) => d.code !== 1000).map((d): [number, string] => [d.code, "backoff"]),
  ];
  for (const [code, want] of table) assert.equal(afterClose(code, "r").type, want, String(code));
});

test("client close codes - how the client stops: signed out, replaced, and a terminal code it does not know", () => {
  const signedOut = afterClose(4403, "by admin");
  assert.ok(signedOut.type === "stop");
  assert.equal(signedOut.reason, "signed out: by admin");
  assert.deepEqual(signedOut.event, { type: "signed_out", reason: "by admin" });
  assert.ok(signedOut.error() instanceof SignedOutError);
  assert.equal(signedOut.error().message, "signed out: by admin");
  assert.notEqual(signedOut.error(), signedOut.error(), "one error per pending send");

  const replaced = afterClose(4409, "a newer session of this device exists");
  assert.ok(replaced.type === "stop");
  assert.equal(replaced.reason, "server closed with 4409");
  assert.equal(replaced.event, undefined);
  assert.ok(replaced.error() instanceof SessionReplacedError);

  const unknown = afterClose(4642, "account deleted");
  assert.ok(unknown.type === "stop");
  assert.equal(unknown.reason, "server closed with 4642");
  assert.equal(unknown.event, undefined);
  const e = unknown.error();
  assert.ok(e instanceof JetgateClientError && !(e instanceof SessionReplacedError) && !(e instanceof SignedOutError));
  assert.equal(e.code, "SERVER_CLOSED");
  assert.equal(e.message, "server closed with 4642: account deleted");

  const now = afterClose(4300, "new token");
  assert.deepEqual(now, { type: "now", event: { type: "reconnect_requested", reason: "new token" } });
});
