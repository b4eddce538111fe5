/**
 * The client on an in-memory socket and a manual clock (test/harness/manual-clock.ts): connect and
 * AUTH, reconnect and backoff, the heartbeat, the connect timeout, close codes, split stages, gaps,
 * sends, refresh. Nothing waits on the wall clock; client.test.ts runs the same client over a real
 * socket.
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import {
  DeviceClose, composeSeq, decodeClientFrame, encodeFrame, seqEpoch, type ClientFrame, type CursorToken, type DeviceCursor, type Entry, type ServerFrame,
} from "../../protocol/device.js";
import {
  JetgateClient, JetgateClientError, MemoryCursorStore, SessionReplacedError, SignedOutError, type ClientEvent, type ClientOptions, type WebSocketLike,
} from "../../client/index.js";
import { ManualClock } from "../harness/manual-clock.js";

const CONNECTING = 0;
const OPEN = 1;
const CLOSING = 2;
const CLOSED = 3;

/** A socket with the gateway's side in the test's hands; its close handshake never ends by itself. */
class FakeSocket implements WebSocketLike {
  binaryType = "blob";
  readyState = CONNECTING;
  readonly got: ClientFrame[] = [];
  closedWith: { code: number | undefined; reason: string | undefined } | undefined;
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  constructor(readonly url: string) {}
  send(data: Uint8Array): void {
    assert.equal(this.readyState, OPEN, "written only on an open socket");
    this.got.push(decodeClientFrame(data));
  }
  close(code?: number, reason?: string): void {
    this.closedWith = { code, reason };
    this.readyState = CLOSING;
  }
  // ---- the gateway's side
  accept(): void {
    this.readyState = OPEN;
    this.onopen?.({});
  }
  /** Frames as a browser hands them over with binaryType "arraybuffer". */
  deliver(...frames: ServerFrame[]): void {
    for (const f of frames) {
      const u = encodeFrame(f);
      this.onmessage?.({ data: u.buffer.slice(u.byteOffset, u.byteOffset + u.byteLength) });
    }
  }
  deliverBytes(b: Uint8Array): void {
    this.onmessage?.({ data: b });
  }
  serverClose(code: number, reason = ""): void {
    this.readyState = CLOSED;
    this.onclose?.({ code, reason });
  }
  sent<T extends ClientFrame["t"]>(t: T): Extract<ClientFrame, { t: T }>[] {
    return this.got.filter((f): f is Extract<ClientFrame, { t: T }> => f.t === t);
  }
}

/** A store that keeps every cursor saved. */
class RecordingStore extends MemoryCursorStore {
  readonly saved: DeviceCursor[] = [];
  override async save(c: DeviceCursor) {
    this.saved.push(c);
    await super.save(c);
  }
}

const sig = new Uint8Array(16).fill(3);
const tok = (shard = 0, epoch = 1, log = "L"): CursorToken => ({ shard, epoch, log, sig });
const S = (n: number, epoch = 1) => composeSeq(epoch, n);
const entry = (seq: bigint, id: string, prev: bigint | null = null): Entry => ({ seq, id, lane: "default", prev, ts: 1, b: new Uint8Array([1]) });
const authOk = (from: bigint, cursor = tok(), hb = 25_000): ServerFrame => ({ t: "AUTH_OK", session: "s", user: "u", shard: cursor.shard, epoch: cursor.epoch, cursor, from, head: from, trim: 0n, lanes: {}, hb });
const msgs = (shard: number, ...e: Entry[]): ServerFrame => ({ t: "MSGS", shard, e });
const synced = (seq: bigint): ServerFrame => ({ t: "SYNCED", seq });
const range = (cursor: CursorToken, after: bigint, until: bigint) => ({ shard: cursor.shard, after, until, cursor });
const rebased = (to: CursorToken, from: bigint, ranges: ReturnType<typeof range>[] = []): ServerFrame => ({
  t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: to, replay_from_seq: from,
  ...(ranges.length > 0 ? { old_ranges: ranges, old_range: ranges[0] } : {}),
});
const ids = (es: Entry[]) => es.map((e) => e.id);

/** Lets promise chains (the store, the apply loop) run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
}

/**
 * A started client on fake sockets and a manual clock. Math.random is 0.5: each backoff is half its
 * ceiling, and a list of URLs starts at index 512 % length.
 */
async function rig(t: TestContext, opts: Partial<ClientOptions> = {}, clock = new ManualClock(1_700_000_000_000)) {
  t.mock.method(Math, "random", () => 0.5);
  const sockets: FakeSocket[] = [];
  class WS extends FakeSocket {
    constructor(url: string) {
      super(url);
      sockets.push(this);
    }
  }
  const applied: Entry[] = [];
  const events: ClientEvent[] = [];
  const store = new RecordingStore();
  const client = new JetgateClient({ url: "ws://gw/v1/ws", device: "d1", token: () => "jwt", onEntry: (e) => void applied.push(e), store, WebSocket: WS, ackEvery: { entries: 1, ms: 50 }, clock, ...opts });
  client.on((e) => void events.push(e));
  t.after(() => client.close());
  await client.start();
  await settle();
  const tick = async (ms: number) => {
    clock.advance(ms);
    await settle();
  };
  const last = () => sockets.at(-1)!;
  /** The newest socket opens and the gateway answers AUTH with `frames`. */
  const answer = async (...frames: ServerFrame[]) => {
    last().accept();
    last().deliver(...frames);
    await settle();
  };
  const states = () => events.flatMap((e) => (e.type === "state" ? [e.state.type === "waiting" ? `waiting ${e.state.attempt} ${e.state.delayMs}` : e.state.type] : []));
  return { client, sockets, applied, events, store, tick, last, answer, states };
}

test("client socket - connect: AUTH with the token, device, lanes and stored cursor; connecting, syncing, live; SYNCED told", async (t) => {
  const store = new MemoryCursorStore();
  await store.save({ ...tok(), seq: S(7) });
  const r = await rig(t, { store, lanes: ["chat"], token: () => "jwt-1" });
  assert.equal(r.sockets.length, 1);
  assert.equal(r.last().url, "ws://gw/v1/ws");
  assert.equal(r.last().binaryType, "arraybuffer");
  r.last().accept();
  assert.deepEqual(r.last().got, [{ t: "AUTH", v: 1, token: "jwt-1", device: "d1", cursor: { ...tok(), seq: S(7) }, lanes: ["chat"] }]);
  r.last().deliver(authOk(S(7)));
  assert.equal(r.client.state.type, "syncing");
  r.last().deliver(msgs(0, entry(S(8), "a", S(7))), synced(S(8)));
  await settle();
  assert.deepEqual(r.states(), ["connecting", "syncing", "live"]);
  assert.deepEqual(ids(r.applied), ["a"]);
  assert.deepEqual(r.events.filter((e) => e.type === "synced"), [{ type: "synced", seq: S(8) }]);
  assert.deepEqual(await store.load(), { ...tok(), seq: S(8) });
  assert.deepEqual(r.last().sent("ACK"), [{ t: "ACK", seq: S(8) }]);
});

test("client socket - no AUTH_OK within connectTimeoutMs: closed with 4003, the next gateway after the backoff", async (t) => {
  const urls = ["ws://a/v1/ws", "ws://b/v1/ws", "ws://c/v1/ws"];
  const r = await rig(t, { url: urls, connectTimeoutMs: 1000, backoff: { baseMs: 1000, capMs: 8000 } });
  r.last().accept();
  await r.tick(999);
  assert.equal(r.last().closedWith, undefined);
  await r.tick(1);
  assert.deepEqual(r.last().closedWith, DeviceClose.CONNECT_TIMEOUT);
  assert.deepEqual(r.events.filter((e) => e.type === "closed"), [{ type: "closed", ...DeviceClose.CONNECT_TIMEOUT }]);
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 0, delayMs: 500 });
  await r.tick(499);
  assert.equal(r.sockets.length, 1);
  await r.tick(1);
  assert.equal(r.sockets.length, 2, "without waiting for the first socket's close handshake");
  assert.equal(urls.indexOf(r.sockets[1]!.url), (urls.indexOf(r.sockets[0]!.url) + 1) % urls.length, "the next gateway");
  await r.answer(authOk(0n), synced(0n));
  assert.equal(r.client.state.type, "live");
  assert.equal(r.client.stats.reconnects, 1);
});

test("client socket - a token() that never answers is bounded by connectTimeoutMs: no socket for that attempt", async (t) => {
  let calls = 0;
  const r = await rig(t, { connectTimeoutMs: 1000, token: () => (++calls === 1 ? new Promise<string>(() => undefined) : "jwt") });
  assert.deepEqual(r.client.state, { type: "connecting", attempt: 0 });
  await r.tick(1000);
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 0, delayMs: 125 });
  assert.equal(r.sockets.length, 0);
  await r.tick(125);
  assert.equal(calls, 2);
  await r.answer(authOk(0n), synced(0n));
  assert.equal(r.client.state.type, "live");
});

test("client socket - reconnect backoff: longer after each failure under the cap, reset by SYNCED; GOAWAY's retry_ms replaces the next wait", async (t) => {
  const r = await rig(t, { backoff: { baseMs: 1000, capMs: 4000 } });
  await r.answer(authOk(0n), synced(0n));
  r.last().serverClose(4500);
  for (const wait of [500, 1000, 2000, 2000]) {
    assert.equal(r.client.state.type, "waiting");
    const n = r.sockets.length;
    await r.tick(wait - 1);
    assert.equal(r.sockets.length, n, `not before ${wait} ms`);
    await r.tick(1);
    assert.equal(r.sockets.length, n + 1);
    if (r.sockets.length < 5) r.last().serverClose(1006); // never opened; the fifth one answers
  }
  await r.answer(authOk(0n), synced(0n));
  r.last().deliver({ t: "GOAWAY", reason: "drain", retry_ms: 7000 });
  r.last().serverClose(1001);
  await r.tick(6999);
  assert.equal(r.sockets.length, 5);
  await r.tick(1);
  assert.equal(r.sockets.length, 6);
  assert.deepEqual(r.states().filter((s) => s.startsWith("waiting")), ["waiting 0 500", "waiting 1 1000", "waiting 2 2000", "waiting 3 2000", "waiting 0 7000"]);
  assert.equal(r.client.stats.reconnects, 5);
});

test("client socket - ERROR UNAVAILABLE's retry_ms replaces the next wait, as GOAWAY's does (docs/protocol.md: 4503 after retry_ms)", async (t) => {
  const r = await rig(t, { backoff: { baseMs: 1000, capMs: 4000 } });
  await r.answer(authOk(0n), synced(0n));
  r.last().deliver({ t: "ERROR", code: "UNAVAILABLE", msg: "registry unavailable: reconnect later", fatal: true, retry_ms: 6000 });
  r.last().serverClose(4503);
  await r.tick(5999);
  assert.equal(r.sockets.length, 1, "not before retry_ms");
  await r.tick(1);
  assert.equal(r.sockets.length, 2);
  assert.deepEqual(r.states().filter((s) => s.startsWith("waiting")), ["waiting 0 6000"]);
});

test("client socket - heartbeat: PING every hb; nothing heard for 2 x hb + 5 s closes with 4001 and reconnects without the close handshake", async (t) => {
  const r = await rig(t);
  await r.answer(authOk(0n, tok(), 1000), synced(0n));
  for (let i = 0; i < 3; i++) {
    await r.tick(1000);
    r.last().deliver({ t: "PONG" });
  }
  assert.equal(r.last().sent("PING").length, 3);
  await r.tick(7000);
  assert.equal(r.last().closedWith, undefined, "7 s of silence is not more than 2 x hb + 5 s");
  assert.equal(r.last().sent("PING").length, 10);
  await r.tick(1000);
  assert.deepEqual(r.last().closedWith, DeviceClose.HEARTBEAT_MISSED);
  assert.equal(r.last().readyState, CLOSING, "the dead link's handshake never ends");
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 0, delayMs: 125 });
  await r.tick(125);
  assert.equal(r.sockets.length, 2);
  await r.tick(60_000);
  assert.equal(r.sockets[0]!.sent("PING").length, 10, "the old socket's heartbeat stopped");
});

// ---- close codes -------------------------------------------------------------------------------

interface CloseCase {
  code: number;
  /** the state right after the close */
  state: string;
  /** signed_out / reconnect_requested events */
  told: string[];
  /** what a pending send became: its error's name, or "resent" on the next connection */
  send: string;
  /** a new socket after this long (undefined: never) */
  reconnectAfter?: number;
}
const closeCases: CloseCase[] = [
  { code: 4300, state: "waiting 0 0", told: ["reconnect_requested: why"], send: "resent", reconnectAfter: 0 },
  { code: 4399, state: "waiting 0 0", told: ["reconnect_requested: why"], send: "resent", reconnectAfter: 0 },
  { code: 4403, state: "closed signed out: why", told: ["signed_out: why"], send: "SignedOutError signed out: why" },
  { code: 4409, state: "closed server closed with 4409", told: [], send: "SessionReplacedError" },
  { code: 4600, state: "closed server closed with 4600", told: [], send: "JetgateClientError SERVER_CLOSED" },
  { code: 4666, state: "closed server closed with 4666", told: [], send: "JetgateClientError SERVER_CLOSED" },
  { code: 4500, state: "waiting 1 250", told: [], send: "resent", reconnectAfter: 250 },
  { code: 4401, state: "waiting 1 250", told: [], send: "resent", reconnectAfter: 250 },
  { code: 1001, state: "waiting 1 250", told: [], send: "resent", reconnectAfter: 250 },
  { code: 1006, state: "waiting 1 250", told: [], send: "resent", reconnectAfter: 250 },
];

for (const c of closeCases) {
  test(`client socket - close ${c.code}: ${c.state}${c.reconnectAfter !== undefined ? `, reconnects after ${c.reconnectAfter} ms` : ", no reconnect"}`, async (t) => {
    let tokens = 0;
    const r = await rig(t, { token: () => `jwt${++tokens}` });
    await r.answer(authOk(0n), synced(0n));
    // a failure first, and no SYNCED since: a backoff code waits the second step, while a
    // reconnect the backend asks for starts from the first one again
    r.last().serverClose(4500);
    await r.tick(125);
    await r.answer(authOk(0n));
    const pending = r.client.send(new Uint8Array([1]), "c-1").then(
      () => "sent",
      (e: unknown) => (e instanceof SignedOutError ? `SignedOutError ${e.message}` : e instanceof SessionReplacedError ? "SessionReplacedError" : e instanceof JetgateClientError ? `JetgateClientError ${e.code}` : String(e)),
    );
    r.last().serverClose(c.code, "why");
    await settle();
    const st = r.client.state;
    assert.equal(st.type === "waiting" ? `waiting ${st.attempt} ${st.delayMs}` : st.type === "closed" ? `closed ${st.reason}` : st.type, c.state);
    assert.deepEqual(r.events.flatMap((e) => (e.type === "signed_out" || e.type === "reconnect_requested" ? [`${e.type}: ${e.reason}`] : [])), c.told);
    assert.deepEqual(r.events.findLast((e) => e.type === "closed"), { type: "closed", code: c.code, reason: "why" });
    if (c.reconnectAfter === undefined) {
      assert.equal(await pending, c.send);
      await r.tick(600_000);
      assert.equal(r.sockets.length, 2, "stopped for good");
      return;
    }
    if (c.reconnectAfter > 0) {
      await r.tick(c.reconnectAfter - 1);
      assert.equal(r.sockets.length, 2);
    }
    await r.tick(1);
    assert.equal(r.sockets.length, 3);
    await r.answer(authOk(0n));
    assert.equal(r.last().sent("AUTH")[0]?.token, "jwt3", "token() asked again");
    assert.deepEqual(r.last().sent("SEND").map((f) => f.cmid), ["c-1"], c.send);
  });
}

// ---- applying ----------------------------------------------------------------------------------

test("client socket - split on the socket: P's range, C1's, then C2; cut off in C1, AUTH carries C1's token and seq", async (t) => {
  const P = tok(1, 1);
  const C1 = tok(2, 2);
  const C2 = tok(3, 3);
  const store = new RecordingStore();
  await store.save({ ...P, seq: S(10, 1) });
  store.saved.length = 0;
  const r = await rig(t, { store });
  await r.answer(
    rebased(C2, S(0, 3), [range(P, S(10, 1), S(15, 1)), range(C1, S(0, 2), S(4, 2))]),
    authOk(S(0, 3), C2),
    msgs(1, entry(S(15, 1), "p15")),
    msgs(2, entry(S(2, 2), "c1-2")),
  );
  r.last().serverClose(1006);
  await r.tick(125);
  r.last().accept();
  assert.deepEqual(r.last().sent("AUTH")[0]?.cursor, { ...C1, seq: S(2, 2) }, "C1's token, C1's numbering");
  r.last().deliver(rebased(C2, S(0, 3), [range(C1, S(2, 2), S(4, 2))]), authOk(S(0, 3), C2), msgs(2, entry(S(4, 2), "c1-4")), msgs(3, entry(S(1, 3), "c2-1")), synced(S(1, 3)));
  await settle();
  assert.equal(r.client.state.type, "live");
  assert.deepEqual(ids(r.applied), ["p15", "c1-2", "c1-4", "c2-1"]);
  assert.equal(r.client.stats.mailboxSeqRegressionCount, 0);
  assert.equal(r.client.stats.rebases, 2);
  assert.deepEqual(await store.load(), { ...C2, seq: S(1, 3) });
  for (const c of store.saved) assert.ok(c.seq === 0n || seqEpoch(c.seq) === c.epoch, `shard ${c.shard} stored with a seq of epoch ${seqEpoch(c.seq)}`);
  assert.deepEqual(r.events.filter((e) => e.type === "rebased").map((e) => e.type === "rebased" && e.cursor.shard), [3, 3]);
});

test("client socket - a gap: PULL from the last applied, its answer first; a PULL the connection loses leaves the cursor before the gap", async (t) => {
  const r = await rig(t);
  await r.answer(authOk(0n), msgs(0, entry(S(1), "e1", 0n)), synced(S(1)), msgs(0, entry(S(3), "e3", S(2))));
  const [pull] = r.last().sent("PULL");
  assert.deepEqual(pull && { after: pull.after, limit: pull.limit }, { after: S(1), limit: 500 });
  r.last().deliver({ t: "MSGS", shard: 0, id: pull!.id, e: [entry(S(2), "e2", S(1)), entry(S(3), "e3", S(2))], more: false });
  await settle();
  assert.deepEqual(ids(r.applied), ["e1", "e2", "e3"]);
  assert.equal(r.client.stats.gapsFilled, 1);
  r.last().deliver(msgs(0, entry(S(5), "e5", S(4))));
  await settle();
  assert.equal(r.last().sent("PULL").length, 2);
  r.last().serverClose(1006); // before the answer
  await settle();
  assert.deepEqual(ids(r.applied), ["e1", "e2", "e3"], "e5 not applied over the gap");
  assert.equal(r.client.cursorSeq, S(3));
  await r.tick(125);
  r.last().accept();
  assert.equal(r.last().sent("AUTH")[0]?.cursor?.seq, S(3));
});

test("client socket - a gap's PULL refused with an ERROR: the session is given up (4000) and the next resumes before the gap, nothing applied over it", async (t) => {
  const r = await rig(t);
  await r.answer(authOk(0n), msgs(0, entry(S(1), "e1", 0n)), synced(S(1)), msgs(0, entry(S(3), "e3", S(2))));
  const [pull] = r.last().sent("PULL");
  r.last().deliver({ t: "ERROR", code: "BAD_REQUEST", msg: "after is no position of this user's shards", fatal: false, id: pull!.id });
  await settle();
  assert.equal(r.sockets[0]!.closedWith?.code, 4000);
  assert.deepEqual(ids(r.applied), ["e1"], "e3 not applied over the gap");
  await r.tick(125);
  r.last().accept();
  assert.equal(r.sockets.length, 2);
  assert.equal(r.last().sent("AUTH")[0]?.cursor?.seq, S(1));
});

test("client socket - a handler that throws gets the entry again after its backoff; nothing after it meanwhile", async (t) => {
  let failures = 2;
  const order: string[] = [];
  const r = await rig(t, {
    onEntry: (e) => {
      if (e.id === "a" && failures-- > 0) throw new Error("not ready");
      order.push(e.id);
    },
  });
  await r.answer(authOk(0n), msgs(0, entry(S(1), "a"), entry(S(2), "b")), synced(S(2)));
  assert.equal(r.client.stats.handlerErrors, 1);
  assert.equal(r.client.state.type, "syncing", "SYNCED waits behind the entry");
  await r.tick(49);
  assert.equal(r.client.stats.handlerErrors, 1);
  await r.tick(1);
  assert.equal(r.client.stats.handlerErrors, 2, "again after 100 ms x 0.5");
  assert.deepEqual(order, []);
  await r.tick(100);
  assert.deepEqual(order, ["a", "b"]);
  assert.equal(r.client.cursorSeq, S(2));
  assert.equal(r.client.state.type, "live");
  assert.equal(r.events.filter((e) => e.type === "handler_error").length, 2);
});

test("client socket - CURSOR_EXPIRED: later entries wait for the rebuild hook; CURSOR_INVALID: the store cleared, the app told", async (t) => {
  let rebuilt: (() => void) | undefined;
  const trims: bigint[] = [];
  const store = new MemoryCursorStore();
  await store.save({ ...tok(), seq: S(5) });
  const r = await rig(t, { store, onRebuild: ({ trimWatermark }) => new Promise<void>((resolve) => (trims.push(trimWatermark), (rebuilt = resolve))) });
  await r.answer({ t: "ERROR", code: "CURSOR_EXPIRED", msg: "", fatal: false, trim_watermark: S(50), rebuild_required: true, new_cursor: tok() }, authOk(S(60)), msgs(0, entry(S(61), "fresh")), synced(S(61)));
  assert.deepEqual(trims, [S(50)]);
  assert.deepEqual(ids(r.applied), [], "waits for the rebuild");
  rebuilt!();
  await settle();
  assert.deepEqual(ids(r.applied), ["fresh"]);
  assert.equal(r.client.state.type, "live");
  r.last().serverClose(4500);
  await r.tick(125);
  await r.answer({ t: "ERROR", code: "CURSOR_INVALID", msg: "bad sig", fatal: false, new_cursor: tok() });
  assert.equal(await store.load(), undefined);
  assert.equal(r.client.cursorSeq, 0n);
  assert.equal(r.client.stats.cursorInvalid, 1);
  assert.deepEqual(r.events.filter((e) => e.type === "cursor_invalid"), [{ type: "cursor_invalid", reason: "bad sig" }]);
});

test("client socket - a rebuild hook that throws is told and run again after a backoff; entries wait for it, nothing is left unhandled", async (t) => {
  let calls = 0;
  const r = await rig(t, {
    onRebuild: async () => {
      calls++;
      if (calls === 1) throw new Error("db busy");
      if (calls === 2) return Promise.reject(new Error("still busy"));
    },
  });
  await r.answer({ t: "ERROR", code: "CURSOR_EXPIRED", msg: "", fatal: false, trim_watermark: S(50), rebuild_required: true, new_cursor: tok() }, authOk(S(60)), msgs(0, entry(S(61), "fresh")), synced(S(61)));
  assert.equal(calls, 1);
  assert.deepEqual(ids(r.applied), [], "waits for a rebuild that has not succeeded");
  assert.deepEqual(r.events.filter((e) => e.type === "rebuild_error").map((e) => (e as { error: Error }).error.message), ["db busy"]);
  await r.tick(50); // the first retry: half of the 100 ms ceiling (Math.random is 0.5)
  assert.equal(calls, 2);
  assert.deepEqual(ids(r.applied), []);
  await r.tick(100);
  assert.equal(calls, 3);
  assert.deepEqual(ids(r.applied), ["fresh"], "applied once the hook succeeded");
  assert.equal(r.client.stats.handlerErrors, 2);
});

test("client socket - CURSOR_INVALID's clear waits for the saves queued before it: a slow store never ends up holding the invalid cursor", async (t) => {
  let open: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (open = resolve));
  let saving = 0;
  class SlowStore extends MemoryCursorStore {
    override async save(c: DeviceCursor) {
      saving++;
      await gate;
      await super.save(c);
    }
  }
  const store = new SlowStore();
  const r = await rig(t, { store });
  await r.answer(authOk(0n), msgs(0, entry(S(1), "a")), synced(S(1)));
  assert.ok(saving > 0, "a save of the cursor is under way");
  r.last().serverClose(4500);
  await r.tick(125);
  await r.answer({ t: "ERROR", code: "CURSOR_INVALID", msg: "bad sig", fatal: false, new_cursor: tok() });
  open();
  await settle();
  assert.equal(await store.load(), undefined, "cleared after the save, not before it");
});

test("client socket - the connection drops while the rebuild hook runs: the client reconnects once the hook is done, nothing thrown", async (t) => {
  let rebuilt: (() => void) | undefined;
  const r = await rig(t, { onRebuild: () => new Promise<void>((resolve) => (rebuilt = resolve)) });
  await r.answer({ t: "ERROR", code: "CURSOR_EXPIRED", msg: "", fatal: false, trim_watermark: S(50), rebuild_required: true, new_cursor: tok() }, authOk(S(60)), msgs(0, entry(S(61), "lost with the connection")));
  r.last().serverClose(4500);
  await r.tick(5000);
  assert.equal(r.sockets.length, 1, "no reconnect while the hook runs (what arrives could not be applied)");
  rebuilt!();
  await settle();
  await r.tick(5000);
  assert.equal(r.sockets.length, 2, "reconnected after the hook");
  await r.answer(authOk(S(60)), msgs(0, entry(S(61), "again")), synced(S(61)));
  assert.deepEqual(ids(r.applied), ["again"]);
  assert.equal(r.client.state.type, "live");
});

test("client socket - a second CURSOR_EXPIRED while the first hook runs: its hook runs after the first, and entries wait for both", async (t) => {
  const pending: (() => void)[] = [];
  let calls = 0;
  const r = await rig(t, { onRebuild: () => (calls++, new Promise<void>((resolve) => void pending.push(resolve))) });
  await r.answer({ t: "ERROR", code: "CURSOR_EXPIRED", msg: "", fatal: false, trim_watermark: S(50), rebuild_required: true, new_cursor: tok() });
  r.last().serverClose(4500); // before AUTH_OK: nothing queued, the client reconnects at once
  await r.tick(5000);
  assert.equal(r.sockets.length, 2);
  await r.answer({ t: "ERROR", code: "CURSOR_EXPIRED", msg: "", fatal: false, trim_watermark: S(70), rebuild_required: true, new_cursor: tok() }, authOk(S(80)), msgs(0, entry(S(81), "fresh")), synced(S(81)));
  assert.equal(calls, 1, "the second hook waits for the first");
  pending[0]!();
  await settle();
  assert.equal(calls, 2);
  assert.deepEqual(ids(r.applied), [], "entries wait for the second hook too");
  pending[1]!();
  await settle();
  assert.deepEqual(ids(r.applied), ["fresh"]);
});

test("client socket - ACK: cumulative, after ackEvery.entries or ackEvery.ms", async (t) => {
  const r = await rig(t, { ackEvery: { entries: 3, ms: 1000 } });
  await r.answer(authOk(0n), msgs(0, entry(S(1), "a"), entry(S(2), "b")), synced(S(2)));
  assert.deepEqual(r.last().sent("ACK"), []);
  await r.tick(1000);
  assert.deepEqual(r.last().sent("ACK"), [{ t: "ACK", seq: S(2) }]);
  r.last().deliver(msgs(0, entry(S(3), "c"), entry(S(4), "d"), entry(S(5), "e")));
  await settle();
  assert.deepEqual(r.last().sent("ACK"), [{ t: "ACK", seq: S(2) }, { t: "ACK", seq: S(5) }]);
});

// ---- SEND, the app's calls, refresh --------------------------------------------------------------

test("client socket - SEND: resolves on SEND_OK; INTERNAL resends after 1 s with the same id and cmid; TOO_LARGE rejects; pending ones go again after a reconnect", async (t) => {
  const r = await rig(t);
  await r.answer(authOk(0n), synced(0n));
  const first = r.client.send(new Uint8Array([1]), "c-1");
  const [s1] = r.last().sent("SEND");
  r.last().deliver({ t: "ERROR", code: "INTERNAL", msg: "", fatal: false, id: s1!.id });
  await r.tick(999);
  assert.equal(r.last().sent("SEND").length, 1);
  await r.tick(1);
  assert.deepEqual(r.last().sent("SEND")[1], s1);
  r.last().deliver({ t: "SEND_OK", id: s1!.id, cmid: "c-1", dup: false });
  assert.deepEqual(await first, { dup: false });
  const big = r.client.send(new Uint8Array([2]), "c-2").then(() => undefined, (e: unknown) => e);
  r.last().deliver({ t: "ERROR", code: "TOO_LARGE", msg: "too large", fatal: false, id: r.last().sent("SEND")[2]!.id });
  const err = await big;
  assert.ok(err instanceof JetgateClientError && err.code === "TOO_LARGE");
  const third = r.client.send(new Uint8Array([3]), "c-3");
  r.last().serverClose(4500);
  await r.tick(125);
  await r.answer(authOk(0n));
  const again = r.last().sent("SEND");
  assert.deepEqual(again.map((f) => f.cmid), ["c-3"]);
  r.last().deliver({ t: "SEND_OK", id: again[0]!.id, cmid: "c-3", dup: true });
  assert.deepEqual(await third, { dup: true });
});

test("client socket - disconnect() closes with 4000 and reconnects; a frame that does not decode: 4002; close(): 1000 and no reconnect", async (t) => {
  const r = await rig(t);
  await r.answer(authOk(0n), synced(0n));
  r.client.disconnect();
  assert.deepEqual(r.sockets[0]!.closedWith, DeviceClose.RECONNECT);
  assert.equal(r.client.state.type, "waiting");
  await r.tick(125);
  r.last().accept();
  r.last().deliverBytes(new Uint8Array([0xc1]));
  assert.deepEqual(r.last().closedWith, DeviceClose.BAD_SERVER_FRAME);
  r.last().serverClose(DeviceClose.BAD_SERVER_FRAME.code);
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 1, delayMs: 250 }, "no SYNCED since the last failure: the second step");
  await r.tick(250);
  await r.answer(authOk(0n), synced(0n));
  await r.client.close();
  assert.deepEqual(r.last().closedWith, DeviceClose.BYE);
  assert.deepEqual(r.client.state, { type: "closed", reason: "closed by the app" });
  await r.tick(600_000);
  assert.equal(r.sockets.length, 3);
});

test("client socket - a session that applied entries starts the backoff over (4408 before SYNCED, each time a step further); one that applied nothing does not", async (t) => {
  const r = await rig(t);
  const slowSession = async (seq: number) => {
    await r.answer(authOk(seq === 1 ? 0n : S(seq - 1)));
    r.last().deliver(msgs(0, entry(S(seq), `e${seq}`)));
    await settle();
    r.last().serverClose(4408);
  };
  await slowSession(1);
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 0, delayMs: 125 }, "it applied an entry: the first step");
  for (const seq of [2, 3, 4]) {
    await r.tick(125);
    await slowSession(seq);
    assert.deepEqual(r.client.state, { type: "waiting", attempt: 0, delayMs: 125 }, `session ${seq} applied an entry too: the first step again`);
  }
  await r.tick(125);
  await r.answer(authOk(S(4)));
  r.last().serverClose(4408);
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 1, delayMs: 250 }, "nothing applied: the next step");
  await r.tick(250);
  await r.answer(authOk(S(4)));
  r.last().serverClose(4408);
  assert.deepEqual(r.client.state, { type: "waiting", attempt: 2, delayMs: 500 }, "and the one after");
});

test("client socket - token refresh: REFRESH with a fresh token after three quarters of its life; REFRESH_OK times the next", async (t) => {
  const clock = new ManualClock(1_700_000_000_000);
  const jwt = (expInS: number) => `h.${Buffer.from(JSON.stringify({ exp: Math.floor(clock.now() / 1000) + expInS })).toString("base64url")}.s`;
  let calls = 0;
  const r = await rig(t, { token: () => (calls++, jwt(60)) }, clock);
  await r.answer(authOk(0n), synced(0n));
  await r.tick(44_999);
  assert.deepEqual(r.last().sent("REFRESH"), []);
  await r.tick(1);
  assert.equal(r.last().sent("REFRESH").length, 1);
  assert.equal(calls, 2);
  r.last().deliver({ t: "REFRESH_OK", exp: clock.now() + 20_000 });
  await r.tick(15_000);
  assert.equal(r.last().sent("REFRESH").length, 2);
  assert.equal(r.sockets.length, 1, "on the same connection");
});
