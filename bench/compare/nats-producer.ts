/**
 * A producer process of `npm run bench` for the systems that append to JetStream, one per node:
 * `dispatcher` is jetgate's (the Dispatcher library, as a backend runs it); `bare` is
 * jetstream-limit's (the same appends as the Dispatcher makes: core publish with a reply inbox, a
 * Nats-Msg-Id header, one event-loop turn's publishes written together, but no per-user chain and
 * no checks).
 *
 *   node --import tsx bench/compare/nats-producer.ts <dispatcher|bare> <nats url> <index>
 * Commands (JSON lines), one answer each:
 *   {"cmd":"send","seconds":S,"users":N,"rate"?:R}  entries to random users of u0..u(N-1) -> {"sent":K}
 *   {"cmd":"each","from":A,"to":B,"perUser":K}      K entries to each of uA..u(B-1), acknowledged -> {"sent":K}
 *   {"cmd":"stages"}                                 the Dispatcher's stage counts so far -> {"dispatch_queue":[...],"dispatch_ack":[...]}
 */
import { createInterface } from "node:readline";
import { connect, headers } from "@nats-io/transport-node";
import { emptyStageCounts, encodeStoredEntry, entrySubject, observeStage } from "../../protocol/index.js";
import { Dispatcher, RegistryClient } from "../../protocol/io/index.js";
import { Window } from "../window.js";
import { idSource, paced, stampedBody } from "./entries.js";

const [mode, natsUrl, index] = [process.argv[2] as "dispatcher" | "bare", process.argv[3]!, Number(process.argv[4])];
const nc = await connect({ servers: natsUrl.split(",") });
const registry = await RegistryClient.open(nc);
const nextId = idSource(index);
const answer = (o: object) => process.stdout.write(JSON.stringify(o) + "\n");

/** Appends one entry for each of `users`; resolves once every one is acknowledged. */
let append: (users: string[]) => Promise<unknown>;
/** The Dispatcher's stages (protocol/stages.ts), counted from the start. */
const stages = { dispatch_queue: emptyStageCounts(), dispatch_ack: emptyStageCounts() };
if (mode === "dispatcher") {
  // BENCH_MAX_BATCH=1: the Dispatcher without atomic batches (one entry per user in flight), to compare
  // BENCH_MIN_BATCH: the fewest queued entries that go as a batch (default 64)
  const maxBatch = process.env.BENCH_MAX_BATCH !== undefined ? Number(process.env.BENCH_MAX_BATCH) : undefined;
  const minBatch = process.env.BENCH_MIN_BATCH !== undefined ? Number(process.env.BENCH_MIN_BATCH) : undefined;
  const d = new Dispatcher(nc, () => registry.shards, {
    lanes: ["default"], maxInFlight: 5000,
    timings: { queued: (sec) => observeStage(stages.dispatch_queue, sec), acked: (sec) => observeStage(stages.dispatch_ack, sec) },
    ...(maxBatch !== undefined ? { maxBatch } : {}), ...(minBatch !== undefined ? { minBatch } : {}) });
  append = (users) => {
    const id = `p${index}x${nextId()}`;
    return d.dispatch({ dispatch_id: id, message_id: id, lane: "default", recipients: users, body: stampedBody(nextId()) });
  };
} else {
  const inbox = `_INBOX.jsl.${index}.${Math.random().toString(36).slice(2)}`;
  const acks = new Map<string, () => void>();
  nc.subscribe(`${inbox}.*`, {
    callback: (_e, m) => {
      const k = m.subject.slice(inbox.length + 1);
      acks.get(k)?.();
      acks.delete(k);
    },
  });
  const outbox: (() => void)[] = [];
  const publishOutbox = () => {
    for (const p of outbox.splice(0)) p();
  };
  const one = (user: string) =>
    new Promise<void>((resolve) => {
      const id = `j${nextId()}`;
      const h = headers();
      h.set("Nats-Msg-Id", id);
      acks.set(id, resolve);
      const data = encodeStoredEntry({ id, d: id, ts: Date.now(), b: stampedBody(nextId()) });
      const subject = entrySubject(registry.shards.shardOf(user)!, user, "default");
      outbox.push(() => nc.publish(subject, data, { reply: `${inbox}.${id}`, headers: h }));
      if (outbox.length === 1) setImmediate(publishOutbox);
    });
  append = (users) => Promise.all(users.map(one));
}

for await (const line of createInterface({ input: process.stdin })) {
  const cmd = JSON.parse(line) as { cmd: string; seconds?: number; users?: number; rate?: number; from?: number; to?: number; perUser?: number };
  if (cmd.cmd === "send") {
    const pick = () => [`u${Math.floor(Math.random() * cmd.users!)}`];
    answer({ sent: await paced(cmd.seconds!, cmd.rate, 5000, () => append(pick())) });
  } else if (cmd.cmd === "each") {
    // jetgate: 100 recipients per dispatch, as a backend fanning out would; bare: one append each
    const per = mode === "dispatcher" ? 100 : 1;
    const w = new Window(mode === "dispatcher" ? 200 : 5000);
    let sent = 0;
    for (let k = 0; k < cmd.perUser!; k++) {
      for (let u = cmd.from!; u < cmd.to!; u += per) {
        const users = Array.from({ length: Math.min(per, cmd.to! - u) }, (_, i) => `u${u + i}`);
        await w.add(append(users));
        sent += users.length;
      }
    }
    await w.drained();
    answer({ sent });
  } else if (cmd.cmd === "stages") {
    answer(stages);
  } else if (cmd.cmd === "exit") {
    await registry.close();
    await nc.close();
    process.exit(0);
  }
}
