/**
 * The SDK over a real WebSocket (`ws`) against a scripted gateway, on the wall clock: the
 * integration side of its tests. The same behaviours on an in-memory socket and mock timers are in
 * client-socket.test.ts; the split stages as a table in client-position.test.ts; the heartbeat,
 * ACKs, refresh, backoff and close codes on a fake clock in client-timers.test.ts.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket, { WebSocketServer } from "ws";
import {
  DeviceClose, composeSeq, decodeClientFrame, encodeFrame, seqEpoch, type ClientFrame, type CursorToken, type DeviceCursor, type Entry, type ServerFrame,
} from "../../protocol/device.js";
import {
  JetgateClient, MemoryCursorStore, reconnectDelay, serializeCursor, deserializeCursor, type ClientOptions, type WebSocketFactory,
} from "../../client/index.js";
import { FileCursorStore } from "../../client/node.js";
import { deviceClock } from "../../client/clock.js";
import { sleep, waitFor } from "../harness/wait.js";

/** A scripted gateway: a real WebSocket server whose answers each test writes. */
class FakeGateway {
  readonly conns: Conn[] = [];
  private constructor(
    readonly wss: WebSocketServer,
    readonly port: number,
  ) {}
  static async start(script: (c: Conn) => void): Promise<FakeGateway> {
    const wss = new WebSocketServer({ port: 0, host: "127.0.0.1" });
    await new Promise((r) => wss.once("listening", r));
    const g = new FakeGateway(wss, (wss.address() as { port: number }).port);
    wss.on("connection", (ws) => {
      const c = new Conn(ws);
      g.conns.push(c);
      script(c);
    });
    return g;
  }
  get url(): string {
    return `ws://127.0.0.1:${this.port}/v1/ws`;
  }
  close(): void {
    for (const c of this.conns) c.ws.terminate();
    this.wss.close();
  }
}

class Conn {
  readonly got: ClientFrame[] = [];
  private handlers: ((f: ClientFrame) => void)[] = [];
  constructor(readonly ws: WebSocket) {
    ws.on("message", (d: Buffer) => {
      const f = decodeClientFrame(new Uint8Array(d));
      this.got.push(f);
      for (const h of this.handlers) h(f);
    });
  }
  on(h: (f: ClientFrame) => void): void {
    this.handlers.push(h);
  }
  send(...frames: ServerFrame[]): void {
    for (const f of frames) this.ws.send(encodeFrame(f));
  }
}

const sig = new Uint8Array(16).fill(3);
const tok = (shard = 0, epoch = 1) => ({ shard, epoch, log: "L", sig });
const entry = (seq: bigint, id: string, prev: bigint | null = null, lane = "default"): Entry => ({ seq, id, lane, prev, ts: 1, b: new Uint8Array([1]) });
const authOk = (from: bigint, cursor = tok(), hb = 25000): ServerFrame => ({ t: "AUTH_OK", session: "s", user: "u", shard: cursor.shard, epoch: cursor.epoch, cursor, from, head: from, trim: 0n, lanes: {}, hb });
const msgs = (shard: number, ...e: Entry[]): ServerFrame => ({ t: "MSGS", shard, e });
const S = (n: number, epoch = 1) => composeSeq(epoch, n);

const clients: JetgateClient[] = [];
const gateways: FakeGateway[] = [];
after(async () => {
  for (const c of clients) await c.close();
  for (const g of gateways) g.close();
});

async function rig(script: (c: Conn, n: number) => void, opts: Partial<ClientOptions> = {}) {
  let n = 0;
  const g = await FakeGateway.start((c) => script(c, n++));
  gateways.push(g);
  const applied: Entry[] = [];
  const store = opts.store ?? new MemoryCursorStore();
  const client = new JetgateClient({
    url: g.url, device: "d1", token: () => "jwt", onEntry: (e) => void applied.push(e), store,
    WebSocket: WebSocket as unknown as WebSocketFactory, backoff: { baseMs: 20, capMs: 100 }, ackEvery: { entries: 1, ms: 50 }, ...opts,
  });
  clients.push(client);
  await client.start();
  return { g, client, applied, store };
}

test("client - normal session: entries applied in order, cursor saved, ACK sent", async () => {
  const { g, client, applied, store } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(authOk(0n), msgs(0, entry(S(1), "a"), entry(S(2), "b", S(1))), { t: "SYNCED", seq: S(2) })));
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(applied.map((e) => e.id), ["a", "b"]);
  assert.equal(client.cursorSeq, S(2));
  await waitFor("saved", async () => (await store.load())?.seq === S(2));
  await waitFor("ACK", () => g.conns[0]!.got.some((f) => f.t === "ACK" && f.seq === S(2)));
  const auth = g.conns[0]!.got[0]!;
  assert.ok(auth.t === "AUTH" && auth.cursor === undefined && auth.device === "d1");
});

test("client - resumes with its stored cursor", async () => {
  const store = new MemoryCursorStore();
  await store.save({ ...tok(), seq: S(7) });
  const { g } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(authOk(S(7)), { t: "SYNCED", seq: S(7) })), { store });
  await waitFor("AUTH", () => g.conns[0]?.got[0]);
  const auth = g.conns[0]!.got[0]!;
  assert.ok(auth.t === "AUTH");
  assert.deepEqual(auth.cursor, { ...tok(), seq: S(7) });
});

test("client - CURSOR_REBASED: new cursor adopted, replayed entries deduped by message_id", async () => {
  const { client, applied, store } = await rig((c, n) =>
    c.on((f) => {
      if (f.t !== "AUTH") return;
      if (n === 0) {
        c.send(authOk(0n), msgs(0, entry(S(1), "x")), { t: "SYNCED", seq: S(1) });
        setTimeout(() => c.ws.close(4500), 50);
      } else {
        c.send(
          { t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: tok(0, 3), replay_from_seq: S(0, 3) },
          authOk(S(0, 3), tok(0, 3)),
          msgs(0, entry(S(1, 3), "x"), entry(S(2, 3), "y")),
          { t: "SYNCED", seq: S(2, 3) },
        );
      }
    }),
  );
  await waitFor("y applied", () => applied.some((e) => e.id === "y"));
  assert.deepEqual(applied.map((e) => e.id), ["x", "y"], "x came twice and was applied once");
  assert.equal(client.stats.duplicatesDropped, 1);
  assert.equal(client.stats.rebases, 1);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  await waitFor("the new token saved", async () => (await store.load())?.epoch === 3);
});

test("client - split: the old shard's range first, then the new shard, no regression", async () => {
  const store = new MemoryCursorStore();
  await store.save({ ...tok(1, 1), seq: S(10) });
  const child = tok(2, 2);
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    { t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: child, replay_from_seq: S(0, 2), old_range: { shard: 1, after: S(10), until: S(20) } },
    authOk(S(0, 2), child),
    msgs(1, entry(S(15), "old")),
    msgs(2, entry(S(1, 2), "new")),
    { t: "SYNCED", seq: S(1, 2) },
  )), { store });
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(applied.map((e) => e.id), ["old", "new"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.equal((await store.load())?.shard, 2);
});

test("client - split: cut off inside the old range, the cursor keeps the old shard's token with its seq", async () => {
  const store = new MemoryCursorStore();
  await store.save({ ...tok(1, 1), seq: S(10) });
  const child = tok(2, 2);
  const { client, applied } = await rig((c, n) => c.on((f) => {
    if (f.t !== "AUTH") return;
    const after = n === 0 ? S(10) : S(15);
    c.send(
      { t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: child, replay_from_seq: S(0, 2), old_range: { shard: 1, after, until: S(20) } },
      authOk(S(0, 2), child),
    );
    // the first connection dies inside the old range; the second finishes it
    if (n === 0) {
      c.send(msgs(1, entry(S(15), "old")));
      setTimeout(() => c.ws.terminate(), 50);
    } else {
      c.send(msgs(1, entry(S(17), "old2")), msgs(2, entry(S(1, 2), "new")), { t: "SYNCED", seq: S(1, 2) });
    }
  }), { store });
  await waitFor("a second AUTH", () => gateways.at(-1)!.conns[1]?.got.some((f) => f.t === "AUTH") === true);
  const second = gateways.at(-1)!.conns[1]!.got.find((f) => f.t === "AUTH")!;
  assert.ok(second.t === "AUTH" && second.cursor !== undefined);
  assert.deepEqual({ shard: second.cursor.shard, epoch: second.cursor.epoch, seq: second.cursor.seq }, { shard: 1, epoch: 1, seq: S(15) }, "old token, old numbering");
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(applied.map((e) => e.id), ["old", "old2", "new"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.deepEqual(await store.load(), { ...child, seq: S(1, 2) }, "the child's token once past the old range");
});

// ---- moved by several splits (P -> C1 -> C2 ...) -----------------------------------------------
// Each shard has its own epoch here (a child starts at its parent's epoch + 1), so a stored cursor
// whose seq is in another numbering than its token shows as an epoch mismatch.
const P = tok(1, 1);
const C1 = tok(2, 2);
const C2 = tok(3, 3);
const C3 = tok(4, 4);
interface Range {
  shard: number;
  after: bigint;
  until: bigint;
  cursor?: CursorToken;
}
/** One hop's range, with that shard's token as today's gateways send it (`withCursor` false: as an older one). */
const range = (cursor: CursorToken, after: bigint, until: bigint, withCursor = true): Range => ({ shard: cursor.shard, after, until, ...(withCursor ? { cursor } : {}) });
/** CURSOR_REBASED as a gateway sends it: every hop in `old_ranges`, the first alone in `old_range`. */
const rebased = (to: CursorToken, from: bigint, ranges: Range[] = []): ServerFrame => ({
  t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: to, replay_from_seq: from,
  ...(ranges.length > 0 ? { old_ranges: ranges, old_range: ranges[0] } : {}),
});
const ids = (es: Entry[]) => es.map((e) => e.id);

/** A store that keeps every cursor saved, so a test can check each one. */
class RecordingStore extends MemoryCursorStore {
  readonly saved: DeviceCursor[] = [];
  override async save(c: DeviceCursor) {
    this.saved.push(c);
    await super.save(c);
  }
}
async function storedAt(token: CursorToken, seq: bigint): Promise<RecordingStore> {
  const s = new RecordingStore();
  await s.save({ ...token, seq });
  s.saved.length = 0;
  return s;
}
/** Every cursor the device stored had its token and its seq in one numbering (0: before everything). */
function assertOneNumbering(store: RecordingStore): void {
  for (const c of store.saved) {
    assert.ok(c.seq === 0n || seqEpoch(c.seq) === c.epoch, `stored a token of shard ${c.shard} (epoch ${c.epoch}) with a seq of epoch ${seqEpoch(c.seq)}`);
  }
}

test("client - moved by two splits while offline: P's range, then C1's, then C2, every entry once", async () => {
  const store = await storedAt(P, S(10, 1));
  const c2 = { ...C2, log: "L2" }; // AUTH_OK's token is the one the device goes on with
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    rebased(C2, S(0, 3), [range(P, S(10, 1), S(20, 1)), range(C1, S(0, 2), S(5, 2))]),
    authOk(S(0, 3), c2),
    msgs(1, entry(S(15, 1), "p15"), entry(S(18, 1), "p18")),
    msgs(1, entry(S(20, 1), "p20")),
    msgs(2, entry(S(2, 2), "c1-2"), entry(S(5, 2), "c1-5")),
    msgs(3, entry(S(1, 3), "c2-1")),
    { t: "SYNCED", seq: S(1, 3) },
  )), { store });
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(ids(applied), ["p15", "p18", "p20", "c1-2", "c1-5", "c2-1"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.equal(client.stats.duplicatesDropped, 0);
  assert.equal(client.stats.rebases, 1);
  assert.deepEqual(await store.load(), { ...c2, seq: S(1, 3) });
  assertOneNumbering(store);
  assert.ok(store.saved.some((x) => x.shard === 2 && x.seq === S(5, 2)), "C1's entries were stored with C1's token");
});

test("client - moved by three splits while offline: each range in order, then the new shard", async () => {
  const store = await storedAt(P, S(3, 1));
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    rebased(C3, S(0, 4), [range(P, S(3, 1), S(6, 1)), range(C1, S(0, 2), S(4, 2)), range(C2, S(0, 3), S(2, 3))]),
    authOk(S(0, 4), C3),
    msgs(1, entry(S(4, 1), "p4")),
    msgs(1, entry(S(6, 1), "p6")),
    msgs(2, entry(S(1, 2), "c1-1"), entry(S(4, 2), "c1-4")),
    msgs(3, entry(S(1, 3), "c2-1")),
    msgs(3, entry(S(2, 3), "c2-2")),
    msgs(4, entry(S(1, 4), "c3-1"), entry(S(2, 4), "c3-2")),
    { t: "SYNCED", seq: S(2, 4) },
  )), { store });
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(ids(applied), ["p4", "p6", "c1-1", "c1-4", "c2-1", "c2-2", "c3-1", "c3-2"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.deepEqual(await store.load(), { ...C3, seq: S(2, 4) });
  assertOneNumbering(store);
});

test("client - two mid-session splits while live, each one hop: every entry once, in order", async () => {
  const store = new RecordingStore();
  const applied: Entry[] = [];
  const { g, client } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(authOk(0n, P), msgs(1, entry(S(1, 1), "p1"), entry(S(2, 1), "p2")), { t: "SYNCED", seq: S(2, 1) })), {
    store,
    // a slow handler: the rebases arrive while entries before them are still being applied
    onEntry: async (e) => {
      await new Promise((r) => setTimeout(r, 10));
      applied.push(e);
    },
  });
  await waitFor("live", () => client.state.type === "live");
  g.conns[0]!.send(
    rebased(C1, S(0, 2), [range(P, S(2, 1), S(4, 1))]),
    msgs(1, entry(S(3, 1), "p3"), entry(S(4, 1), "p4")),
    msgs(2, entry(S(1, 2), "c1-1")),
    rebased(C2, S(0, 3), [range(C1, S(1, 2), S(3, 2))]),
    msgs(2, entry(S(2, 2), "c1-2"), entry(S(3, 2), "c1-3")),
    msgs(3, entry(S(1, 3), "c2-1")),
  );
  await waitFor("c2-1 applied", () => applied.some((e) => e.id === "c2-1"));
  assert.deepEqual(ids(applied), ["p1", "p2", "p3", "p4", "c1-1", "c1-2", "c1-3", "c2-1"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.equal(client.stats.rebases, 2);
  await waitFor("C2's cursor saved", async () => (await store.load())?.seq === S(1, 3));
  assert.deepEqual(await store.load(), { ...C2, seq: S(1, 3) });
  assertOneNumbering(store);
});

test("client - a second mid-session split before the first's new shard began: C1 keeps the first rebase's token", async () => {
  const store = new RecordingStore();
  const { g, client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(authOk(0n, P), msgs(1, entry(S(1, 1), "p1")), { t: "SYNCED", seq: S(1, 1) })), { store });
  await waitFor("live", () => client.state.type === "live");
  g.conns[0]!.send(
    rebased(C1, S(0, 2), [range(P, S(1, 1), S(2, 1))]),
    msgs(1, entry(S(2, 1), "p2")),
    // C1 split before any of its entries was sent; this gateway names no token for C1's range:
    // the first rebase's new_cursor is C1's
    rebased(C2, S(0, 3), [range(C1, S(0, 2), S(2, 2), false)]),
    msgs(2, entry(S(1, 2), "c1-1"), entry(S(2, 2), "c1-2")),
    msgs(3, entry(S(1, 3), "c2-1")),
  );
  await waitFor("c2-1 applied", () => applied.some((e) => e.id === "c2-1"));
  assert.deepEqual(ids(applied), ["p1", "p2", "c1-1", "c1-2", "c2-1"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  await waitFor("C2's cursor saved", async () => (await store.load())?.seq === S(1, 3));
  assert.deepEqual(await store.load(), { ...C2, seq: S(1, 3) });
  assertOneNumbering(store);
});

test("client - a range with no entries is passed over when a later shard's entries begin", async () => {
  const store = await storedAt(P, S(10, 1));
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    rebased(C2, S(0, 3), [range(P, S(10, 1), S(12, 1)), range(C1, S(0, 2), S(0, 2))]),
    authOk(S(0, 3), C2),
    msgs(1, entry(S(12, 1), "p12")),
    msgs(3, entry(S(1, 3), "c2-1")),
    { t: "SYNCED", seq: S(1, 3) },
  )), { store });
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(ids(applied), ["p12", "c2-1"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.deepEqual(await store.load(), { ...C2, seq: S(1, 3) });
  assertOneNumbering(store);
});

test("client - the new shard with no entries: SYNCED moves the cursor onto it after the last range", async () => {
  const store = await storedAt(P, S(10, 1));
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    rebased(C2, S(0, 3), [range(P, S(10, 1), S(10, 1)), range(C1, S(0, 2), S(2, 2))]),
    authOk(S(0, 3), C2),
    msgs(2, entry(S(1, 2), "c1-1"), entry(S(2, 2), "c1-2")),
    { t: "SYNCED", seq: S(0, 3) },
  )), { store });
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(ids(applied), ["c1-1", "c1-2"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  await waitFor("C2's cursor saved", async () => (await store.load())?.shard === 3);
  assert.deepEqual(await store.load(), { ...C2, seq: S(0, 3) });
  assertOneNumbering(store);
});

test("client - cut off inside the middle range: the next AUTH carries C1's token with a C1 seq", async () => {
  const store = await storedAt(P, S(10, 1));
  const { g, client, applied } = await rig((c, n) => c.on((f) => {
    if (f.t !== "AUTH") return;
    if (n === 0) {
      c.send(
        rebased(C2, S(0, 3), [range(P, S(10, 1), S(15, 1)), range(C1, S(0, 2), S(4, 2))]),
        authOk(S(0, 3), C2),
        msgs(1, entry(S(15, 1), "p15")),
        msgs(2, entry(S(2, 2), "c1-2")),
      );
      setTimeout(() => c.ws.terminate(), 50);
    } else {
      // the gateway answers the C1 cursor: the rest of C1's range, then C2
      c.send(
        rebased(C2, S(0, 3), [range(C1, f.cursor!.seq, S(4, 2))]),
        authOk(S(0, 3), C2),
        msgs(2, entry(S(4, 2), "c1-4")),
        msgs(3, entry(S(1, 3), "c2-1")),
        { t: "SYNCED", seq: S(1, 3) },
      );
    }
  }), { store });
  await waitFor("a second AUTH", () => g.conns[1]?.got.some((f) => f.t === "AUTH") === true);
  const second = g.conns[1]!.got.find((f) => f.t === "AUTH")!;
  assert.ok(second.t === "AUTH" && second.cursor !== undefined);
  assert.deepEqual(second.cursor, { ...C1, seq: S(2, 2) }, "C1's token, C1's numbering");
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(ids(applied), ["p15", "c1-2", "c1-4", "c2-1"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.deepEqual(await store.load(), { ...C2, seq: S(1, 3) });
  assertOneNumbering(store);
});

test("client - an older gateway's CURSOR_REBASED (old_range only, no range token): old range, then the new shard", async () => {
  const store = await storedAt(P, S(10, 1));
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    { t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: C1, replay_from_seq: S(0, 2), old_range: { shard: 1, after: S(10, 1), until: S(14, 1) } },
    authOk(S(0, 2), C1),
    msgs(1, entry(S(11, 1), "p11")),
    msgs(1, entry(S(14, 1), "p14")),
    msgs(2, entry(S(1, 2), "c1-1")),
    { t: "SYNCED", seq: S(1, 2) },
  )), { store });
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(ids(applied), ["p11", "p14", "c1-1"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.ok(store.saved.some((x) => x.shard === 1 && x.seq === S(14, 1)), "P's range stored with P's token");
  assert.deepEqual(await store.load(), { ...C1, seq: S(1, 2) });
  assertOneNumbering(store);
});

test("client - closes with the device's own close codes (DeviceClose)", async () => {
  const closes: { code: number; reason: string }[] = [];
  const { client } = await rig((c, n) => {
    c.ws.on("close", (code, reason) => void closes.push({ code, reason: reason.toString() }));
    c.on((f) => {
      if (f.t !== "AUTH") return;
      if (n === 1) c.ws.send(new Uint8Array([0xc1])); // not msgpack
      else c.send(authOk(0n), { t: "SYNCED", seq: 0n });
    });
  });
  await waitFor("live", () => client.state.type === "live");
  client.disconnect();
  await waitFor("a bad frame answered", () => closes.length >= 2);
  await waitFor("live again", () => client.state.type === "live");
  await client.close();
  await waitFor("closed", () => closes.length >= 3);
  assert.deepEqual(closes, [DeviceClose.RECONNECT, DeviceClose.BAD_SERVER_FRAME, DeviceClose.BYE]);
});

test("client - a silent gateway: HEARTBEAT_MISSED after 2 x hb + 5 s, and it reconnects at once, not after the dead socket's close handshake", { timeout: 15_000 }, async (t) => {
  t.mock.timers.enable({ apis: ["setInterval", "Date"], now: Date.now() });
  // the heartbeat times silence on the monotonic clock, which mock timers do not reach: the mocked Date stands in
  const clock = { ...deviceClock, monotonic: () => Date.now() };
  const { g, client } = await rig((c, n) => {
    c.on((f) => {
      if (f.t !== "AUTH") return;
      c.send(authOk(0n, tok(), 1000), { t: "SYNCED", seq: 0n });
      // the first gateway goes silent: it reads nothing more, so no close handshake ever completes
      // (`ws` would wait 30 s for one)
      if (n === 0) setTimeout(() => (c.ws as unknown as { _socket: { pause(): void } })._socket.pause(), 50);
    });
  }, { clock });
  const events: { code: number; reason: string }[] = [];
  client.on((e) => e.type === "closed" && events.push({ code: e.code, reason: e.reason }));
  await waitFor("AUTH_OK applied", () => client.state.type === "live");
  await sleep(100);
  for (let i = 0; i < 8 && events.length === 0; i++) {
    t.mock.timers.tick(1000);
    await sleep(20);
  }
  await waitFor("given up", () => events.length >= 1);
  assert.deepEqual(events[0], DeviceClose.HEARTBEAT_MISSED);
  await waitFor("reconnected within 3 s", () => g.conns.length >= 2, { timeoutMs: 3000 });
});

test("client - a gateway that never answers AUTH: the attempt is given up after connectTimeoutMs (CONNECT_TIMEOUT) and tried again", async () => {
  const closes: { code: number; reason: string }[] = [];
  const { client } = await rig((c, n) => {
    c.ws.on("close", (code, reason) => void closes.push({ code, reason: reason.toString() }));
    c.on((f) => f.t === "AUTH" && n > 0 && c.send(authOk(0n), { t: "SYNCED", seq: 0n }));
  }, { connectTimeoutMs: 300 });
  await waitFor("live on the second attempt", () => client.state.type === "live", { timeoutMs: 3000 });
  await waitFor("the first attempt closed", () => closes.length >= 1);
  assert.deepEqual(closes[0], DeviceClose.CONNECT_TIMEOUT);
  assert.equal(client.stats.reconnects, 1);
});

test("client - a gap whose PULL dies with the connection: the entry after it waits for the next session", async () => {
  const { g, client, applied } = await rig((c, n) => c.on((f) => {
    if (f.t === "AUTH" && n === 0) c.send(authOk(0n), msgs(0, entry(S(1), "a"), entry(S(3), "c", S(2))));
    // the PULL for the gap is never answered: the connection ends first
    if (f.t === "PULL" && n === 0) c.ws.terminate();
    if (f.t === "AUTH" && n === 1) c.send(authOk(f.cursor!.seq), msgs(0, entry(S(2), "b", S(1)), entry(S(3), "c", S(2))), { t: "SYNCED", seq: S(3) });
  }));
  await waitFor("c applied", () => applied.some((e) => e.id === "c"));
  const second = g.conns[1]!.got.find((f) => f.t === "AUTH")!;
  assert.ok(second.t === "AUTH");
  assert.equal(second.cursor?.seq, S(1), "the cursor stayed before the gap");
  assert.deepEqual(applied.map((e) => e.id), ["a", "b", "c"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
});

test("client - a mid-session CURSOR_REBASED waits for the entries before it", async () => {
  const applied: Entry[] = [];
  const { client } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    authOk(0n),
    msgs(0, entry(S(1), "a"), entry(S(2), "b")),
    { t: "SYNCED", seq: S(2) },
    { t: "ERROR", code: "CURSOR_REBASED", msg: "", fatal: false, new_cursor: tok(0, 2), replay_from_seq: S(2, 2) },
    msgs(0, entry(S(3, 2), "c")),
  )), {
    // a slow handler: the rebase frame arrives while "a" is being applied
    onEntry: async (e) => {
      await new Promise((r) => setTimeout(r, 20));
      applied.push(e);
    },
  });
  await waitFor("c applied", () => applied.some((e) => e.id === "c"));
  assert.deepEqual(applied.map((e) => e.id), ["a", "b", "c"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 0);
  assert.equal(client.cursorSeq, S(3, 2));
});

test("client - CURSOR_EXPIRED: the rebuild hook runs before any later entry, then from the head", async () => {
  const order: string[] = [];
  const { client } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    { t: "ERROR", code: "CURSOR_EXPIRED", msg: "", fatal: false, trim_watermark: S(50), rebuild_required: true, new_cursor: tok() },
    authOk(S(60)),
    msgs(0, entry(S(61), "fresh")),
    { t: "SYNCED", seq: S(61) },
  )), {
    store: await (async () => { const s = new MemoryCursorStore(); await s.save({ ...tok(), seq: S(5) }); return s; })(),
    onRebuild: async ({ trimWatermark }) => {
      order.push(`rebuild ${trimWatermark}`);
      await new Promise((r) => setTimeout(r, 100));
      order.push("rebuilt");
    },
    onEntry: (e) => void order.push(e.id),
  });
  await waitFor("entry applied", () => order.includes("fresh"));
  assert.deepEqual(order, [`rebuild ${S(50)}`, "rebuilt", "fresh"]);
  assert.equal(client.cursorSeq, S(61));
});

test("client - CURSOR_INVALID: the stored cursor is dropped, a fresh start, the app is told", async () => {
  const store = new MemoryCursorStore();
  await store.save({ ...tok(), seq: S(9) });
  let told = "";
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(
    { t: "ERROR", code: "CURSOR_INVALID", msg: "bad sig", fatal: false, new_cursor: tok() },
    authOk(0n),
    msgs(0, entry(S(1), "one")),
    { t: "SYNCED", seq: S(1) },
  )), { store });
  client.on((e) => void (e.type === "cursor_invalid" && (told = e.reason)));
  await waitFor("applied", () => applied.length === 1);
  assert.equal(told, "bad sig");
  assert.equal(client.stats.cursorInvalid, 1);
  assert.equal(client.cursorSeq, S(1));
});

test("client - a gap (prev above the last applied) is filled with PULL before the entry", async () => {
  const { g, client, applied } = await rig((c) => c.on((f) => {
    if (f.t === "AUTH") c.send(authOk(0n), msgs(0, entry(S(1), "e1", 0n)), { t: "SYNCED", seq: S(1) }, msgs(0, entry(S(3), "e3", S(2))));
    if (f.t === "PULL") c.send({ t: "MSGS", shard: 0, id: f.id, e: [entry(S(2), "e2", S(1)), entry(S(3), "e3", S(2))], more: false });
  }));
  await waitFor("three", () => applied.length === 3);
  assert.deepEqual(applied.map((e) => e.id), ["e1", "e2", "e3"]);
  assert.equal(client.stats.gapsFilled, 1);
  const pull = g.conns[0]!.got.find((f) => f.t === "PULL");
  assert.ok(pull && pull.t === "PULL" && pull.after === S(1));
});

test("client - a handler that throws: the cursor does not advance and the entry comes again", async () => {
  let calls = 0;
  let ready = false;
  const { client } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(authOk(0n), msgs(0, entry(S(1), "flaky")), { t: "SYNCED", seq: S(1) })), {
    onEntry: () => {
      calls++;
      if (!ready) throw new Error("app not ready");
    },
  });
  await waitFor("the handler failed twice", () => client.stats.handlerErrors >= 2);
  assert.equal(client.cursorSeq, 0n, "not advanced while the handler fails");
  assert.equal(client.stats.applied, 0);
  ready = true;
  await waitFor("redelivered and applied", () => client.cursorSeq === S(1));
  assert.equal(calls, client.stats.handlerErrors + 1, "the same entry, until it succeeded once");
  assert.equal(client.stats.applied, 1);
});

test("client - a seq at or below the last applied outside a rebase is counted, not applied", async () => {
  const { client, applied } = await rig((c) => c.on((f) => f.t === "AUTH" && c.send(authOk(0n), msgs(0, entry(S(5), "a"), entry(S(4), "b")), { t: "SYNCED", seq: S(5) })));
  await waitFor("live", () => client.state.type === "live");
  assert.deepEqual(applied.map((e) => e.id), ["a"]);
  assert.equal(client.stats.mailboxSeqRegressionCount, 1);
});

test("client - reconnects with backoff and honours GOAWAY; a replaced session (4409) stops", async () => {
  const { g, client } = await rig((c, n) => c.on((f) => {
    if (f.t !== "AUTH") return;
    c.send(authOk(0n), { t: "SYNCED", seq: 0n });
    if (n === 0) setTimeout(() => c.ws.close(4500), 20);
    if (n === 1) setTimeout(() => (c.send({ t: "GOAWAY", reason: "drain", retry_ms: 300 }), c.ws.close(1001)), 20);
    if (n === 2) setTimeout(() => c.ws.close(4409), 20);
  }));
  await waitFor("third connection", () => g.conns.length === 3, { timeoutMs: 5000 });
  await waitFor("closed for good", () => client.state.type === "closed");
  assert.equal(g.conns.length, 3);
  assert.ok(client.stats.reconnects >= 2);
});

test("client - SEND resolves on SEND_OK and is resent with the same cmid after a reconnect", async () => {
  const { g, client } = await rig((c, n) => c.on((f) => {
    if (f.t === "AUTH") c.send(authOk(0n), { t: "SYNCED", seq: 0n });
    if (f.t === "SEND" && n === 0) c.ws.close(4500); // lost before SEND_OK
    if (f.t === "SEND" && n === 1) c.send({ t: "SEND_OK", id: f.id, cmid: f.cmid, dup: true });
  }));
  await waitFor("live", () => client.state.type === "live");
  const r = await client.send(new Uint8Array([7]), "c-42");
  assert.deepEqual(r, { dup: true });
  const sent = g.conns.flatMap((c) => c.got).filter((f) => f.t === "SEND");
  assert.deepEqual(sent.map((f) => f.t === "SEND" && f.cmid), ["c-42", "c-42"]);
});

test("client - backoff: full jitter under an exponential ceiling, capped", () => {
  const o = { baseMs: 100, capMs: 5000 };
  for (let a = 0; a < 20; a++) {
    const ceiling = Math.min(5000, 100 * 2 ** a);
    assert.equal(reconnectDelay(a, o, () => 0), 0);
    const top = reconnectDelay(a, o, () => 0.999999);
    assert.ok(top <= ceiling && top >= ceiling * 0.99, `attempt ${a}: ${top} vs ${ceiling}`);
  }
  for (let i = 0; i < 1000; i++) assert.ok(reconnectDelay(3, o) < 800);
});

test("client - cursor stores keep seqs above 2^53 and refuse garbage", async () => {
  const c = { ...tok(4, 40_000), seq: composeSeq(40_000, 123) };
  assert.deepEqual(deserializeCursor(serializeCursor(c)), c);
  for (const bad of [null, "", "{", "{}", JSON.stringify({ ...JSON.parse(serializeCursor(c)), seq: 5 }), JSON.stringify({ ...JSON.parse(serializeCursor(c)), sig: "zz" })]) {
    assert.equal(deserializeCursor(bad), undefined, String(bad));
  }
  const file = new FileCursorStore(join(mkdtempSync(join(tmpdir(), "jetgate-cursor-")), "sub", "cursor.json"));
  assert.equal(await file.load(), undefined);
  await file.save(c);
  assert.deepEqual(await file.load(), c);
  await file.clear();
  assert.equal(await file.load(), undefined);
});

test("client - refreshes its token before it expires: REFRESH with a fresh token, then again after REFRESH_OK", async () => {
  const jwt = (expInS: number) => `h.${Buffer.from(JSON.stringify({ sub: "u", exp: Math.floor(Date.now() / 1000) + expInS })).toString("base64url")}.s`;
  let issued = 0;
  const { g } = await rig(
    (c) => c.on((f) => {
      if (f.t === "AUTH") c.send(authOk(0n), { t: "SYNCED", seq: 0n });
      if (f.t === "REFRESH") c.send({ t: "REFRESH_OK", exp: (Math.floor(Date.now() / 1000) + 2) * 1000 });
    }),
    // the first token has 2 s left: refreshed after ~1 s (never sooner than 1 s); each refresh asks the app again
    {
      token: () => {
        issued++;
        return jwt(2);
      },
    },
  );
  await waitFor("a REFRESH", () => g.conns[0]!.got.some((f) => f.t === "REFRESH"), { timeoutMs: 5000 });
  const first = g.conns[0]!.got.find((f) => f.t === "REFRESH")!;
  assert.ok(first.t === "REFRESH" && first.token.split(".").length === 3);
  await waitFor("a second REFRESH after REFRESH_OK", () => g.conns[0]!.got.filter((f) => f.t === "REFRESH").length >= 2, { timeoutMs: 5000 });
  assert.equal(g.conns.length, 1, "on the same connection");
  assert.ok(issued >= 3, "the app was asked for a token at AUTH and at each refresh");
});

test("client - refreshDelay: three quarters of what is left, never under a second, so a short token is never a refresh loop", async () => {
  const { refreshDelay } = await import("../../client/token-refresh.js");
  for (const [left, want] of [
    [3_600_000, 2_700_000],
    [60_000, 45_000], // 60 s tokens: once in 45 s (it was every second: "at least a minute before" left nothing)
    [61_000, 45_750],
    [2_000, 1_500],
    [1_000, 1_000],
    [0, 1_000],
    [-5_000, 1_000],
    [10 * 2 ** 31, 2 ** 31 - 1],
  ] as const) assert.equal(refreshDelay(left), want, `${left} ms left`);
});

test("client - tokens of a minute are not refreshed every second: no REFRESH in the first 2.5 s of a 60 s token", async () => {
  const jwt = (expInS: number) => `h.${Buffer.from(JSON.stringify({ sub: "u", exp: Math.floor(Date.now() / 1000) + expInS })).toString("base64url")}.s`;
  const { g, client } = await rig(
    (c) => c.on((f) => {
      if (f.t === "AUTH") c.send(authOk(0n), { t: "SYNCED", seq: 0n });
      if (f.t === "REFRESH") c.send({ t: "REFRESH_OK", exp: Date.now() + 60_000 });
    }),
    { token: () => jwt(60) },
  );
  await waitFor("live", () => client.state.type === "live");
  await sleep(2500);
  assert.deepEqual(g.conns[0]!.got.filter((f) => f.t === "REFRESH"), [], "the next refresh is 45 s away");
});

test("client - a token() that never answers is bounded by connectTimeoutMs: the attempt is given up and tried again", async () => {
  let calls = 0;
  const { g, client } = await rig(
    (c) => c.on((f) => f.t === "AUTH" && c.send(authOk(0n), { t: "SYNCED", seq: 0n })),
    {
      connectTimeoutMs: 300,
      // the first call hangs for good; the next ones answer
      token: () => (++calls === 1 ? new Promise<string>(() => undefined) : "jwt"),
    },
  );
  const t0 = Date.now();
  await waitFor("live after the hung token() was given up", () => client.state.type === "live", { timeoutMs: 3000 });
  assert.ok(Date.now() - t0 < 2000, "within the connect timeout and a backoff");
  assert.ok(calls >= 2, "asked again");
  assert.equal(g.conns.length, 1, "no socket was opened for the hung attempt");
});

test("client - tokenExpiry reads exp without verifying, and nothing from garbage", async () => {
  const { tokenExpiry } = await import("../../client/token-refresh.js");
  const body = Buffer.from(JSON.stringify({ exp: 1700000000 })).toString("base64url");
  assert.equal(tokenExpiry(`a.${body}.c`), 1700000000 * 1000);
  assert.equal(tokenExpiry("jwt"), undefined);
  assert.equal(tokenExpiry("a.%%%.c"), undefined);
  assert.equal(tokenExpiry(undefined), undefined);
});

test("client - the backend's two disconnects: 4300 reconnects at once asking for a token again; 4403 stops, says signed_out, and fails pending sends", async () => {
  let tokens = 0;
  const events: string[] = [];
  const { g, client } = await rig((c, n) => c.on((f) => {
    if (f.t !== "AUTH") return;
    c.send(authOk(0n), { t: "SYNCED", seq: 0n });
    if (n === 0) setTimeout(() => c.ws.close(4300, "new token"), 20);
    if (n === 1) setTimeout(() => c.ws.close(4403, "signed out by admin"), 100);
  }), { token: () => `jwt${++tokens}`, backoff: { baseMs: 5_000, capMs: 5_000 } });
  client.on((e) => void ((e.type === "signed_out" || e.type === "reconnect_requested") && events.push(`${e.type}: ${e.reason}`)));
  const t0 = Date.now();
  await waitFor("the second connection", () => g.conns.length === 2 && client.state.type === "live", { timeoutMs: 3000 });
  assert.ok(Date.now() - t0 < 2_000, "at once, not after the 5 s backoff");
  const second = g.conns[1]!.got[0]!;
  assert.ok(second.t === "AUTH" && second.token === "jwt2", "a fresh token for the reconnect");
  const pending = client.send(new Uint8Array([1]), "c-1").then(() => undefined, (err: Error) => err);
  await waitFor("closed for good", () => client.state.type === "closed");
  const failed = await pending;
  assert.ok(failed?.name === "SignedOutError" && /signed out by admin/.test(failed.message), String(failed));
  assert.deepEqual(events, ["reconnect_requested: new token", "signed_out: signed out by admin"]);
  assert.deepEqual(client.state, { type: "closed", reason: "signed out: signed out by admin" });
  await sleep(300);
  assert.equal(g.conns.length, 2, "no reconnect after a sign-out");
});
