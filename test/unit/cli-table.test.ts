/**
 * The operator CLI's table (worker/cli.ts) is the one source of its commands: the usage text names
 * every row, and a command that no row names is a usage error. Nothing here reaches NATS: each
 * refusal comes before a command connects.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { COMMANDS, USAGE, UsageError, cli } from "../../worker/cli.js";

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
