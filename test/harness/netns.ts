/**
 * Hosts of their own for partition tests: a Linux network namespace per host, joined to the test's
 * namespace by one veth pair per link, each link its own /30. `cut(link)` drops the link's packets
 * silently both ways (a blackhole route for the peer's address on each side), as a failed switch or
 * a firewall would: sockets stay open and nothing answers. `heal(link)` removes the routes, and TCP
 * retransmits what was waiting. Needs iproute2 and CAP_NET_ADMIN (root in CI).
 */
import { spawnSync } from "node:child_process";

/** Thrown when namespaces cannot be made here: names what is missing, never a silent pass. */
export class NetnsUnavailableError extends Error {
  override readonly name = "NetnsUnavailableError";
}

function ip(args: string[], where?: string): void {
  const full = where === undefined ? args : ["netns", "exec", where, "ip", ...args];
  const r = spawnSync("ip", full, { encoding: "utf8" });
  if (r.error !== undefined) throw new NetnsUnavailableError(`cannot run \`ip\` (iproute2 missing?): ${r.error.message}`);
  if (r.status !== 0) throw new Error(`ip ${full.join(" ")}: ${r.stderr.trim()}`);
}

let checked = false;

/** Makes and removes a namespace once: a clear failure naming CAP_NET_ADMIN or iproute2 when it cannot. */
export function requireNetns(): void {
  if (checked) return;
  const name = `jgprobe${process.pid}`;
  const r = spawnSync("ip", ["netns", "add", name], { encoding: "utf8" });
  if (r.error !== undefined) throw new NetnsUnavailableError(`partition tests need iproute2's \`ip\` (apt-get install iproute2): ${r.error.message}`);
  if (r.status !== 0) {
    throw new NetnsUnavailableError(`partition tests need network namespaces, which need CAP_NET_ADMIN (run as root, or with --cap-add NET_ADMIN): \`ip netns add\` said: ${r.stderr.trim()}`);
  }
  spawnSync("ip", ["netns", "del", name]);
  checked = true;
}

export interface Link {
  /** This namespace's end: where the host reaches servers of the test (NATS, Redis, devices' side). */
  rootIp: string;
  /** The host's end: where the test reaches the host's listeners over this link. */
  hostIp: string;
}

const hosts = new Set<NetHost>();
process.on("exit", () => {
  for (const h of hosts) h.dispose();
});

let made = 0;

export class NetHost {
  private readonly links = new Map<string, Link & { cut: boolean }>();
  private disposed = false;

  private constructor(readonly name: string) {}

  /** A namespace with one link per name; addresses 10.<a>.<b>.<4i+1|2>, unique to this test process. */
  static create(linkNames: string[]): NetHost {
    requireNetns();
    const idx = made++;
    const host = new NetHost(`jg${process.pid}h${idx}`);
    ip(["netns", "add", host.name]);
    hosts.add(host);
    ip(["link", "set", "lo", "up"], host.name);
    const a = 100 + (process.pid % 100);
    const b = (Math.floor(process.pid / 100) * 7 + idx) % 250;
    linkNames.forEach((link, i) => {
      const [rootDev, hostDev] = [`j${process.pid}h${idx}${i}r`, `j${process.pid}h${idx}${i}n`];
      const rootIp = `10.${a}.${b}.${i * 4 + 1}`;
      const hostIp = `10.${a}.${b}.${i * 4 + 2}`;
      ip(["link", "add", rootDev, "type", "veth", "peer", "name", hostDev]);
      ip(["link", "set", hostDev, "netns", host.name]);
      ip(["addr", "add", `${rootIp}/30`, "dev", rootDev]);
      ip(["link", "set", rootDev, "up"]);
      ip(["addr", "add", `${hostIp}/30`, "dev", hostDev], host.name);
      ip(["link", "set", hostDev, "up"], host.name);
      host.links.set(link, { rootIp, hostIp, cut: false });
    });
    return host;
  }

  link(name: string): Link {
    const l = this.links.get(name);
    if (l === undefined) throw new Error(`host ${this.name} has no link ${name}`);
    return l;
  }

  /** The command prefix that runs a program on this host. */
  get wrap(): string[] {
    return ["ip", "netns", "exec", this.name];
  }

  cut(name: string): void {
    const l = this.links.get(name)!;
    if (l.cut) return;
    ip(["route", "add", "blackhole", `${l.hostIp}/32`]);
    ip(["route", "add", "blackhole", `${l.rootIp}/32`], this.name);
    l.cut = true;
  }

  heal(name: string): void {
    const l = this.links.get(name)!;
    if (!l.cut) return;
    ip(["route", "del", "blackhole", `${l.hostIp}/32`]);
    ip(["route", "del", "blackhole", `${l.rootIp}/32`], this.name);
    l.cut = false;
  }

  /** Removes the namespace (its veth ends, and so their peers, go with it) and any route left. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    hosts.delete(this);
    for (const l of this.links.values()) if (l.cut) spawnSync("ip", ["route", "del", "blackhole", `${l.hostIp}/32`]);
    spawnSync("ip", ["netns", "del", this.name]);
  }
}
