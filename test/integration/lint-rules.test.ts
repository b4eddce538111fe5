/**
 * The lint rules that keep the house in order fail where they should: the project's import-graph
 * rules (.dependency-cruiser.cjs) on a small tree of its own, with an import circle, a pure-core
 * file importing a Node module or protocol/io, and a tier importing another (nested folders
 * included); and ESLint's rule that the pure core uses no `process`. The repository itself passing
 * them is `npm run lint`'s job.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { cp, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ESLint } from "eslint";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const CRUISER = join(ROOT, "node_modules/dependency-cruiser/bin/dependency-cruiser.mjs");

function cruise(cwd: string): Promise<{ code: number | null; out: string }> {
  const proc = spawn(process.execPath, [CRUISER, "--config", ".dependency-cruiser.cjs", "--output-type", "err", "gateway", "worker", "protocol"], { cwd });
  let out = "";
  proc.stdout.on("data", (d: Buffer) => (out += d.toString()));
  proc.stderr.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((done) => proc.on("exit", (code) => done({ code, out })));
}

/** A tree with the project's rules and `files`; resolves to its directory. */
async function tree(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "jetgate-lint-"));
  await cp(join(ROOT, ".dependency-cruiser.cjs"), join(dir, ".dependency-cruiser.cjs"));
  await writeFile(join(dir, "tsconfig.json"), JSON.stringify({ compilerOptions: { module: "nodenext", moduleResolution: "nodenext", strict: true } }));
  for (const [name, text] of Object.entries({ "protocol/index.ts": "export const one = 1;\n", "protocol/io/index.ts": "export const two = 2;\n", "worker/index.ts": "export {};\n", ...files })) {
    await mkdir(dirname(join(dir, name)), { recursive: true });
    await writeFile(join(dir, name), text);
  }
  return dir;
}

test("lint rules: a clean tree passes the import-graph rules", async () => {
  const dir = await tree({
    "gateway/session/a.ts": 'import { one } from "../../protocol/index.js";\nimport { b } from "../hub/b.js";\nexport const a = one + b;\n',
    "gateway/hub/b.ts": 'import { two } from "../../protocol/io/index.js";\nexport const b = two;\n',
  });
  try {
    const r = await cruise(dir);
    assert.equal(r.code, 0, r.out);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("lint rules: a circle (type-only too), Node or I/O in the pure core, and a tier importing another fail, each by name", async () => {
  const dir = await tree({
    "gateway/hub/a.ts": 'import type { B } from "./b.js";\nexport interface A { b?: B }\n',
    "gateway/hub/b.ts": 'import type { A } from "./a.js";\nexport interface B { a?: A }\n',
    "protocol/reads-files.ts": 'import { readFileSync } from "node:fs";\nexport const f = readFileSync;\n',
    "protocol/uses-io.ts": 'import { two } from "./io/index.js";\nexport const t = two;\n',
    "gateway/session/c.ts": 'import { w } from "../../worker/w.js";\nexport const c = w;\n',
    "worker/w.ts": "export const w = 1;\n",
  });
  try {
    const r = await cruise(dir);
    assert.notEqual(r.code, 0, r.out);
    for (const rule of ["no-circular", "pure-core-no-node", "pure-core-no-io", "tier-imports-no-tier"]) assert.match(r.out, new RegExp(`error ${rule}:`), `${rule} not reported:\n${r.out}`);
    assert.match(r.out, /gateway\/hub\/a\.ts/);
    assert.match(r.out, /protocol\/reads-files\.ts/);
    assert.match(r.out, /gateway\/session\/c\.ts/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("lint rules: the pure core may not use process; protocol/io may", async () => {
  const probe = (name: string) => resolve(ROOT, name);
  const eslint = new ESLint({
    cwd: ROOT,
    overrideConfig: { languageOptions: { parserOptions: { projectService: { allowDefaultProject: ["protocol/lint-probe.ts", "protocol/io/lint-probe.ts"] } } } },
  });
  const code = "export const port = (): string | undefined => process.env.PORT;\n";
  const [pure] = await eslint.lintText(code, { filePath: probe("protocol/lint-probe.ts") });
  assert.deepEqual(pure!.messages.map((m) => m.ruleId), ["no-restricted-globals"]);
  assert.match(pure!.messages[0]!.message, /pure core uses no process/);
  const [io] = await eslint.lintText(code, { filePath: probe("protocol/io/lint-probe.ts") });
  assert.deepEqual(io!.messages, []);
});
