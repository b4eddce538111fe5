import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import {
  initialShards, bigintsAsStrings, bumpEpoch, deriveSeq, applyRecord, decodeRecord, encodeRecord, evenRange, ShardMap, userHash,
  EMPTY_REGISTRY, RegistryError, composeSeq, HASH_SPACE, MAX_EPOCH, decodeFloorRecord, encodeFloorRecord, floorRecordEpochs, newestConsumerEpoch, processingFloor, workerConsumerEpoch, workerConsumerName, type RegistryRecord, type ShardState,
} from "../../protocol/index.js";

const [s0] = initialShards(1, ["logA"]) as [ShardState];

test("registry - userHash is the documented SHA-256 prefix and stable", () => {
  // first 4 bytes of sha256("alice") = 2bd806c9
  assert.equal(userHash("alice"), 0x2bd806c9);
  assert.throws(() => userHash("a.b"), /user id/);
});

test("registry - even ranges cover the whole hash space without overlap", () => {
  for (const n of [1, 2, 3, 7, 64, 4096]) {
    let next = 0;
    for (let i = 0; i < n; i++) {
      const r = evenRange(i, n);
      assert.equal(r.lo, next);
      assert.ok(r.hi >= r.lo);
      next = r.hi + 1;
    }
    assert.equal(next, HASH_SPACE);
  }
});

test("registry - ShardMap finds the shard whose range holds the hash", () => {
  const state = applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "init", at: 0, by: "t", shards: initialShards(4, ["a", "b", "c", "d"]) });
  const map = new ShardMap(state);
  fc.assert(fc.property(fc.integer({ min: 0, max: HASH_SPACE - 1 }), (h) => {
    const s = map.shardOfHash(h)!;
    const r = state.shards.get(s)!.range;
    assert.ok(h >= r.lo && h <= r.hi);
  }));
  assert.equal(map.shardOf("alice"), Math.floor(0x2bd806c9 / 2 ** 30));
});

test("registry - seq derivation across epoch bumps in one log and across a new log", () => {
  // epoch 0 from offset 1; takeover at 11 (epoch 1); takeover at 11 again (epoch 2: nothing done in 1)
  let s = bumpEpoch(s0, { cause: "takeover", start_offset: 11 });
  s = bumpEpoch(s, { cause: "takeover", start_offset: 11 });
  assert.equal(deriveSeq(s, "logA", 5), composeSeq(0, 5));
  assert.equal(deriveSeq(s, "logA", 10), composeSeq(0, 10));
  assert.equal(deriveSeq(s, "logA", 11), composeSeq(2, 11));
  assert.equal(s.boundaries[1]!.prev_end_seq, composeSeq(0, 10));
  assert.equal(s.boundaries[2]!.prev_end_seq, composeSeq(0, 10), "nothing processed under epoch 1");
  // rebuild: a new log whose offsets restart at 1
  const r = bumpEpoch(s, { cause: "rebuild", log: "logB", start_offset: 1, prev_end_offset: 30 });
  assert.equal(r.epoch, 3);
  assert.equal(r.log, "logB");
  assert.equal(r.boundaries[3]!.prev_end_seq, composeSeq(2, 30));
  assert.equal(deriveSeq(r, "logB", 1), composeSeq(3, 1));
  assert.ok(deriveSeq(r, "logB", 1)! > deriveSeq(r, "logA", 30)!);
  assert.equal(deriveSeq(r, "logC", 1), undefined, "unknown log");
  assert.equal(deriveSeq(s0, "logA", 0), undefined, "offset 0 is before everything");
});

test("registry - derived seqs increase with offset and with every bump (property)", () => {
  fc.assert(fc.property(fc.array(fc.integer({ min: 0, max: 50 }), { minLength: 1, maxLength: 30 }), (steps) => {
    let s = s0;
    let offset = 1;
    let last = 0n;
    for (const step of steps) {
      for (let i = 0; i < step; i++) {
        const seq = deriveSeq(s, s.log, offset)!;
        assert.ok(seq > last);
        last = seq;
        offset++;
      }
      s = bumpEpoch(s, { cause: "takeover", start_offset: offset });
    }
  }));
});

test("registry - bumpEpoch refuses to pass epoch 65535", () => {
  const s: ShardState = { ...s0, epoch: MAX_EPOCH, boundaries: [{ ...s0.boundaries[0]!, epoch: MAX_EPOCH, start_seq: composeSeq(MAX_EPOCH, 1) }] };
  assert.throws(() => bumpEpoch(s, { cause: "takeover", start_offset: 2 }), RegistryError);
});

test("registry - records round-trip through JSON with seqs above 2^53", () => {
  let s = s0;
  for (let i = 0; i < 40; i++) s = bumpEpoch(s, { cause: "takeover", start_offset: 1 + i });
  const rec: RegistryRecord = { v: 1, op: "takeover", at: 1, by: "w", shards: [s] };
  const back = decodeRecord(encodeRecord(rec));
  assert.deepEqual(back, rec);
  assert.ok(back.shards[0]!.boundaries[40]!.start_seq > BigInt(Number.MAX_SAFE_INTEGER));
});

test("registry - bad records are refused by name", () => {
  const enc = (x: unknown) => new TextEncoder().encode(JSON.stringify(x, bigintsAsStrings));
  const good = { v: 1, op: "init", at: 0, by: "t", shards: [s0] };
  const cases: [string, Uint8Array][] = [
    ["not JSON", new TextEncoder().encode("{")],
    ["unknown op", enc({ ...good, op: "explode" })],
    ["no shards", enc({ ...good, shards: [] })],
    ["epoch not the last boundary", enc({ ...good, shards: [{ ...s0, epoch: 3 }] })],
    ["seq as a JSON number", enc({ ...good, shards: [{ ...s0, boundaries: [{ ...s0.boundaries[0]!, start_seq: 1 }] }] })],
    ["start_seq mismatch", enc({ ...good, shards: [{ ...s0, boundaries: [{ ...s0.boundaries[0]!, start_seq: "99" }] }] })],
    ["range inverted", enc({ ...good, shards: [{ ...s0, range: { lo: 5, hi: 1 } }] })],
    ["unsafe log id", enc({ ...good, shards: [{ ...s0, log: "a.b" }] })],
  ];
  for (const [name, bytes] of cases) assert.throws(() => decodeRecord(bytes), RegistryError, name);
});

test("registry - a record may not lower an epoch", () => {
  const bumped = bumpEpoch(s0, { cause: "takeover", start_offset: 1 });
  const st = applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "takeover", at: 0, by: "t", shards: [bumped] });
  assert.throws(() => applyRecord(st, 2, { v: 1, op: "init", at: 0, by: "t", shards: [s0] }), /lowers shard 0 epoch/);
});

test("registry - a split keeps seqs increasing for moved users and records the boundary on both shards", async () => {
  const { splitShard, halfRange } = await import("../../protocol/index.js");
  const parent = bumpEpoch(s0, { cause: "takeover", start_offset: 11 });
  const [p, c] = splitShard(parent, { child: 9, childLog: "logK", moved: halfRange(parent.range, true), cutOffset: 50 });
  assert.equal(p.epoch, 2);
  assert.equal(c.epoch, 2);
  assert.deepEqual(p.range, halfRange(parent.range, false));
  assert.equal(p.boundaries.at(-1)!.start_offset, 51);
  const split = c.splits[0]!;
  assert.deepEqual(p.splits, [split]);
  assert.equal(split.split_at_seq, composeSeq(1, 50));
  assert.ok(split.child_start_seq > split.split_at_seq, "the child's first seq is above every parent seq the user had");
  assert.equal(deriveSeq(c, "logK", 1), split.child_start_seq);
  assert.throws(() => splitShard(parent, { child: 9, childLog: "x", moved: { lo: 5, hi: 10 }, cutOffset: 1 }), RegistryError, "a middle part");
  assert.throws(() => splitShard(parent, { child: 9, childLog: "x", moved: parent.range, cutOffset: 1 }), RegistryError, "the whole range");
  // the states are valid registry records
  decodeRecord(encodeRecord({ v: 1, op: "split", at: 0, by: "t", shards: [p, c] }));
});

test("registry - a failover bump rises by its margin; a bad margin is refused", async () => {
  const b = bumpEpoch(s0, { cause: "failover", log: "logF", start_offset: 1, epochs: 100 });
  assert.equal(b.epoch, s0.epoch + 100);
  assert.equal(b.boundaries.at(-1)!.start_seq, composeSeq(s0.epoch + 100, 1));
  assert.throws(() => bumpEpoch(s0, { cause: "failover", start_offset: 1, epochs: 0 }), RegistryError);
  assert.throws(() => bumpEpoch({ ...s0, epoch: MAX_EPOCH - 5 }, { cause: "failover", start_offset: 1, epochs: 6 }), RegistryError);
});

test("registry - processingStart: from the ack floor, never below a takeover's start, but below a split's cut", async () => {
  const { processingStart, splitShard, halfRange } = await import("../../protocol/registry-model.js");
  const t = bumpEpoch(s0, { cause: "takeover", start_offset: 40 });
  assert.equal(processingStart(t, 55), 56, "one past the floor");
  assert.equal(processingStart(t, 10), 40, "a takeover boundary was written from a floor: everything below was acked");
  const [p] = splitShard(t, { child: 9, childLog: "logK", moved: halfRange(t.range, true), cutOffset: 80 });
  assert.equal(processingStart(p, 60), 61, "a split's cut may lie above the floor: what is between is still processed");
  assert.equal(processingStart(p, 95), 81, "the fenced owner acked past the cut under the old epoch: from the cut again");
  const again = bumpEpoch(p, { cause: "takeover", start_offset: 81 });
  assert.equal(processingStart(again, 95), 96, "once a takeover followed the split, the floor rules again");
});

test("registry - entryOwner: a moved user's entries stay the parent's up to split_at_seq", async () => {
  const { entryOwner, splitShard, halfRange } = await import("../../protocol/index.js");
  const [parent0] = initialShards(1, ["logP"]) as [ShardState];
  const upper = halfRange(parent0.range, true);
  const moved = Array.from({ length: 500 }, (_, i) => `m${i}`).find((u) => userHash(u) >= upper.lo)!;
  const kept = Array.from({ length: 500 }, (_, i) => `k${i}`).find((u) => userHash(u) < upper.lo)!;
  const [p] = splitShard(parent0, { child: 1, childLog: "logC", moved: upper, cutOffset: 50 });
  assert.equal(entryOwner(p, kept, composeSeq(p.epoch, 99)), "own");
  assert.equal(entryOwner(p, moved, composeSeq(0, 50)), "own", "at the cut: the parent's");
  assert.equal(entryOwner(p, moved, composeSeq(p.epoch, 51)), "forward", "after the cut: the child's");
});

test("registry - epochs written by operations are unclaimed; a worker's claim keeps the epoch, a claimed epoch is bumped", async () => {
  const { planTakeover, claimEpoch, isClaimed, splitShard, halfRange } = await import("../../protocol/index.js");
  // init: epoch 0 unclaimed; the first worker claims it, from offset 1
  assert.equal(s0.owner, null);
  assert.equal(isClaimed(s0), false);
  assert.deepEqual(planTakeover(s0, 0), { mode: "claim", startOffset: 1, boundaryStart: 1 });
  const claimed = claimEpoch(s0, "w1");
  assert.deepEqual({ ...claimed, owner: undefined }, { ...s0, owner: undefined }, "a claim changes nothing but the owner");
  assert.equal(claimed.owner, "w1");
  assert.throws(() => claimEpoch(claimed, "w2"), RegistryError, "a claimed epoch cannot be claimed again");
  // the owner crashed: the next worker bumps, as before
  assert.deepEqual(planTakeover(claimed, 30), { mode: "bump", startOffset: 31, boundaryStart: 31 });
  const bumped = bumpEpoch(claimed, { cause: "takeover", start_offset: 31, owner: "w2" });
  assert.deepEqual([bumped.epoch, bumped.owner], [1, "w2"]);
  // an operator's takeover (from the floor 40) and a worker taking the shard: one epoch in all
  const op = bumpEpoch(bumped, { cause: "takeover", start_offset: 41, owner: null });
  assert.deepEqual([op.epoch, op.owner], [2, null]);
  assert.deepEqual(planTakeover(op, 55), { mode: "claim", startOffset: 41, boundaryStart: 41 },
    "from the boundary's start: what the fenced owner processed past it went out under the old epoch");
  assert.deepEqual(planTakeover(op, 20), { mode: "claim", startOffset: 41, boundaryStart: 41 });
  assert.equal(claimEpoch(op, "w3").epoch, 2);
  // a split: parent and child unclaimed; the parent's claim keeps processingStart's rules for the cut
  const [p, c] = splitShard(claimEpoch(op, "w3"), { child: 9, childLog: "logK", moved: halfRange(op.range, true), cutOffset: 80 });
  assert.deepEqual([p.owner, c.owner, p.epoch, c.epoch], [null, null, 3, 3]);
  assert.deepEqual(planTakeover(p, 60), { mode: "claim", startOffset: 61, boundaryStart: 81 }, "the floor below the cut: from the floor, numbered by the older epoch");
  assert.deepEqual(planTakeover(p, 95), { mode: "claim", startOffset: 81, boundaryStart: 81 }, "past the cut: from the cut");
  assert.deepEqual(planTakeover(c, 0), { mode: "claim", startOffset: 1, boundaryStart: 1 });
  // rebuild and failover: a new log, unclaimed, consumed from its start
  const rb = bumpEpoch(claimEpoch(op, "w3"), { cause: "rebuild", log: "logR", start_offset: 1, prev_end_offset: 90, owner: null });
  assert.deepEqual(planTakeover(rb, 0), { mode: "claim", startOffset: 1, boundaryStart: 1 });
});

test("registry - an owner left out (records of older versions) counts as claimed: the worker bumps", async () => {
  const { planTakeover, isClaimed, claimEpoch } = await import("../../protocol/index.js");
  const old: ShardState = { ...s0 };
  delete old.owner;
  assert.equal(isClaimed(old), true);
  assert.equal(planTakeover(old, 0).mode, "bump");
  assert.throws(() => claimEpoch(old, "w1"), RegistryError);
  // parsed from JSON without the field: still absent
  const back = decodeRecord(encodeRecord({ v: 1, op: "init", at: 0, by: "t", shards: [old] }));
  assert.equal("owner" in back.shards[0]!, false);
  assert.equal(isClaimed(back.shards[0]!), true);
  // null survives JSON (it is not the same as absent)
  assert.equal(decodeRecord(encodeRecord({ v: 1, op: "init", at: 0, by: "t", shards: [s0] })).shards[0]!.owner, null);
  // bumpEpoch without an owner leaves it out (claimed, the safe default); the previous owner is not carried over
  const b = bumpEpoch({ ...s0, owner: "w1" }, { cause: "takeover", start_offset: 5 });
  assert.equal("owner" in b, false);
  assert.throws(() => decodeRecord(encodeRecord({ v: 1, op: "takeover", at: 0, by: "t", shards: [{ ...s0, owner: "x".repeat(129) }] })), RegistryError, "owner too long");
});

test("registry - at one epoch the owner only goes from unclaimed to a worker: no two workers share an epoch", async () => {
  const { claimEpoch } = await import("../../protocol/index.js");
  const rec = (s: ShardState): RegistryRecord => ({ v: 1, op: "takeover", at: 0, by: "t", shards: [s] });
  let st = applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "init", at: 0, by: "t", shards: [s0] });
  st = applyRecord(st, 2, rec(claimEpoch(s0, "w1")));
  assert.equal(st.shards.get(0)!.owner, "w1");
  assert.throws(() => applyRecord(st, 3, rec({ ...s0, owner: "w2" })), /reassigns epoch 0 of shard 0, claimed by w1/);
  assert.throws(() => applyRecord(st, 3, rec({ ...s0, owner: null })), /reassigns epoch 0/, "back to unclaimed");
  const legacy: ShardState = { ...s0 };
  delete legacy.owner;
  const old = applyRecord(EMPTY_REGISTRY, 1, rec(legacy));
  assert.throws(() => applyRecord(old, 2, rec({ ...s0, owner: "w2" })), /reassigns epoch 0/, "an epoch of an older version is claimed");
  // a newer epoch may say anything
  const next = applyRecord(st, 3, rec(bumpEpoch(st.shards.get(0)!, { cause: "takeover", start_offset: 9, owner: null })));
  assert.equal(next.shards.get(0)!.owner, null);
});

test("registry - a planned release gives the epoch back at an offset; the next worker resumes it from the offset after, no epoch spent", async () => {
  const { claimEpoch, releaseEpoch, planTakeover, processingStart, splitShard, halfRange } = await import("../../protocol/registry-model.js");
  const claimed = claimEpoch(bumpEpoch(s0, { cause: "takeover", start_offset: 20, owner: null }), "w1");
  const released = releaseEpoch(claimed, "w1", 57);
  assert.deepEqual([released.epoch, released.owner, released.released_offset], [claimed.epoch, null, 57]);
  assert.deepEqual(released.boundaries, claimed.boundaries, "nothing renumbered");
  assert.throws(() => releaseEpoch(claimed, "w2", 57), /not claimed by w2 \(w1\)/, "only the owner releases");
  assert.throws(() => releaseEpoch(released, "w1", 58), /not claimed by w1 \(unclaimed\)/, "released once");
  // the next worker: the same epoch, from the offset after the release, whatever the consumer's floor says
  assert.deepEqual(planTakeover(released, 50), { mode: "resume", startOffset: 58, boundaryStart: 20 });
  assert.deepEqual(planTakeover(released, 0), { mode: "resume", startOffset: 58, boundaryStart: 20 });
  const resumed = claimEpoch(released, "w2");
  assert.deepEqual([resumed.epoch, resumed.owner, resumed.released_offset], [claimed.epoch, "w2", 57]);
  // the resumer crashed before its consumer acked anything: the bump starts after the release, not at the floor
  assert.equal(processingStart(resumed, 0), 58);
  assert.deepEqual(planTakeover(resumed, 0), { mode: "bump", startOffset: 58, boundaryStart: 58 });
  assert.deepEqual(planTakeover(resumed, 70), { mode: "bump", startOffset: 71, boundaryStart: 71 });
  // a bump of any cause drops the release: it belonged to the older epoch
  assert.equal(bumpEpoch(resumed, { cause: "takeover", start_offset: 71, owner: "w3" }).released_offset, undefined);
  const [parent, child] = splitShard(released, { child: 5, childLog: "logS", moved: halfRange(released.range, true), cutOffset: 90 });
  assert.deepEqual([parent.released_offset, child.released_offset], [undefined, undefined]);
  assert.equal(planTakeover(parent, 57).mode, "claim", "after a split the split's own rules again");
  // a released epoch of a split: the releaser did what the split asks, so the resume starts after its offset
  const firstAfterSplit = releaseEpoch(claimEpoch(parent, "w4"), "w4", 95);
  assert.deepEqual(planTakeover(firstAfterSplit, 95), { mode: "resume", startOffset: 96, boundaryStart: 91 });
  // the record round-trips
  const back = decodeRecord(encodeRecord({ v: 1, op: "release", at: 0, by: "w1", shards: [released] }));
  assert.equal(back.shards[0]!.released_offset, 57);
});

test("registry - only the owner's release record gives a claimed epoch up, never lowering its offset or changing its boundaries", async () => {
  const { claimEpoch, releaseEpoch } = await import("../../protocol/index.js");
  const rec = (s: ShardState, op: RegistryRecord["op"] = "release", by = "w1"): RegistryRecord => ({ v: 1, op, at: 0, by, shards: [s] });
  let st = applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "init", at: 0, by: "t", shards: [s0] });
  st = applyRecord(st, 2, rec(claimEpoch(s0, "w1"), "takeover"));
  const released = releaseEpoch(st.shards.get(0)!, "w1", 40);
  assert.throws(() => applyRecord(st, 3, rec(released, "release", "w2")), /a release by w2, not by the owner/);
  assert.throws(() => applyRecord(st, 3, rec(released, "takeover")), /only its owner's release may give it up/);
  assert.throws(() => applyRecord(st, 3, rec({ ...released, released_offset: undefined })), /without the offset/);
  const moved = { ...released, boundaries: [...released.boundaries, { ...released.boundaries[0]!, epoch: 0 }] };
  assert.throws(() => applyRecord(st, 3, rec(moved)), /changes the log or the boundaries/);
  assert.throws(() => applyRecord(st, 3, rec({ ...released, owner: "w2" }, "release")), /only its owner's release may give it up/, "a release hands to nobody");
  st = applyRecord(st, 3, rec(released));
  assert.deepEqual([st.shards.get(0)!.owner, st.shards.get(0)!.released_offset], [null, 40]);
  // resumed by w2, then released again: the offset may not go back
  st = applyRecord(st, 4, rec(claimEpoch(st.shards.get(0)!, "w2"), "takeover", "w2"));
  assert.throws(() => applyRecord(st, 5, rec(releaseEpoch(st.shards.get(0)!, "w2", 39), "release", "w2")), /below the previous one \(40\)/);
  st = applyRecord(st, 5, rec(releaseEpoch(st.shards.get(0)!, "w2", 40), "release", "w2"));
  assert.equal(st.shards.get(0)!.epoch, 0, "two handoffs, no epoch spent");
});

test("registry - ShardMap.seqOf numbers an offset of a shard's current log as deriveSeq does", () => {
  const t = bumpEpoch(s0, { cause: "takeover", start_offset: 11, owner: "w" });
  const map = new ShardMap(applyRecord(EMPTY_REGISTRY, 1, { v: 1, op: "takeover", at: 0, by: "t", shards: [t] }));
  assert.equal(map.seqOf(0, 10), composeSeq(0, 10));
  assert.equal(map.seqOf(0, 11), composeSeq(1, 11));
  assert.equal(map.seqOf(7, 1), undefined, "unknown shard");
});

test("processing floor: the newest epoch's worker consumer, not the highest floor (a claimer that died before deleting the older consumer)", () => {
  const c = (name: string, floor: number) => ({ name, ack_floor: { stream_seq: floor } });
  assert.equal(processingFloor([]), 0);
  assert.equal(processingFloor([c("rd_ab12", 900)]), 0, "a gateway's read consumer is not a worker's");
  assert.equal(processingFloor([c("w_3", 40)]), 40);
  // the previous owner acked to 120 under epoch 3; the claimer of epoch 4 started at 100 and died
  assert.equal(processingFloor([c("w_3", 120), c("w_4", 99)]), 99);
  assert.equal(processingFloor([c("w_4", 99), c("w_3", 120), c("w_10", 7)]), 7, "epochs compared as numbers");
  assert.equal(workerConsumerEpoch("w_65535"), 65535);
  assert.equal(workerConsumerEpoch("w_x"), undefined);
  assert.equal(workerConsumerEpoch("w_1_2"), undefined);
  fc.assert(fc.property(fc.array(fc.record({ epoch: fc.integer({ min: 0, max: 65535 }), floor: fc.nat() }), { minLength: 1, maxLength: 8 }), (cs) => {
    const newest = cs.reduce((a, b) => (b.epoch > a.epoch ? b : a));
    const named = cs.map((x) => c(workerConsumerName(x.epoch), x.floor));
    // the first consumer of the newest epoch in the list (two of one epoch never exist: one durable name)
    assert.equal(processingFloor(named), named[cs.indexOf(newest)]!.ack_floor.stream_seq);
  }));
});

test("processing floor: an epoch's floor record stands for its consumer only when no consumer of that epoch or a newer one is listed", () => {
  const c = (name: string, floor: number) => ({ name, ack_floor: { stream_seq: floor } });
  // the consumer of epoch 5 was lost with its node (R1); its worker recorded 310
  assert.equal(processingFloor([], { epoch: 5, offset: 310 }), 310, "nothing listed");
  assert.equal(processingFloor([c("w_4", 400)], { epoch: 5, offset: 310 }), 310, "an older epoch's higher floor is not it (a claimer starts below)");
  assert.equal(processingFloor([c("w_5", 330)], { epoch: 5, offset: 310 }), 330, "the consumer itself: its ack floor (the record lags it)");
  assert.equal(processingFloor([c("w_6", 12)], { epoch: 5, offset: 310 }), 12, "a newer epoch's consumer");
  assert.equal(newestConsumerEpoch(["rd_1", "w_3", "w_10", "w_9"]), 10);
  assert.equal(newestConsumerEpoch([]), -1);
  assert.deepEqual(floorRecordEpochs(["w_5"], 5), [], "the registry's epoch's consumer is listed: no record read");
  assert.deepEqual(floorRecordEpochs(["w_3"], 5), [5, 4], "newest first, down to the listed consumer's");
  assert.equal(floorRecordEpochs([], 40).length, 16, "at most 16 epochs back");
  const bytes = encodeFloorRecord({ epoch: 7, offset: 2 ** 40 });
  assert.deepEqual(decodeFloorRecord(bytes), { epoch: 7, offset: 2 ** 40 });
  for (const bad of ['{"epoch":70000,"offset":1}', '{"epoch":1,"offset":-1}', '{"epoch":1}', '{"epoch":1,"offset":1,"x":1}', "not json"]) {
    assert.throws(() => decodeFloorRecord(new TextEncoder().encode(bad)), `refused: ${bad}`);
  }
});

test("labels - a hash range in hex, eight digits each end (the CLI's and the console's); counts with separators", async () => {
  const { rangeLabel, countLabel } = await import("../../protocol/hash.js");
  const { evenRange } = await import("../../protocol/index.js");
  assert.equal(rangeLabel(evenRange(0, 2)), "0x00000000-0x7fffffff");
  assert.equal(rangeLabel(evenRange(1, 2)), "0x80000000-0xffffffff");
  assert.equal(rangeLabel({ lo: 0x1f, hi: 0x20 }), "0x0000001f-0x00000020");
  assert.equal(countLabel(65_535), "65,535");
  assert.equal(countLabel(7), "7");
});
