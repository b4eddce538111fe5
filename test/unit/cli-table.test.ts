/**
 * The operator CLI's table (worker/cli.ts) is the one source of its commands: the usage text names
 * every row, and a command that no row names is a usage error. Nothing here reaches NATS: each
 * refusal comes before a command connects.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { COMMANDS, USAGE, UsageError, cli } from "../../worker/cli.js";
import { ServiceTokenTable, tokenStrengthProblem } from "../../protocol/index.js";

test("cli table - the usage text has a line for every command of the table: its words, its arguments, its description", () => {
  const lines = USAGE.split("\n").filter((l) => l.startsWith("  jetgate "));
  assert.equal(lines.length, COMMANDS.length);
  assert.equal(new Set(COMMANDS.map((c) => c.name)).size, COMMANDS.length, "command names are unique");
  for (const [i, c] of COMMANDS.entries()) {
    const line = lines[i]!;
    assert.ok(line.startsWith(`  jetgate ${c.name}${c.args === "" ? "" : ` ${c.args}`} `), `${c.name}: ${line}`);
    assert.ok(line.endsWith(`  ${c.description}`), `${c.name}: ${line}`);
    assert.ok(c.description.length > 0 && !c.description.includes("\n"), `${c.name}: one line`);
  }
  assert.match(USAGE, /^usage:\n/);
  assert.match(USAGE, /exit codes: 0 done, 2 refused, 64 bad usage\.$/);
});

test("cli table - `help` and `--help` anywhere print the usage and exit 0", async () => {
  for (const argv of [["help"], ["--help"], ["-h"], ["registry", "show", "--help"], ["shard", "split", "-h"]]) {
    const lines: string[] = [];
    assert.equal(await cli(argv, (l) => lines.push(l)), 0, argv.join(" "));
    assert.deepEqual(lines, [USAGE], argv.join(" "));
  }
});

test("cli table - a command no row names is a usage error naming it, with the usage", async () => {
  for (const [argv, says] of [
    [[], "which command?"],
    [["explode"], "unknown command: explode"],
    [["--no-such-flag"], "unknown command: --no-such-flag"],
    [["registry"], "unknown command: registry"],
    [["registry", "explode"], "unknown command: registry explode"],
    [["shard", "explode", "1"], "unknown command: shard explode"],
    [["replica"], "unknown command: replica"],
    [["failover", "x"], "unknown command: failover x"],
  ] as const) {
    const lines: string[] = [];
    await assert.rejects(cli([...argv], (l) => lines.push(l)), (err: unknown) => {
      assert.ok(err instanceof UsageError, String(err));
      assert.equal(err.message, `${says}\n${USAGE}`);
      return true;
    }, argv.join(" "));
    assert.deepEqual(lines, [], "nothing printed to stdout");
  }
});

test("cli - token new: a 256-bit token once, and a tokens-file entry the gateway reads as that token with those scopes", async () => {
  const lines: string[] = [];
  assert.equal(await cli(["token", "new", "--name", "notifier", "--scopes", "dispatch,presence", "--not-after", "2027-03-01T00:00:00Z"], (l) => lines.push(l)), 0);
  const token = /^token: (\S+)$/.exec(lines[0]!)?.[1];
  assert.ok(token !== undefined && token.length === 43, lines[0]);
  assert.equal(tokenStrengthProblem(token), undefined);
  const entry = lines.slice(lines.findIndex((l) => l.includes("- name:"))).join("\n");
  const table = ServiceTokenTable.from(`tokens:\n${entry}\n`, undefined);
  const m = table.match(token, Date.parse("2026-12-05T00:00:00Z"));
  assert.equal(m.kind, "valid");
  assert.deepEqual(m.kind === "valid" && [m.token.name, [...m.token.scopes], m.token.notAfter], ["notifier", ["dispatch", "presence"], Date.parse("2027-03-01T00:00:00Z")]);
});

test("cli - token new: a bad name, scope or time is a usage error naming the flag; both flags are required", async () => {
  for (const [argv, says] of [
    [["token", "new", "--scopes", "dispatch"], /--name and --scopes are required/],
    [["token", "new", "--name", "a b", "--scopes", "dispatch"], /--name: must be 1\.\.64 of/],
    [["token", "new", "--name", "a", "--scopes", "dispatch,write"], /--scopes\.1: /],
    [["token", "new", "--name", "a", "--scopes", "read", "--not-after", "tomorrow"], /--not-after: must be an ISO 8601 date and time/],
  ] as const) {
    await assert.rejects(cli([...argv], () => undefined), (err: unknown) => err instanceof UsageError && says.test(err.message), argv.join(" "));
  }
});
