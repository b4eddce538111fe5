import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket, { WebSocketServer } from "ws";
import { composeSeq, decodeClientFrame, encodeFrame, type ClientFrame, type Entry, type ServerFrame } from "../../protocol/device.js";
import {
  JetgateClient, MemoryCursorStore, reconnectDelay, serializeCursor, deserializeCursor, type ClientOptions, type WebSocketFactory,
} from "../../client/index.js";
import { FileCursorStore } from "../../client/node.js";
import { waitFor } from "../harness/wait.js";

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
const authOk = (from: bigint, cursor = tok()): ServerFrame => ({ t: "AUTH_OK", session: "s", user: "u", shard: cursor.shard, epoch: cursor.epoch, cursor, from, head: from, trim: 0n, lanes: {}, hb: 25000 });
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

test("client - tokenExpiry reads exp without verifying, and nothing from garbage", async () => {
  const { tokenExpiry } = await import("../../client/client.js");
  const body = Buffer.from(JSON.stringify({ exp: 1700000000 })).toString("base64url");
  assert.equal(tokenExpiry(`a.${body}.c`), 1700000000 * 1000);
  assert.equal(tokenExpiry("jwt"), undefined);
  assert.equal(tokenExpiry("a.%%%.c"), undefined);
  assert.equal(tokenExpiry(undefined), undefined);
});
