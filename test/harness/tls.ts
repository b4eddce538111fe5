/** A throwaway CA and a server certificate for 127.0.0.1, made with openssl for one test file. */
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface TestCerts {
  dir: string;
  ca: string;
  cert: string;
  key: string;
  dispose(): void;
}

export function makeCerts(): TestCerts {
  const dir = mkdtempSync(join(tmpdir(), "jetgate-tls-"));
  const f = (n: string) => join(dir, n);
  const ssl = (...args: string[]) => execFileSync("openssl", args, { stdio: "pipe" });
  ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f("ca.key"), "-out", f("ca.pem"), "-days", "1", "-subj", "/CN=jetgate-test-ca");
  ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f("server.key"), "-out", f("server.csr"), "-subj", "/CN=127.0.0.1");
  writeFileSync(f("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  ssl("x509", "-req", "-in", f("server.csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial", "-out", f("server.pem"), "-days", "1", "-extfile", f("ext.cnf"));
  return { dir, ca: f("ca.pem"), cert: f("server.pem"), key: f("server.key"), dispose: () => rmSync(dir, { recursive: true, force: true }) };
}
