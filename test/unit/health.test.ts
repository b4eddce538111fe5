import { test } from "node:test";
import assert from "node:assert/strict";
import { writeRefusal } from "../../protocol/io/index.js";

test("health - a Redis write refusal is named from the error Redis gave; anything else is not a refusal", () => {
  const cases: [string, ReturnType<typeof writeRefusal>][] = [
    ["OOM command not allowed when used memory > 'maxmemory'.", "oom"],
    ["ERR Error running script (call to f_1234): @user_script:14: OOM command not allowed when used memory > 'maxmemory'.", "oom"],
    ["READONLY You can't write against a read only replica.", "readonly"],
    ["MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", "misconf"],
    ["NOREPLICAS Not enough good replicas to write.", "noreplicas"],
    ["Connection is closed.", undefined],
    ["Command timed out", undefined],
    ["ERR unknown command 'FOO'", undefined],
    ["ERR the word ROOM, or OOM-ish, is no code", undefined],
  ];
  for (const [message, want] of cases) assert.equal(writeRefusal(new Error(message)), want, message);
  assert.equal(writeRefusal("READONLY as a string"), "readonly");
  assert.equal(writeRefusal(undefined), undefined);
});
