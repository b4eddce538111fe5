import { test } from "node:test";
import assert from "node:assert/strict";
import { CloseCode, Disconnect, closeReasons, reconnectPolicy, withReason } from "../../protocol/index.js";

test("reconnect is decided by the close code's range, with wire v1's two terminal codes kept", () => {
  const table: Array<[number, "now" | "backoff" | "stop"]> = [
    [4300, "now"], [4350, "now"], [4399, "now"],
    [4400, "backoff"], [4401, "backoff"], [4408, "backoff"], [4413, "backoff"], [4429, "backoff"],
    [4500, "backoff"], [4503, "backoff"], [1001, "backoff"], [1006, "backoff"], [1000, "backoff"],
    [4403, "stop"], [4409, "stop"], [4600, "stop"], [4650, "stop"], [4699, "stop"],
    [4700, "backoff"], [4299, "backoff"], [4599, "backoff"],
  ];
  for (const [code, want] of table) {
    assert.equal(reconnectPolicy(code), want, `close ${code}`);
  }
});

test("every close code the gateway sends has a Disconnect, and every Disconnect a known code and a reason", () => {
  const used = new Set(Object.values(Disconnect).map((d) => d.close));
  for (const code of Object.values(CloseCode)) assert.ok(used.has(code), `close code ${code} has no Disconnect`);
  for (const [name, d] of Object.entries(Disconnect)) {
    assert.ok(d.close in closeReasons, `${name}: ${d.close} is not a close code`);
    assert.ok(d.reason.length > 0 && Buffer.byteLength(d.reason) <= 123, `${name}: reason`);
  }
});

test("withReason keeps the codes and cuts the reason to what a close frame carries", () => {
  const d = withReason(Disconnect.SIGNED_OUT, "x".repeat(300));
  assert.equal(d.close, CloseCode.SIGNED_OUT);
  assert.equal(d.reason.length, 100);
  assert.equal(Disconnect.SIGNED_OUT.reason, closeReasons[4403], "the table itself is unchanged");
});
