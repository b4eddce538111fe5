/**
 * The TypeScript SDK (client/) behind the conformance kit's line protocol (docs/conformance.md):
 * commands on stdin, events on stdout, one JSON object per line.
 *
 * CONFORMANCE_PLANT names a client bug to plant, so the kit's own test can show the scenario that
 * catches it: `apply_twice_after_rebase` (the entry after a CURSOR_REBASED is handed to the app
 * twice), `store_before_apply` (the cursor is stored before the app's handler has run).
 */
import { createInterface } from "node:readline";
import WebSocket from "ws";
import { JetgateClient, type CursorStore } from "../../client/index.js";
import { FileCursorStore } from "../../client/node.js";
import type { DeviceCursor, Entry } from "../../protocol/device.js";

const plant = process.env.CONFORMANCE_PLANT ?? "";
const b64 = (b: Uint8Array) => Buffer.from(b).toString("base64");

function emit(ev: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(ev)}\n`);
}

let client: JetgateClient | undefined;
let failNext = 0;
let nextReq = 1;
const tokenWaiters = new Map<number, (token: string) => void>();
let replayNext = false;

/** The file store, or for `store_before_apply` one that saves a position past what was applied. */
function storeAt(path: string): CursorStore {
  const file = new FileCursorStore(path);
  // the bug: a cursor 1 past what the app applied, as if stored when the entry arrived
  const stored = (c: DeviceCursor) => (plant === "store_before_apply" ? { ...c, seq: c.seq + 1n } : c);
  return {
    load: () => file.load(),
    clear: () => file.clear(),
    async save(c: DeviceCursor) {
      await file.save(stored(c));
      emit({ ev: "cursor", seq: stored(c).seq.toString() });
    },
  };
}

async function onEntry(e: Entry): Promise<void> {
  if (failNext > 0) {
    failNext--;
    emit({ ev: "handler_failed", seq: e.seq.toString(), id: e.id });
    throw new Error("the kit asked this handler to fail");
  }
  const line = { ev: "entry", seq: e.seq.toString(), id: e.id, lane: e.lane, prev: e.prev === null ? null : e.prev.toString(), b: b64(e.b) };
  emit(line);
  if (replayNext) {
    replayNext = false;
    emit(line);
  }
}

function start(cmd: { urls: string[]; device: string; store: string; lanes?: string[] }): void {
  client = new JetgateClient({
    url: cmd.urls,
    device: cmd.device,
    ...(cmd.lanes !== undefined ? { lanes: cmd.lanes } : {}),
    store: storeAt(cmd.store),
    WebSocket: WebSocket as never,
    token: () =>
      new Promise<string>((resolve) => {
        const req = nextReq++;
        tokenWaiters.set(req, resolve);
        emit({ ev: "token", req });
      }),
    onEntry,
    onRebuild: ({ trimWatermark }) => emit({ ev: "rebuild", trim_watermark: trimWatermark.toString() }),
  });
  client.on((e) => {
    switch (e.type) {
      case "state":
        emit({ ev: "state", state: e.state.type, ...(e.state.type === "closed" ? { reason: e.state.reason } : {}) });
        break;
      case "synced":
        emit({ ev: "synced", seq: e.seq.toString() });
        break;
      case "rebased":
        if (plant === "apply_twice_after_rebase") replayNext = true;
        emit({ ev: "rebased", replay_from: e.replayFrom.toString() });
        break;
      case "cursor_invalid":
        emit({ ev: "cursor_invalid" });
        break;
      case "error":
        emit({ ev: "error", code: e.frame.code, fatal: e.frame.fatal });
        break;
      case "closed":
        emit({ ev: "closed", code: e.code, reason: e.reason });
        break;
      case "signed_out":
        emit({ ev: "signed_out" });
        break;
      default:
        break;
    }
  });
  void client.start();
}

async function send(cmd: { req: number; cmid: string; b: string }): Promise<void> {
  try {
    const r = await client!.send(new Uint8Array(Buffer.from(cmd.b, "base64")), cmd.cmid);
    emit({ ev: "sent", req: cmd.req, dup: r.dup });
  } catch (err) {
    emit({ ev: "send_failed", req: cmd.req, error: (err as Error).message });
  }
}

emit({ ev: "hello", sdk: "jetgate-ts", version: "0.1.0", protocol: 1 });
for await (const text of createInterface({ input: process.stdin })) {
  if (text.trim() === "") continue;
  const cmd = JSON.parse(text) as { cmd: string } & Record<string, unknown>;
  switch (cmd.cmd) {
    case "start":
      start(cmd as never);
      break;
    case "token": {
      const w = tokenWaiters.get(cmd.req as number);
      tokenWaiters.delete(cmd.req as number);
      w?.(cmd.token as string);
      break;
    }
    case "send":
      void send(cmd as never);
      break;
    case "fail_next":
      failNext = cmd.n as number;
      break;
    case "stop":
      await client?.close();
      emit({ ev: "stopped" });
      process.exit(0);
      break;
    default:
      process.stderr.write(`unknown command ${cmd.cmd}\n`);
  }
}
