/**
 * The scenarios: each makes the moves an operator or a network makes under one device and says
 * what the device must have done. The checks every scenario gets (once, in order, nothing lost)
 * are in checks.ts; `run` adds the documented answer of its case and throws when it is missing.
 */
import { randomBytes } from "node:crypto";
import { deviceToken } from "../test/harness/device.js";
import { waitFor } from "../test/harness/wait.js";
import { userMovedTwice, userOn, type Kit, type KitOptions } from "./kit.js";

export interface Scenario {
  name: string;
  /** One line for the report: the case. */
  what: string;
  kit?: Omit<KitOptions, "client" | "clientEnv">;
  user?: Parameters<typeof Kit.start>[1];
  /** The case's documented cost: repeats in a later life (checks.ts, CheckOptions). */
  repeatsAcrossLives?: boolean;
  /** How long it may take (run.ts's default: 2 minutes). */
  timeoutMs?: number;
  run(k: Kit): Promise<void>;
}

function expect(ok: boolean, what: string): void {
  if (!ok) throw new Error(`expected: ${what}`);
}

/** Starts the device, waits until it is live, dispatches `n` entries and waits until they are applied. */
async function liveWith(k: Kit, n: number): Promise<void> {
  await k.startClient();
  await k.live();
  await k.dispatch(n);
  await k.allApplied();
}

/** Events of the current life after `from` (an index into the log). */
const since = (k: Kit, from: number) => k.log.events.slice(from);

export const SCENARIOS: Scenario[] = [
  {
    name: "normal",
    what: "live entries (acknowledged), then entries while offline, then a restart with the stored cursor",
    async run(k) {
      await liveWith(k, 20);
      // the cumulative ACK reaches the gateway within the SDK's batching (docs/protocol.md: at most every N entries or M ms)
      const last = k.dispatched.at(-1)!.seq;
      await waitFor("the device's ACK of its last entry", async () => (await k.ackedSeq()) === last, { timeoutMs: 10_000 });
      await k.stopClient();
      await k.dispatch(10);
      const from = k.log.events.length;
      await k.startClient();
      await k.log.until("SYNCED after the restart", () => since(k, from).some((e) => e.ev === "synced"));
      // caught up: what is not applied a moment after SYNCED was skipped
      await k.allApplied(5000);
      expect(!since(k, from).some((e) => e.ev === "rebased" || e.ev === "cursor_invalid"), "no rebase and no fresh start for a cursor of the same epoch");
    },
  },
  {
    name: "crash_and_resume",
    what: "SIGKILL while entries are applied, then a restart: nothing applied is replayed, nothing skipped",
    async run(k) {
      await k.startClient();
      await k.live();
      await k.dispatch(40);
      await k.log.until("some entries applied", () => k.log.of("entry").length >= 10);
      await k.crashClient();
      await k.dispatch(10);
      await k.startClient();
      await k.allApplied();
    },
  },
  {
    name: "handler_error",
    what: "the app's handler throws: the same entry comes again, the cursor does not move past it",
    async run(k) {
      await k.startClient();
      await k.live();
      k.client.failNext(2);
      await k.dispatch(5);
      await k.allApplied();
      expect(k.log.of("handler_failed").length === 2, "two handler failures reported");
      const failed = new Set(k.log.of("handler_failed").map((e) => String(e.id)));
      expect([...failed].every((id) => k.log.of("entry").some((e) => e.id === id)), "each failed entry applied afterwards");
    },
  },
  {
    name: "duplicates",
    what: "a backend dispatches one message id twice, the device sends one cmid twice: once each",
    async run(k) {
      await k.startClient();
      await k.live();
      await k.dispatch(3);
      await k.dispatch(1, { id: "retried" });
      await k.dispatch(1, { id: "retried" });
      await k.dispatch(2);
      await k.allApplied();
      const body = randomBytes(8);
      const first = await k.client.send("cmid-1", body);
      const again = await k.client.send("cmid-1", body);
      expect(first.ev === "sent" && first.dup === false, `the first SEND stored (${JSON.stringify(first)})`);
      expect(again.ev === "sent" && again.dup === true, `the second SEND of the cmid answered dup (${JSON.stringify(again)})`);
    },
  },
  {
    name: "gap_fill",
    what: "a live MSGS frame lost on the way: the next entry's prev shows the gap; the device fills it (PULL) before going on",
    kit: { proxy: true },
    async run(k) {
      await liveWith(k, 2);
      k.proxy!.dropNextLiveMsgs();
      await k.dispatch(1);
      await waitFor("the frame dropped", () => k.proxy!.dropped === 1, { timeoutMs: 10_000 });
      await k.dispatch(3);
      await k.allApplied();
      expect(k.proxy!.pulls >= 1, "a PULL for the gap");
    },
  },
  {
    name: "rebased_same_log",
    what: "offline across a takeover (E1: a new epoch on the same log): CURSOR_REBASED, no duplicate, no gap",
    user: userOn(0),
    async run(k) {
      await liveWith(k, 10);
      await k.stopClient();
      await k.dispatch(5);
      await k.cli("shard", "takeover", String(k.shard));
      // the worker takes the shard again at the new epoch
      await k.dispatch(5);
      await k.startClient();
      await k.allApplied();
      expect(k.log.of("rebased").length >= 1, "CURSOR_REBASED handled (a rebased event)");
    },
  },
  {
    name: "rebased_new_log",
    what: "offline across a stream rebuild (E3: a new log, old entries re-appended): rebased, nothing lost, repeats only of the old log",
    user: userOn(0),
    // docs/design.md: a new log replays whole; the SDK drops repeats by message id while it remembers them
    repeatsAcrossLives: true,
    async run(k) {
      await liveWith(k, 10);
      await k.stopClient();
      await k.cli("shard", "rebuild", String(k.shard));
      await k.dispatch(5);
      await k.startClient();
      await k.allApplied();
      expect(k.log.of("rebased").length >= 1, "CURSOR_REBASED handled (a rebased event)");
    },
  },
  {
    name: "rebased_new_log_connected",
    what: "connected through a stream rebuild: the new log's repeats of applied entries are dropped by message id",
    user: userOn(0),
    async run(k) {
      await liveWith(k, 10);
      await k.cli("shard", "rebuild", String(k.shard));
      await k.dispatch(5);
      await k.allApplied();
    },
  },
  {
    name: "split_twice_offline",
    what: "offline across two splits that both move the user: each old range in order, then the new shard",
    user: userMovedTwice(1),
    async run(k) {
      await liveWith(k, 5);
      await k.stopClient();
      await k.dispatch(5);
      const first = k.shard;
      await k.cli("shard", "split", String(first));
      expect(k.shard !== first, "the first split moved the user");
      await k.dispatch(5);
      const second = k.shard;
      await k.cli("shard", "split", String(second));
      expect(k.shard !== second, "the second split moved the user");
      await k.dispatch(5);
      await k.startClient();
      await k.allApplied();
      expect(k.log.of("rebased").length >= 1, "CURSOR_REBASED with old ranges handled");
    },
  },
  {
    name: "split_twice_connected",
    what: "connected through two splits that move the user, entries before, between and after",
    user: userMovedTwice(1),
    async run(k) {
      await k.startClient();
      await k.live();
      await k.dispatch(5);
      await k.cli("shard", "split", String(k.shard));
      await k.dispatch(5);
      await k.cli("shard", "split", String(k.shard));
      await k.dispatch(5);
      await k.allApplied();
    },
  },
  {
    name: "expired_rebuild",
    what: "retention passed the stored cursor: CURSOR_EXPIRED, the app's rebuild first, then live entries",
    async run(k) {
      await liveWith(k, 5);
      await k.stopClient();
      for (const d of await k.dispatch(10)) k.gone.add(d.id);
      await k.trim(1);
      await k.startClient();
      await k.log.until("the rebuild hook", () => k.log.of("rebuild").length > 0);
      await k.live();
      await k.dispatch(5);
      await k.allApplied();
      const rebuildAt = k.log.events.findIndex((e) => e.ev === "rebuild");
      const goneAfter = k.log.events.slice(rebuildAt).filter((e) => e.ev === "entry" && k.gone.has(String(e.id)));
      expect(goneAfter.length <= 1, "after the rebuild the device goes on from the head, not from its old cursor");
    },
  },
  {
    name: "cursor_invalid",
    what: "the cursor key rolled without the old one: CURSOR_INVALID, a fresh start that replays the mailbox",
    async run(k) {
      await liveWith(k, 8);
      await k.stopClient();
      await k.restartGateway(0, { JETGATE_CURSOR_KEYS: randomBytes(32).toString("base64") });
      await k.startClient();
      await k.log.until("CURSOR_INVALID", () => k.log.of("cursor_invalid").length > 0);
      await k.dispatch(3);
      await k.allApplied();
    },
  },
  {
    name: "slow_consumer",
    what: "a device that stops reading (SIGSTOP) is closed 4408; it comes back with its cursor and loses nothing",
    kit: { gateway: { JETGATE_MAX_BACKPRESSURE: "65536" } },
    async run(k) {
      await k.startClient();
      await k.live();
      k.client.signal("SIGSTOP");
      // more than the kernel's socket buffers and the gateway's backpressure bound hold
      await k.dispatch(400, { bodyBytes: 32_768 });
      k.client.signal("SIGCONT");
      await k.allApplied(60_000);
      // the gateway's 4408 may sit behind the very bytes the device did not read: the device can
      // see the socket end without it (1006), so the gateway's count is what shows the close
      expect((await k.gateways[0]!.metric("jetgate_gateway_slow_consumers_total")) >= 1, "the gateway closed the device as a slow consumer (4408)");
      expect(k.log.of("closed").length >= 1, "the device saw its connection end, and came back");
    },
  },
  {
    name: "goaway",
    what: "the gateway drains (SIGTERM: GOAWAY, 1001): the device moves to another gateway and resumes",
    kit: { gateways: 2 },
    async run(k) {
      await liveWith(k, 5);
      const on = (await k.gateways[0]!.metric("jetgate_gateway_connections")) > 0 ? 0 : 1;
      const from = k.log.events.length;
      await k.gateways[on]!.kill("SIGTERM");
      await k.log.until("a close after GOAWAY", () => since(k, from).some((e) => e.ev === "closed"));
      await k.dispatch(5);
      await k.allApplied();
      expect(since(k, from).some((e) => e.ev === "closed" && e.code === 1001), "closed 1001 by the draining gateway");
    },
  },
  {
    name: "token_refresh",
    what: "a token that expires in 3 s: the device refreshes it and its session outlives it",
    async run(k) {
      k.tokenFor = () => deviceToken(k.user, { device: k.device, expiresInS: 3 });
      await k.startClient();
      await k.live();
      await k.dispatch(3);
      await new Promise((r) => setTimeout(r, 5000));
      await k.dispatch(3);
      await k.allApplied();
      expect(k.log.of("token").length >= 2, "a second token asked for before the first expired");
      expect(!k.log.of("closed").some((e) => e.code === 4401), "never closed 4401 (token expired)");
    },
  },
  {
    name: "signed_out",
    what: "the backend signs the user out (close 4403): the device stops and does not reconnect",
    async run(k) {
      await liveWith(k, 3);
      const res = await k.serverApi("POST", `/v1/users/${k.user}/disconnect`, { mode: "signed_out", reason: "conformance" });
      expect(res.ok, `the server API answered ${res.status}`);
      await k.log.until("signed_out", () => k.log.of("signed_out").length > 0);
      const at = k.log.events.length;
      // longer than any SDK's first backoff step, so a reconnect would have begun
      await new Promise((r) => setTimeout(r, 2000));
      expect(!since(k, at).some((e) => e.ev === "state" && e.state === "connecting"), "no reconnect after 4403");
      expect(k.log.of("closed").some((e) => e.code === 4403), "closed with 4403");
    },
  },
  {
    name: "revoked",
    what: "the backend revokes the user's tokens (mode reconnect, 4300): the old token is refused, a new one resumes with nothing lost",
    async run(k) {
      await liveWith(k, 3);
      // the app first hands back a token minted before the revocation (refused: 4401), then the
      // backend's new one, issued at the revocation's second as docs/server-api.md says. Set before
      // the call: the device is closed 4300 and asks for a token at once, maybe before the answer.
      const before = Math.floor(Date.now() / 1000);
      const revocation: { issuedBefore?: number } = {};
      let stale = 1;
      k.tokenFor = () => deviceToken(k.user, { device: k.device, issuedAt: stale-- > 0 ? before - 5 : (revocation.issuedBefore ?? Math.floor(Date.now() / 1000)) });
      const res = await k.serverApi("POST", `/v1/users/${k.user}/revoke`, { mode: "reconnect" });
      expect(res.ok, `the server API answered ${res.status}`);
      revocation.issuedBefore = ((await res.json()) as { issued_before: number }).issued_before;
      await k.dispatch(3);
      await k.allApplied();
      expect(k.log.of("closed").some((e) => e.code === 4300), "closed with 4300 (reconnect now)");
      expect(k.log.of("closed").some((e) => e.code === 4401) && k.log.of("error").some((e) => e.code === "UNAUTHORIZED"), "the stale token refused: ERROR UNAUTHORIZED, close 4401");
      expect(k.log.of("signed_out").length === 0, "not signed out");
    },
  },
  soak(12),
];

/**
 * The soak: entries dispatched all along while the device crashes (SIGKILL), stops and starts
 * again, and the gateways are rolled (drained and replaced on their ports), for `seconds`; at the
 * end every entry once, in order, nothing lost. `npm test` runs 12 s of it per SDK;
 * `npm run conformance -- --soak-seconds 600` runs the long one.
 */
export function soak(seconds: number): Scenario {
  return {
    name: "soak",
    what: `${seconds} s of entries while the device crashes, restarts and its gateways roll`,
    kit: { gateways: 2 },
    timeoutMs: (seconds + 120) * 1000,
    async run(k) {
      const until = Date.now() + seconds * 1000;
      let dispatching = true;
      const load = (async () => {
        while (dispatching) {
          await k.dispatch(1 + Math.floor(Math.random() * 10));
          await sleep(50 + Math.random() * 200);
        }
      })();
      const moves = { crashes: 0, restarts: 0, rolls: 0 };
      try {
        await k.startClient();
        while (Date.now() < until) {
          await sleep(1000 + Math.random() * 3000);
          const r = Math.random();
          if (r < 0.35) {
            await k.crashClient();
            moves.crashes++;
            await k.startClient();
          } else if (r < 0.6) {
            await k.stopClient();
            moves.restarts++;
            await k.startClient();
          } else if (r < 0.8) {
            await k.restartGateway(Math.floor(Math.random() * k.gateways.length), {});
            moves.rolls++;
          }
        }
      } finally {
        dispatching = false;
        await load;
      }
      await k.allApplied(60_000);
      k.note(`${k.dispatched.length} entries; ${moves.crashes} crashes, ${moves.restarts} restarts, ${moves.rolls} gateway rolls; ${k.log.lives} lives`);
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
