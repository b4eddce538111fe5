/**
 * A DispatchLink in memory for the Dispatcher's unit tests (test/unit/dispatcher*.test.ts): one
 * shard stream with JetStream's dedup by Nats-Msg-Id and all-or-none atomic batches, answers that
 * can be lost or refused as a test says, and a nats-server that can stop reading (SIGSTOP).
 */
import type { AckAnswer } from "../../protocol/dispatch-ack.js";
import type { BatchPlace, DispatchLink } from "../../protocol/io/dispatch-link.js";

export const json = (v: unknown): AckAnswer => ({ data: new TextEncoder().encode(JSON.stringify(v)) });

/**
 * What the fake stream does with a publish (or a batch's commit): append it and answer; append it
 * and lose the answer ("lost"); neither ("drop"); have the client refuse it ("throw"); stop reading
 * from it on ("stall": FakeLink.stall); or answer as told.
 */
export type Policy = (p: { msgIds: string[]; attempt: number }) => "append" | "lost" | "drop" | "throw" | "stall" | AckAnswer;

/** A publish or batch commit handed to the fake client: what it carries and the token it is answered under. */
interface Wire {
  msgIds: string[];
  data: Uint8Array[];
  batch: boolean;
  token: string;
  /** How many times these msgIds were handed over, this time included. */
  attempt: number;
}

/**
 * One shard stream behind a fake NATS connection: offsets from 1, dedup by Nats-Msg-Id, atomic
 * batches all or none. `stall()` is nats-server stopped: what is published waits in the client,
 * unread and unanswered, and so does a PING (flush), until `resume()` reads it all in order.
 */
export class FakeLink implements DispatchLink {
  readonly name = "fake";
  down: string | undefined;
  closed = false;
  policy: Policy = () => "append";
  /** The stream: msgId and bytes by offset - 1. */
  readonly log: { id: string; data: Uint8Array }[] = [];
  /** Every publish and batch commit, in order. */
  readonly published: { msgIds: string[]; batch: boolean }[] = [];
  /** Publishes whose answer has not come, at most at once. */
  unanswered = 0;
  peakUnanswered = 0;
  /** While stalled: what the client holds unread, and its most entry bytes. */
  private held: Wire[] | undefined;
  private pings: (() => void)[] = [];
  heldBytes = 0;
  peakHeldBytes = 0;
  private onAnswer!: (token: string, a: AckAnswer) => void;
  private staged: { id: string; data: Uint8Array }[] = [];
  private readonly attempts = new Map<string, number>();

  listen(onAnswer: (token: string, a: AckAnswer) => void): void {
    this.onAnswer = onAnswer;
  }
  unavailable(): string | undefined {
    return this.down;
  }
  close(): void {
    this.closed = true;
  }
  flush(): Promise<void> {
    return new Promise((resolve) => (this.held !== undefined ? this.pings.push(resolve) : setImmediate(resolve)));
  }
  stored(_shard: number, offset: number): Promise<Uint8Array | undefined> {
    return Promise.resolve(this.log[offset - 1]?.data);
  }
  stall(): void {
    this.held = [];
  }
  /** nats-server reads what it was sent, in order, then the PINGs (their PONGs may come before the acks, as JetStream's are asynchronous). */
  resume(): void {
    const held = this.held ?? [];
    this.held = undefined;
    this.heldBytes = 0;
    for (const w of held) {
      const what = this.policy(w);
      this.handle(w, what === "stall" ? "append" : what);
    }
    for (const ping of this.pings.splice(0)) ping();
  }
  /** An entry a caller's earlier request appended (other bytes than this Dispatcher's). */
  preload(id: string): void {
    this.log.push({ id, data: new Uint8Array([0xee]) });
  }
  publish(_subject: string, data: Uint8Array, msgId: string, token: string): void {
    this.send({ msgIds: [msgId], data: [data], batch: false, token, attempt: 0 });
  }
  publishInBatch(_subject: string, data: Uint8Array, msgId: string, batch: BatchPlace): void {
    this.staged.push({ id: msgId, data });
    if (batch.commit === undefined) return;
    const staged = this.staged;
    this.staged = [];
    this.send({ msgIds: staged.map((e) => e.id), data: staged.map((e) => e.data), batch: true, token: batch.commit, attempt: 0 });
  }
  private send(w: Wire): void {
    const key = w.msgIds.join(",");
    w.attempt = (this.attempts.get(key) ?? 0) + 1;
    this.attempts.set(key, w.attempt);
    let what = this.held === undefined ? this.policy(w) : undefined;
    if (what === "throw") throw new Error("the client refused the publish");
    if (what === "stall") {
      this.stall();
      what = undefined;
    }
    this.published.push({ msgIds: w.msgIds, batch: w.batch });
    if (what !== undefined) return this.handle(w, what);
    this.held!.push(w);
    this.heldBytes += w.data.reduce((n, d) => n + d.byteLength, 0);
    this.peakHeldBytes = Math.max(this.peakHeldBytes, this.heldBytes);
  }
  private handle(w: Wire, what: ReturnType<Policy>): void {
    if (what === "drop" || what === "throw" || what === "stall") return;
    if (what === "lost") return void this.append(w);
    this.unanswered++;
    this.peakUnanswered = Math.max(this.peakUnanswered, this.unanswered);
    setImmediate(() => {
      this.unanswered--;
      this.onAnswer(w.token, what === "append" ? this.append(w) : what);
    });
  }
  private append(w: Wire): AckAnswer {
    const at = (id: string) => this.log.findIndex((e) => e.id === id) + 1;
    if (w.batch) {
      if (w.msgIds.some((id) => at(id) > 0)) return json({ error: { code: 400, err_code: 10201, description: "duplicate message id in batch" } });
      w.msgIds.forEach((id, i) => this.log.push({ id, data: w.data[i]! }));
      return json({ stream: "MBX_0", seq: this.log.length, batch: "b", count: w.msgIds.length });
    }
    const id = w.msgIds[0]!;
    if (at(id) > 0) return json({ stream: "MBX_0", seq: at(id), duplicate: true });
    this.log.push({ id, data: w.data[0]! });
    return json({ stream: "MBX_0", seq: this.log.length });
  }
  /** The users' entries' msgIds, as the stream holds them. */
  ids(): string[] {
    return this.log.map((e) => e.id);
  }
  /** How many times the client was handed `msgId` (alone or in a batch). */
  sent(msgId: string): number {
    return this.published.filter((p) => p.msgIds.includes(msgId)).length;
  }
}
