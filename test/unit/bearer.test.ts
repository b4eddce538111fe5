import { test } from "node:test";
import assert from "node:assert/strict";
import { bearerMatches } from "../../gateway/http/bearer.js";

test("bearer - the scheme in any case (RFC 9110: case-insensitive); the token exactly", () => {
  for (const header of ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR s3cret"]) assert.equal(bearerMatches(header, "s3cret"), true, header);
  for (const header of ["Bearer S3CRET", "Bearer s3cre", "Bearer s3cret ", "Bearers3cret", "Basic s3cret", "s3cret", "", "Bearer", "Bearer  s3cret"]) {
    assert.equal(bearerMatches(header, "s3cret"), false, JSON.stringify(header));
  }
});
