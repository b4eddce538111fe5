/**
 * The frame fuzzer: hostile bytes against a live gateway, one connection per case (before or after
 * a valid AUTH). Frames come from fast-check: random bytes, random msgpack values, frame-shaped maps
 * with wrong fields, mutated and truncated valid frames, deep nesting, huge declared lengths,
 * extension types, and text frames. Every answer is checked against the protocol: the gateway's
 * frames decode, a fatal ERROR is followed by the close code its error code names, and every close
 * code is a documented one.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { pack, encodeFrame, type ClientFrame } from "../../protocol/index.js";
import { TestDevice, deviceToken } from "../harness/device.js";
import { sleep } from "../harness/wait.js";

/** The close code each fatal error code must come with (protocol.md). */
const CLOSE_FOR: Record<string, number> = { BAD_FRAME: 4400, UNAUTHORIZED: 4401, TOO_LARGE: 4413, RATE_LIMITED: 4429, INTERNAL: 4500 };
const DOCUMENTED_CLOSES = new Set([4400, 4401, 4413, 4429]);

export interface FuzzCase {
  kind: string;
  afterAuth: boolean;
  data: Uint8Array | string;
}

const VALID: ClientFrame[] = [
  { t: "PING", id: 7 },
  { t: "ACK", seq: 123n },
  { t: "PULL", id: 1, after: 0n, limit: 10 },
  { t: "SEND", id: 2, cmid: "c1", b: new Uint8Array([1, 2, 3]) },
  { t: "REFRESH", id: 3, token: "x.y.z" },
  // AUTH last: the control group below takes every frame but the last
  { t: "AUTH", v: 1, token: "x.y.z", device: "d", cursor: { shard: 0, epoch: 1, log: "abc", seq: 5n, sig: new Uint8Array(16) } },
];

function nested(depth: number, asMap: boolean): Uint8Array {
  const b = new Uint8Array(depth * (asMap ? 3 : 1) + 1);
  let p = 0;
  for (let i = 0; i < depth; i++) {
    if (asMap) {
      b[p++] = 0x81; // fixmap of 1
      b[p++] = 0xa1; // fixstr "t"
      b[p++] = 0x74;
    } else b[p++] = 0x91; // fixarray of 1
  }
  b[p] = 0xc0;
  return b;
}

const u8 = (...xs: number[]) => new Uint8Array(xs);

const arbCase: fc.Arbitrary<FuzzCase> = fc.record({
  afterAuth: fc.boolean(),
  payload: fc.oneof(
    fc.uint8Array({ maxLength: 300 }).map((data) => ({ kind: "random bytes", data })),
    fc.anything({ withBigInt: true, withMap: true, withSet: true, withTypedArray: true, withDate: true, withNullPrototype: true, maxDepth: 4 })
      .map((v) => ({ kind: "random msgpack", data: safePack(v) })),
    fc.record({
      t: fc.constantFrom("AUTH", "ACK", "PULL", "SEND", "PING", "REFRESH", "auth", "", "MSGS", "__proto__"),
      v: fc.option(fc.oneof(fc.integer(), fc.string(), fc.bigInt())),
      id: fc.option(fc.oneof(fc.integer({ min: -10, max: 2 ** 40 }), fc.double(), fc.string())),
      seq: fc.option(fc.oneof(fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }), fc.integer(), fc.string())),
      after: fc.option(fc.oneof(fc.bigInt({ min: -1n, max: 2n ** 65n }), fc.constant(null))),
      limit: fc.option(fc.oneof(fc.integer({ min: -5, max: 10_000_000 }), fc.double())),
      token: fc.option(fc.oneof(fc.string({ maxLength: 50 }), fc.uint8Array({ maxLength: 20 }))),
      device: fc.option(fc.oneof(fc.string({ maxLength: 80 }), fc.constant("a.b"), fc.constant("*"), fc.constant(">"))),
      cmid: fc.option(fc.string({ maxLength: 80 })),
      b: fc.option(fc.oneof(fc.uint8Array({ maxLength: 64 }), fc.string())),
      lane: fc.option(fc.string({ maxLength: 40 })),
      cursor: fc.option(fc.anything({ maxDepth: 2 })),
    }, { requiredKeys: ["t"] }).map((m) => ({ kind: "frame-shaped", data: safePack(m) })),
    fc.record({ i: fc.nat(VALID.length - 1), at: fc.nat(), byte: fc.nat(255), cut: fc.nat(), mode: fc.constantFrom("flip", "truncate", "append") })
      .map(({ i, at, byte, cut, mode }) => {
        const valid = encodeFrame(VALID[i]!);
        const b = new Uint8Array(valid);
        if (mode === "flip") b[at % b.length] = byte;
        return { kind: `mutated ${mode}`, data: mode === "truncate" ? b.slice(0, cut % b.length) : mode === "append" ? new Uint8Array([...b, byte]) : b };
      }),
    fc.record({ depth: fc.integer({ min: 100, max: 40_000 }), asMap: fc.boolean() }).map(({ depth, asMap }) => ({ kind: "deep nesting", data: nested(depth, asMap) })),
    fc.constantFrom(
      u8(0xdb, 0xff, 0xff, 0xff, 0xff, 0x61), // str32 of 4 GiB
      u8(0xc6, 0x7f, 0xff, 0xff, 0xff, 0x00), // bin32 of 2 GiB
      u8(0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0), // array32 of 4G elements
      u8(0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 0x74, 0xc0), // map32 of 4G pairs
      u8(0xc9, 0xff, 0xff, 0xff, 0xff, 0x05, 0x00), // ext32 of 4 GiB
    ).map((data) => ({ kind: "huge declared length", data })),
    fc.record({ type: fc.integer({ min: -128, max: 127 }), len: fc.constantFrom(1, 2, 4, 8, 16), body: fc.uint8Array({ minLength: 16, maxLength: 16 }) })
      .map(({ type, len, body }) => {
        const head = { 1: 0xd4, 2: 0xd5, 4: 0xd6, 8: 0xd7, 16: 0xd8 }[len]!;
        // an extension as the whole frame, and inside a frame map as a field value
        const ext = [head, type & 0xff, ...body.slice(0, len)];
        return { kind: "extension type", data: u8(0x82, 0xa1, 0x74, 0xa4, 0x50, 0x49, 0x4e, 0x47, 0xa2, 0x69, 0x64, ...ext) };
      }),
    fc.string({ maxLength: 200 }).map((s) => ({ kind: "text frame", data: s })),
    // the control group: valid frames must be taken as such
    fc.nat(VALID.length - 2).map((i) => ({ kind: "valid", data: encodeFrame(VALID[i]!) })),
  ),
}).map(({ afterAuth, payload }) => ({ afterAuth, ...payload }));

/** msgpackr packs nearly anything; what it refuses becomes plain random bytes. */
function safePack(v: unknown): Uint8Array {
  try {
    return pack(v);
  } catch {
    return u8(0xc1);
  }
}

export interface FuzzStats {
  cases: number;
  byKind: Map<string, number>;
  closes: Map<number, number>;
  /** Cases the gateway took as valid frames (the connection stayed open). */
  accepted: number;
}

/** One case on its own connection; throws (an assertion) when the answer breaks the protocol. */
async function runCase(port: number, c: FuzzCase, user: string, stats: FuzzStats): Promise<void> {
  const dev = await TestDevice.connect(port);
  try {
    if (c.afterAuth) {
      dev.send({ t: "AUTH", v: 1, token: await deviceToken(user), device: "fz" });
      await dev.next("SYNCED");
    }
    dev.sendRaw(c.data);
    const until = Date.now() + 400;
    while (dev.closed === undefined && Date.now() < until) await sleep(10);
    const where = `${c.kind} (${c.afterAuth ? "after AUTH" : "first frame"}): ${typeof c.data === "string" ? JSON.stringify(c.data.slice(0, 60)) : Buffer.from(c.data.slice(0, 40)).toString("hex")}`;
    assert.deepEqual(dev.undecodable, [], `${where}: the gateway sent a frame the codec cannot read`);
    if (dev.closed !== undefined) {
      const code = dev.closed.code;
      stats.closes.set(code, (stats.closes.get(code) ?? 0) + 1);
      assert.ok(DOCUMENTED_CLOSES.has(code), `${where}: close code ${code} is not a documented one`);
      const fatal = dev.frames.find((f) => f.t === "ERROR" && f.fatal);
      if (fatal?.t === "ERROR") assert.equal(code, CLOSE_FOR[fatal.code], `${where}: ERROR ${fatal.code} closed with ${code}`);
      else assert.fail(`${where}: closed ${code} without a fatal ERROR frame saying why`);
    } else stats.accepted++;
  } finally {
    dev.close();
  }
}

/** Runs `cases` fuzz cases, `parallel` at a time; returns what happened. */
export async function fuzzGateway(port: number, opts: { cases: number; seed: number; parallel?: number; onProgress?: (done: number) => void }): Promise<FuzzStats> {
  const stats: FuzzStats = { cases: 0, byKind: new Map(), closes: new Map(), accepted: 0 };
  const samples = fc.sample(arbCase, { numRuns: opts.cases, seed: opts.seed });
  const parallel = opts.parallel ?? 16;
  let next = 0;
  await Promise.all(
    Array.from({ length: parallel }, async (_, worker) => {
      while (next < samples.length) {
        const i = next++;
        const c = samples[i]!;
        await runCase(port, c, `fz${worker}`, stats);
        stats.cases++;
        stats.byKind.set(c.kind, (stats.byKind.get(c.kind) ?? 0) + 1);
        if (stats.cases % 1000 === 0) opts.onProgress?.(stats.cases);
      }
    }),
  );
  return stats;
}
