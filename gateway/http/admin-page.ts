/**
 * The console page: an HTML document, its stylesheet and its script, served from the gateway itself
 * (no build step, no outside requests, no inline script or style: the CSP allows only these). It
 * asks for the admin token, keeps it for the tab (sessionStorage), reads /admin/api/state every 2 s
 * and draws it. Every text from the state goes in through textContent.
 */
export const ADMIN_HTML = /* html */ `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>jetgate console</title>
<link rel="stylesheet" href="/admin/app.css">
</head>
<body>
<header><h1>jetgate console</h1><span class="meta" id="meta">not connected</span><span id="regressions"></span></header>
<main>
  <section id="login"><h2>Admin token</h2>
    <form id="form"><input id="token" type="password" placeholder="JETGATE_ADMIN_TOKEN" autocomplete="off"><button>Open</button><span id="error"></span></form>
  </section>
  <section id="down-card" hidden><h2>Not answering</h2><ul id="down"></ul></section>
  <section id="shards-card" hidden><h2>Shards</h2><table id="shards"></table>
    <p class="small">Offset use: log offset of the shard's stream against 2^48 (log scale; the mark is the review point, 10%: docs/design.md, "Review points"). Epochs used: of 65,536 (log scale; the mark is the review point, 1,000). Lag: entries in the stream after the owning worker's last offset.</p></section>
  <section id="timeline-card" hidden><h2>Epoch history</h2><div id="timeline"></div><div class="legend small" id="legend"></div></section>
  <section id="gateways-card" hidden><h2>Gateways</h2><table id="gateways"></table></section>
  <section id="workers-card" hidden><h2>Workers</h2><table id="workers"></table></section>
  <section id="user-card" hidden><h2>User</h2>
    <form id="user-form"><input id="user" placeholder="user id" autocomplete="off"><button>Look up</button><span id="user-error"></span></form>
    <div id="user-result" hidden>
      <p class="small" id="user-mailbox"></p>
      <table id="user-presence"></table>
      <p class="small">Newest entries of the user's shard (what its devices should have received), newest last:</p>
      <table id="user-entries"></table>
    </div>
  </section>
</main>
<script src="/admin/app.js" defer></script>
</body>
</html>
`;

export const ADMIN_CSS = /* css */ `  :root { --bg:#f6f7f9; --card:#fff; --ink:#1d2330; --muted:#6b7385; --line:#e3e6ec; --ok:#1f9d55; --bad:#d64545; --warn:#d68a1a; --bar:#3b6fd8; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--ink); }
  header { display:flex; align-items:center; gap:16px; padding:12px 20px; background:#1d2330; color:#fff; }
  header h1 { font-size:17px; margin:0; font-weight:600; }
  header .meta { color:#aab2c4; font-size:12px; }
  .pill { padding:2px 10px; border-radius:10px; font-weight:600; font-size:12px; }
  .pill.ok { background:var(--ok); } .pill.bad { background:var(--bad); }
  main { padding:16px 20px; display:grid; gap:16px; }
  section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 16px; overflow-x:auto; }
  section h2 { font-size:14px; margin:0 0 8px; color:var(--muted); text-transform:uppercase; letter-spacing:.04em; }
  table { border-collapse:collapse; width:100%; }
  th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); white-space:nowrap; }
  th { color:var(--muted); font-weight:500; font-size:12px; }
  td.num { font-variant-numeric:tabular-nums; }
  .bar { position:relative; width:100px; height:12px; background:#edf0f5; border-radius:3px; display:inline-block; vertical-align:middle; margin-right:6px; }
  .bar i { position:absolute; left:0; top:0; bottom:0; border-radius:3px; background:var(--bar); }
  .bar b { position:absolute; top:-2px; bottom:-2px; width:2px; background:var(--warn); }
  .small { color:var(--muted); font-size:12px; }
  .dot { display:inline-block; width:9px; height:9px; border-radius:50%; margin-right:4px; }
  .up { background:var(--ok); } .down { background:var(--bad); }
  form { display:flex; gap:8px; align-items:center; }
  input { padding:6px 8px; border:1px solid var(--line); border-radius:4px; width:340px; }
  button { padding:6px 12px; border:0; border-radius:4px; background:var(--bar); color:#fff; cursor:pointer; }
  #error, #user-error { color:var(--bad); }
  #user-result table { margin:8px 0; }
  #down-card { border-color:var(--bad); } #down { margin:0; padding-left:18px; color:var(--bad); }
  svg text { font-size:11px; fill:var(--muted); }
  .legend span { margin-right:14px; }
`;

export const ADMIN_JS = /* js */ `"use strict";
const $ = (id) => document.getElementById(id);
const CAUSE = { init:"#8a94a6", takeover:"#3b6fd8", split:"#1f9d55", merge:"#7b4fd6", rebuild:"#d68a1a", failover:"#d64545" };
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function bar(fraction, mark, color) {
  const b = h("span", { class: "bar" }, h("i", { style: "width:" + Math.max(0, Math.min(1, fraction)) * 100 + "%" + (color ? ";background:" + color : "") }));
  if (mark !== undefined) b.append(h("b", { style: "left:" + mark * 100 + "%" }));
  return b;
}
// log scale from 1 to max: small numbers still show, and where the review point lies too
const logFrac = (v, max) => (v <= 1 ? 0 : Math.log(v) / Math.log(max));
function table(el, head, rows) {
  el.replaceChildren(h("tr", {}, ...head.map((c) => h("th", {}, c))), ...rows.map((r) => h("tr", {}, ...r.map((c) => (c instanceof Node && c.tagName === "TD" ? c : h("td", {}, c))))));
}
const num = (v) => h("td", { class: "num" }, typeof v === "number" ? v.toLocaleString("en") : v);
/** A seq (a decimal string) as people read it, as the CLI prints it: "17 (0:17)", epoch:offset. */
const seqText = (s) => { const v = BigInt(s); return s + " (" + (v >> 48n).toLocaleString("en") + ":" + (v & 0xffffffffffffn) + ")"; };
/** A hash range as the CLI prints it (protocol's rangeLabel): 0x00000000-0x7fffffff. */
const rangeText = (r) => "0x" + r.lo.toString(16).padStart(8, "0") + "-0x" + r.hi.toString(16).padStart(8, "0");
const pct = (f) => (f === 0 ? "0%" : f < 1e-5 ? "<0.001%" : (f * 100).toPrecision(2) + "%");
const ago = (ms) => (ms < 90e3 ? Math.round(ms / 1e3) + " s" : ms < 90 * 60e3 ? Math.round(ms / 60e3) + " min" : Math.round(ms / 3600e3) + " h");

let token = sessionStorage.getItem("jetgate-admin-token") || "";
$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("jetgate-admin-token", token);
  refresh();
});

$("user-form").addEventListener("submit", (e) => {
  e.preventDefault();
  lookUp($("user").value.trim());
});

/** The user lookup: the mailbox's position, the live sessions, the newest entries. */
async function lookUp(user) {
  $("user-error").textContent = "";
  try {
    const res = await fetch("/admin/api/user/" + encodeURIComponent(user), { headers: { authorization: "Bearer " + token } });
    const body = await res.json();
    if (!res.ok) throw new Error(body.error || res.status);
    const m = body.mailbox;
    $("user-mailbox").textContent = "shard " + m.shard + " · epoch " + m.epoch.toLocaleString("en") + " · log " + m.log + " · head " + m.head_label + " · trim " + seqText(m.trim) + " · lanes " + Object.entries(m.lanes).map(([l, v]) => l + " " + seqText(v)).join(", ");
    table($("user-presence"), ["device", "gateway", "live since"], body.presence.length === 0
      ? [["no live session", "", ""]]
      : body.presence.map((p) => [p.device, p.gateway, new Date(p.since).toLocaleString() + " (" + ago(Date.now() - p.since) + ")"]));
    table($("user-entries"), ["seq (epoch:offset)", "message id", "lane", "dispatched", "bytes"],
      body.entries.map((e) => [e.seq_label, e.id, e.lane, new Date(e.ts).toLocaleString(), num(e.bytes)]));
    $("user-result").hidden = false;
  } catch (err) {
    $("user-error").textContent = "cannot look it up: " + err.message;
  }
}

function render(st) {
  $("login").hidden = true;
  for (const id of ["shards-card", "timeline-card", "gateways-card", "workers-card", "user-card"]) $(id).hidden = false;
  const regressions = st.processes.reduce((n, p) => n + p.regressions, 0);
  $("regressions").replaceChildren(h("span", { class: "pill " + (regressions === 0 ? "ok" : "bad") }, "regressions " + regressions));
  $("meta").textContent = "via gateway " + st.gateway + " · registry record " + st.registry.record + " · " + new Date(st.at).toLocaleTimeString();
  // what did not answer in time: the rest of the page is what did
  const down = st.down.map((d) => d.dependency + " (" + d.what + "): " + d.error);
  const dropped = st.replies.unverified + st.replies.tooLarge + st.replies.invalid;
  if (dropped > 0) down.push("NATS: " + dropped + " process answers dropped (" + st.replies.unverified + " unsigned or wrongly signed, " + st.replies.tooLarge + " too large, " + st.replies.invalid + " unreadable)");
  $("down-card").hidden = down.length === 0;
  $("down").replaceChildren(...down.map((d) => h("li", {}, d)));
  const maxOffset = Number(st.limits.maxOffset);
  const workerShard = new Map();
  for (const p of st.processes) for (const s of p.shards || []) workerShard.set(s.shard, { worker: p.id, ...s });
  const heads = new Map(st.streams.map((s) => [s.shard, s]));
  const lags = st.registry.shards.map((s) => { const w = workerShard.get(s.shard); const head = heads.get(s.shard); return w && head ? Math.max(0, head.last - w.offset) : 0; });
  const maxLag = Math.max(1000, ...lags);
  table($("shards"), ["shard", "status", "users (hash range)", "owner", "epoch", "epochs used", "log", "offset", "offset use", "lag", "boundaries", "splits"],
    st.registry.shards.map((s, i) => {
      const head = heads.get(s.shard) || { last: 0 };
      const w = workerShard.get(s.shard);
      const width = s.range.hi - s.range.lo + 1;
      const owner = w ? w.worker : st.leases[String(s.shard)] || (s.owner === null ? (s.released_offset !== undefined ? "released at " + s.released_offset : "unclaimed") : s.owner || "none");
      return [
        num(s.shard), s.status, s.status === "active" ? (width / 2 ** 32 * 100).toFixed(1) + "% (" + rangeText(s.range) + ")" : "-",
        owner, num(s.epoch),
        h("td", {}, bar(logFrac(s.epoch + 1, st.limits.maxEpoch + 1), logFrac(1000, st.limits.maxEpoch + 1)), h("span", { class: "small" }, (s.epoch + 1).toLocaleString("en") + " of 65,536")),
        s.log, num(head.last),
        h("td", {}, bar(logFrac(head.last, maxOffset), logFrac(maxOffset / 10, maxOffset)), h("span", { class: "small" }, pct(head.last / maxOffset))),
        h("td", {}, bar(lags[i] / maxLag, undefined, lags[i] > 0 ? "var(--warn)" : undefined), h("span", { class: "small" }, w ? lags[i].toLocaleString("en") : "no worker")),
        num(s.boundaries.length), num(s.splits.length),
      ];
    }));
  timeline(st.registry.shards);
  const now = st.at;
  const gws = st.processes.filter((p) => p.kind === "gateway");
  const maxConns = Math.max(1, ...gws.map((g) => g.connections || 0));
  const deps = (p) => h("td", {}, h("span", { class: "dot " + (p.dependencies.nats ? "up" : "down") }), "nats ", h("span", { class: "dot " + (p.dependencies.redis ? "up" : "down") }), "redis");
  table($("gateways"), ["gateway", "connections", "", "dependencies", "regressions", "up for"],
    gws.map((g) => [g.id, num(g.connections || 0), h("td", {}, bar((g.connections || 0) / maxConns)), deps(g), num(g.regressions), ago(now - g.startedAt)]));
  table($("workers"), ["worker", "shards (epoch, offset, lag)", "dependencies", "regressions", "up for"],
    st.processes.filter((p) => p.kind === "worker").map((w) => [w.id, (w.shards || []).slice().sort((a, b) => a.shard - b.shard).map((s) => s.shard + " (epoch " + (s.epoch ?? "?").toLocaleString("en") + ", offset " + s.offset.toLocaleString("en") + ", lag " + (s.lag ?? "?").toLocaleString("en") + ")").join("  ") || "none", deps(w), num(w.regressions), ago(now - w.startedAt)]));
}

function timeline(shards) {
  const NS = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, text) => { const e = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  const maxEpoch = Math.max(1, ...shards.map((s) => s.epoch));
  const lane = 26, left = 70, width = 900, top = 18;
  const x = (epoch) => left + (epoch / maxEpoch) * (width - left - 40);
  const y = new Map(shards.map((s, i) => [s.shard, top + i * lane]));
  const svg = el("svg", { width: width, height: top + shards.length * lane + 10, role: "img", "aria-label": "epoch history" });
  for (let e = 0; e <= maxEpoch; e += Math.max(1, Math.ceil(maxEpoch / 10))) svg.append(el("text", { x: x(e), y: 10, "text-anchor": "middle" }, "epoch " + e.toLocaleString("en")));
  for (const s of shards) {
    const yy = y.get(s.shard);
    svg.append(el("text", { x: 4, y: yy + 4 }, "shard " + s.shard));
    svg.append(el("line", { x1: x(s.boundaries[0].epoch), x2: x(s.epoch), y1: yy, y2: yy, stroke: s.status === "active" ? "#b8c0d0" : "#e3e6ec", "stroke-width": 3 }));
    for (const sp of s.splits) {
      if (sp.parent !== s.shard || !y.has(sp.child)) continue;
      const child = shards.find((c) => c.shard === sp.child);
      const ex = x(child ? child.boundaries[0].epoch : s.epoch);
      svg.append(el("path", { d: "M" + ex + " " + yy + " L" + ex + " " + y.get(sp.child), stroke: CAUSE.split, "stroke-dasharray": "3 2", fill: "none" }));
    }
    for (const b of s.boundaries) {
      const c = el("circle", { cx: x(b.epoch), cy: yy, r: 6, fill: CAUSE[b.cause] || "#888" });
      c.append(el("title", {}, "shard " + s.shard + " epoch " + b.epoch + ": " + b.cause + ", log " + b.log + " from offset " + b.start_offset));
      svg.append(c);
    }
  }
  $("timeline").replaceChildren(svg);
  $("legend").replaceChildren(...Object.entries(CAUSE).map(([k, v]) => h("span", {}, h("span", { class: "dot", style: "background:" + v }), k)));
}

async function refresh() {
  if (!token) return;
  try {
    const res = await fetch("/admin/api/state", { headers: { authorization: "Bearer " + token } });
    if (res.status === 401 || res.status === 429) {
      $("login").hidden = false;
      $("error").textContent = res.status === 401 ? "wrong token" : "too many wrong tokens: try again in " + (res.headers.get("retry-after") || "a few") + " s";
      token = "";
      return;
    }
    const body = await res.json();
    if (!res.ok) throw new Error(body.error || res.status);
    $("error").textContent = "";
    render(body);
  } catch (err) {
    $("meta").textContent = "cannot read the state: " + err.message;
  }
}
refresh();
setInterval(refresh, 2000);
`;
