/**
 * Writes docs/openapi.json, the document `GET /v1/openapi.json` serves (gateway/http/openapi.ts).
 * `npm run openapi`; test/unit/openapi.test.ts fails when the file is out of date.
 */
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { openApiJson } from "../gateway/http/openapi.js";

export const OPENAPI_FILE = fileURLToPath(new URL("../docs/openapi.json", import.meta.url));

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(OPENAPI_FILE, openApiJson());
  console.log(`wrote ${OPENAPI_FILE}`);
}
