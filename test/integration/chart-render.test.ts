/**
 * The chart, linted and rendered by Helm itself (the pinned build, scripts/pinned.ts: `helm lint
 * --strict` and `helm template`) for the default values, values-ha.yaml and every optional branch;
 * every object must validate against Kubernetes' API schemas (kubernetes-models, and the
 * prometheus-operator CRDs) and have no field those schemas do not know (kubernetes-models' types,
 * by TypeScript's excess-property check: the schemas alone allow unknown fields, which kubectl and
 * helm refuse), and hang together as an install needs: selectors that select, Services and Ingress
 * backends that reach named ports, references to ConfigMaps and Secrets that exist (for hooks, ones
 * created before them), and an environment each container's config accepts.
 */
import { before, after, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { parseAllDocuments, stringify } from "yaml";
import { ConfigMap, type IConfigMap } from "kubernetes-models/v1/ConfigMap";
import { Secret, type ISecret } from "kubernetes-models/v1/Secret";
import { Service, type IService } from "kubernetes-models/v1/Service";
import type { IContainer } from "kubernetes-models/v1/Container";
import type { IPodSpec } from "kubernetes-models/v1/PodSpec";
import { Deployment, type IDeployment } from "kubernetes-models/apps/v1/Deployment";
import { Job, type IJob } from "kubernetes-models/batch/v1/Job";
import { PodDisruptionBudget, type IPodDisruptionBudget } from "kubernetes-models/policy/v1/PodDisruptionBudget";
import { HorizontalPodAutoscaler, type IHorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler";
import { Ingress, type IIngress } from "kubernetes-models/networking.k8s.io/v1/Ingress";
import { ServiceMonitor, type IServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule, type IPrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { ENV_VARS, ServiceTokenTable, type ConfigRole } from "../../protocol/index.js";
import { loadConfig } from "../../protocol/io/index.js";
import { ensurePinned } from "../../scripts/pinned.js";

const CHART_DIR = fileURLToPath(new URL("../../k8s/jetgate", import.meta.url));

interface Obj {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
}
interface Validating {
  kind: string;
  apiVersion: string;
  new (data: never): { validate(): void };
}
/** The kinds this chart renders, each with its schema; a new kind must bring its model here... */
const MODELS: Validating[] = [ConfigMap, Secret, Service, Deployment, Job, PodDisruptionBudget, HorizontalPodAutoscaler, Ingress, ServiceMonitor, PrometheusRule];
/** ...and its type: the module and interface for the excess-property check. */
const TYPES: Record<string, [string, string]> = {
  ConfigMap: ["kubernetes-models/v1/ConfigMap", "IConfigMap"],
  Secret: ["kubernetes-models/v1/Secret", "ISecret"],
  Service: ["kubernetes-models/v1/Service", "IService"],
  Deployment: ["kubernetes-models/apps/v1/Deployment", "IDeployment"],
  Job: ["kubernetes-models/batch/v1/Job", "IJob"],
  PodDisruptionBudget: ["kubernetes-models/policy/v1/PodDisruptionBudget", "IPodDisruptionBudget"],
  HorizontalPodAutoscaler: ["kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler", "IHorizontalPodAutoscaler"],
  Ingress: ["kubernetes-models/networking.k8s.io/v1/Ingress", "IIngress"],
  ServiceMonitor: ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor", "IServiceMonitor"],
  PrometheusRule: ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule", "IPrometheusRule"],
};

let dir = "";
let bin = "";
before(async () => {
  dir = mkdtempSync(join(tmpdir(), "chart-render-"));
  bin = await ensurePinned("helm", (m) => console.error(m)); // npm test's pretest builds it; alone, this does once
});
after(() => rmSync(dir, { recursive: true, force: true }));

let files = 0;
function valuesFile(values: unknown): string {
  const f = join(dir, `values-${files++}.yaml`);
  writeFileSync(f, stringify(values));
  return f;
}

/** helm ARGS, with a HOME of its own: nothing of the machine's Helm configuration counts. */
function helm(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const home = join(dir, "home");
  const r = spawnSync(bin, args, { encoding: "utf8", env: { PATH: process.env.PATH ?? "", HOME: home, XDG_CACHE_HOME: join(home, "cache"), XDG_CONFIG_HOME: join(home, "config"), XDG_DATA_HOME: join(home, "data") } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** `helm template` of the chart with these values files; `release`: NAME and flags (default: no name, as helm's release-name). */
function run(valueFiles: string[], release: string[] = []): { status: number | null; stdout: string; stderr: string } {
  return helm(["template", ...release, CHART_DIR, ...valueFiles.flatMap((f) => ["-f", f])]);
}

function render(valueFiles: string[], release: string[] = []): Obj[] {
  const r = run(valueFiles, release);
  assert.equal(r.status, 0, `helm template failed: ${r.stderr}`);
  const objs: Obj[] = [];
  for (const part of r.stdout.split(/^---\n/m).slice(1)) {
    const source = /^# Source: (\S+)/.exec(part)?.[1];
    assert.ok(source, `a manifest without its # Source line: ${part.slice(0, 80)}`);
    const docs = parseAllDocuments(part);
    assert.equal(docs.length, 1, `${source}: one document per manifest`);
    assert.deepEqual(docs[0]!.errors, [], `${source}: YAML errors`);
    const o = docs[0]!.toJS() as Obj | null;
    assert.ok(o !== null && typeof o === "object", `${source}: renders a document with no object`);
    const Model = MODELS.find((m) => m.kind === o.kind && m.apiVersion === o.apiVersion);
    assert.ok(Model, `${source}: no schema here for ${o.apiVersion} ${o.kind}`);
    try {
      new Model(o as never).validate();
    } catch (err) {
      assert.fail(`${source}: ${o.kind} ${o.metadata?.name} does not validate: ${(err as Error).message}`);
    }
    sources.set(o, source);
    objs.push(o);
  }
  return objs;
}
const sources = new WeakMap<object, string>();

/**
 * Fields the API does not know: each object becomes a typed constant in a TypeScript program (a
 * virtual file beside this one, so that the types resolve), and the compiler's excess-property
 * check names any field its kubernetes-models interface lacks.
 */
function unknownFields(objs: Obj[]): string[] {
  const file = fileURLToPath(new URL("./__rendered_chart__.ts", import.meta.url));
  const lines = Object.entries(TYPES).map(([, [mod, type]]) => `import type { ${type} } from "${mod}";`);
  const first = lines.length;
  for (const [i, o] of objs.entries()) {
    assert.ok(TYPES[o.kind], `no type here for ${o.kind}`);
    // a null field is an absent one to the API server (an empty config renders `data:`)
    lines.push(`export const o${i}: ${TYPES[o.kind]![1]} = ${JSON.stringify(o, (_k, v: unknown) => (v === null ? undefined : v))};`);
  }
  const options: ts.CompilerOptions = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
    lib: ["lib.es2022.d.ts"],
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
  };
  const host = ts.createCompilerHost(options);
  const { getSourceFile, fileExists } = host;
  host.getSourceFile = (f, lang, ...rest) => (f === file ? ts.createSourceFile(f, lines.join("\n"), lang) : getSourceFile.call(host, f, lang, ...rest));
  host.fileExists = (f) => f === file || fileExists.call(host, f);
  const program = ts.createProgram([file], options, host);
  const source = program.getSourceFile(file)!;
  return ts.getPreEmitDiagnostics(program, source).map((d) => {
    const line = d.start === undefined ? -1 : source.getLineAndCharacterOfPosition(d.start).line;
    const o = objs[line - first];
    return `${o ? `${sources.get(o)}: ${o.kind} ${o.metadata.name}: ` : ""}${ts.flattenDiagnosticMessageText(d.messageText, " ")}`;
  });
}

const ofKind = <T>(objs: Obj[], kind: string) => objs.filter((o) => o.kind === kind) as unknown as (T & Obj)[];
const byName = <T extends Obj>(list: T[], name: string | undefined) => list.find((o) => o.metadata.name === name);

function selects(selector: { matchLabels?: Record<string, string>; matchExpressions?: unknown[] } | Record<string, string> | undefined, labels: Record<string, string> | undefined): boolean {
  assert.ok(selector, "a selector");
  const s = selector as { matchLabels?: Record<string, string>; matchExpressions?: unknown[] };
  const isLabelSelector = "matchLabels" in s || "matchExpressions" in s;
  assert.ok(!s.matchExpressions, "matchExpressions: not checked here");
  const match = (isLabelSelector ? s.matchLabels : selector) as Record<string, string>;
  assert.ok(Object.keys(match).length > 0, "an empty selector selects everything");
  return Object.entries(match).every(([k, v]) => labels?.[k] === v);
}

interface Workload {
  name: string;
  podLabels: Record<string, string>;
  pod: IPodSpec;
  hook: string | undefined;
  hookWeight: number;
}

/** The Dockerfile's ENV: the containers' environment before the chart's. */
function imageEnv(): Record<string, string> {
  const docker = readFileSync(new URL("../../Dockerfile", import.meta.url), "utf8");
  const last = docker.split(/^FROM /m).at(-1)!;
  const env: Record<string, string> = {};
  for (const line of last.matchAll(/^ENV (.+)$/gm)) for (const m of line[1]!.matchAll(/(\w+)=(\S+)/g)) env[m[1]!] = m[2]!;
  return env;
}

const ROLES: Record<string, ConfigRole> = { gateway: "gateway", worker: "worker", "registry-init": "tool" };

/**
 * What an install needs beyond each object's own schema. existingSecret: the keys of the Secret the
 * values name, as an operator would have created it.
 */
function checkInstall(objs: Obj[], existingSecret?: { name: string; data: Record<string, string> }): void {
  const deployments = ofKind<IDeployment>(objs, "Deployment");
  const jobs = ofKind<IJob>(objs, "Job");
  const services = ofKind<IService>(objs, "Service");
  const configMaps = ofKind<IConfigMap>(objs, "ConfigMap");
  const secrets = ofKind<ISecret>(objs, "Secret");
  const names = new Set<string>();
  for (const o of objs) {
    const key = `${o.kind}/${o.metadata.name}`;
    assert.ok(!names.has(key), `${key} is rendered twice`);
    names.add(key);
    assert.ok(o.metadata.name.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(o.metadata.name), `${key}: not a DNS label`);
  }

  const workloads: Workload[] = [];
  for (const d of deployments) {
    const podLabels = d.spec!.template.metadata!.labels!;
    assert.ok(selects(d.spec!.selector, podLabels), `${d.metadata.name}: its selector does not select its own pods`);
    for (const c of d.spec!.template.spec!.topologySpreadConstraints ?? []) assert.ok(selects(c.labelSelector, podLabels), `${d.metadata.name}: topology spread over other pods`);
    workloads.push({ name: d.metadata.name, podLabels, pod: d.spec!.template.spec!, hook: undefined, hookWeight: 0 });
  }
  for (const d of deployments) {
    for (const w of workloads) if (w.name !== d.metadata.name) assert.ok(!selects(d.spec!.selector, w.podLabels), `${d.metadata.name}'s selector also selects ${w.name}'s pods`);
  }
  for (const j of jobs) {
    const a = j.metadata.annotations ?? {};
    workloads.push({ name: j.metadata.name, podLabels: j.spec!.template.metadata?.labels ?? {}, pod: j.spec!.template.spec!, hook: a["helm.sh/hook"], hookWeight: Number(a["helm.sh/hook-weight"] ?? 0) });
  }
  const podsOf = (selector: Parameters<typeof selects>[0]) => workloads.filter((w) => w.hook === undefined && selects(selector, w.podLabels));
  const containerPorts = (w: Workload) => w.pod.containers.flatMap((c) => c.ports ?? []);

  for (const s of services) {
    const pods = podsOf(s.spec!.selector);
    assert.equal(pods.length, 1, `Service ${s.metadata.name} selects ${pods.length} workloads`);
    for (const p of s.spec!.ports!) {
      const ok = containerPorts(pods[0]!).some((cp) => (typeof p.targetPort === "string" ? cp.name === p.targetPort : cp.containerPort === (p.targetPort ?? p.port)));
      assert.ok(ok, `Service ${s.metadata.name} port ${p.name} targets ${p.targetPort}, which ${pods[0]!.name}'s containers do not have`);
    }
  }
  for (const p of ofKind<IPodDisruptionBudget>(objs, "PodDisruptionBudget")) {
    assert.equal(podsOf(p.spec!.selector).length, 1, `PodDisruptionBudget ${p.metadata.name} must cover one workload`);
  }
  for (const h of ofKind<IHorizontalPodAutoscaler>(objs, "HorizontalPodAutoscaler")) {
    const target = byName(deployments, h.spec!.scaleTargetRef.name);
    assert.ok(target && h.spec!.scaleTargetRef.kind === "Deployment" && h.spec!.scaleTargetRef.apiVersion === target.apiVersion, `HPA ${h.metadata.name}: no such Deployment`);
    assert.equal(target.spec!.replicas, undefined, `${target.metadata.name} sets replicas while an HPA scales it (each upgrade would reset them)`);
    assert.ok((h.spec!.minReplicas ?? 1) <= h.spec!.maxReplicas);
  }
  for (const i of ofKind<IIngress>(objs, "Ingress")) {
    for (const path of (i.spec!.rules ?? []).flatMap((r) => r.http?.paths ?? [])) {
      const svc = byName(services, path.backend.service?.name);
      assert.ok(svc, `Ingress ${i.metadata.name}: no Service ${path.backend.service?.name}`);
      assert.ok(svc.spec!.ports!.some((p) => p.name === path.backend.service!.port!.name), `Ingress ${i.metadata.name}: Service ${svc.metadata.name} has no port ${path.backend.service!.port!.name}`);
    }
  }

  // Prometheus: both tiers scraped, and the "down" alert watching the very Services scraped.
  for (const sm of ofKind<IServiceMonitor>(objs, "ServiceMonitor")) {
    const scraped = services.filter((s) => selects(sm.spec.selector, s.metadata.labels) && sm.spec.endpoints!.some((e) => s.spec!.ports!.some((p) => p.name === e.port)));
    for (const d of deployments) assert.ok(scraped.some((s) => selects(s.spec!.selector, d.spec!.template.metadata!.labels)), `ServiceMonitor ${sm.metadata.name} scrapes no Service of ${d.metadata.name}`);
    for (const r of ofKind<IPrometheusRule>(objs, "PrometheusRule")) {
      const down = r.spec!.groups!.flatMap((g) => g.rules ?? []).find((x) => x.alert === "JetgateDown");
      const m = /service=~"([^"]+)"/.exec(String(down?.expr));
      assert.ok(m, "JetgateDown selects its targets by service");
      const re = new RegExp(`^(?:${m[1]})$`); // PromQL regexes are anchored
      for (const s of scraped) assert.ok(re.test(s.metadata.name), `JetgateDown's service=~"${m[1]}" misses the scraped Service ${s.metadata.name}`);
    }
  }

  // Every container's environment, as the kubelet builds it, must be one its process accepts.
  const known = new Set<string>(ENV_VARS);
  const secretData = (name: string | undefined): Record<string, string> => {
    if (existingSecret && name === existingSecret.name) return existingSecret.data;
    const s = byName(secrets, name);
    assert.ok(s, `no Secret ${name}`);
    return { ...s.stringData, ...Object.fromEntries(Object.entries(s.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString()])) };
  };
  for (const w of workloads) {
    // a hook runs before the release's own objects exist: what it reads must be a hook created before it
    const available = (o: Obj) => w.hook === undefined ? o.metadata.annotations?.["helm.sh/hook"] === undefined : o.metadata.annotations?.["helm.sh/hook"] === w.hook && Number(o.metadata.annotations?.["helm.sh/hook-weight"] ?? 0) < w.hookWeight;
    for (const v of w.pod.volumes ?? []) {
      if (v.secret) assert.ok(v.secret.secretName === existingSecret?.name || secrets.some((s) => s.metadata.name === v.secret!.secretName && available(s)), `${w.name}: volume ${v.name}: no Secret ${v.secret.secretName}`);
    }
    for (const c of w.pod.containers as IContainer[]) {
      const role = ROLES[c.name];
      assert.ok(role, `${w.name}: container ${c.name} is neither gateway, worker nor registry-init`);
      const env: Record<string, string> = imageEnv();
      const fromMaps = new Set<string>();
      for (const src of c.envFrom ?? []) {
        if (src.configMapRef) {
          const cm = configMaps.find((m) => m.metadata.name === src.configMapRef!.name && available(m));
          assert.ok(cm, `${w.name}/${c.name}: no ConfigMap ${src.configMapRef.name} ${w.hook ? "created before the hook" : "in the release"}`);
          for (const k of Object.keys(cm.data ?? {})) fromMaps.add(k);
          Object.assign(env, cm.data);
        }
        if (src.secretRef) {
          const name = src.secretRef.name;
          assert.ok(name === existingSecret?.name || secrets.some((s) => s.metadata.name === name && available(s)), `${w.name}/${c.name}: no Secret ${name}`);
          Object.assign(env, secretData(name));
        }
      }
      for (const e of c.env ?? []) {
        assert.ok(!fromMaps.has(e.name), `${w.name}/${c.name}: ${e.name} is set in env, so the ConfigMap's value is ignored`);
        if (e.valueFrom) assert.ok(e.valueFrom.fieldRef?.fieldPath === "metadata.name", `${e.name}: ${JSON.stringify(e.valueFrom)}`);
        env[e.name] = e.value ?? `${w.name}-7d9f-abcde`;
      }
      for (const k of Object.keys(env)) if (k.startsWith("JETGATE_")) assert.ok(known.has(k), `${w.name}/${c.name}: ${k} is not a setting protocol/config.ts knows`);
      // A file setting must be a mounted Secret's key; the test reads it from a copy.
      for (const setting of ["JETGATE_JWT_PUBLIC_KEYS_FILE", "JETGATE_SERVICE_TOKENS_FILE"] as const) {
        const file = env[setting];
        if (file === undefined) continue;
        const mount = (c.volumeMounts ?? []).find((m) => m.mountPath === dirname(file));
        const vol = w.pod.volumes?.find((v) => v.name === mount?.name);
        assert.ok(vol?.secret, `${w.name}/${c.name}: nothing mounted at ${dirname(file)}`);
        assert.equal(mount!.subPath, undefined, `${w.name}/${c.name}: ${setting} under a subPath would never see the Secret change`);
        const content = secretData(vol.secret.secretName)[basename(file)];
        assert.ok(content, `${w.name}/${c.name}: Secret ${vol.secret.secretName} has no key ${basename(file)}`);
        const copy = join(dir, `mounted-${files++}`);
        writeFileSync(copy, content);
        env[setting] = copy;
        // what the gateway reads at start: a file it cannot use stops it
        if (setting === "JETGATE_SERVICE_TOKENS_FILE") assert.doesNotThrow(() => ServiceTokenTable.from(content, env.JETGATE_SERVICE_TOKEN), `${w.name}/${c.name}: the tokens file`);
      }
      try {
        loadConfig(env, role);
      } catch (err) {
        assert.fail(`${w.name}/${c.name} would not start: ${(err as Error).message}`);
      }
      for (const probe of [c.readinessProbe, c.livenessProbe]) {
        const port = probe?.httpGet?.port;
        if (typeof port === "string") assert.ok(c.ports?.some((p) => p.name === port), `${w.name}/${c.name}: a probe on port ${port}, which it does not name`);
      }
    }
  }
}

const cursorKey = Buffer.alloc(32, 7).toString("base64");
/** Random enough for production (the gateways refuse a guessable service token). */
const SERVICE_TOKEN = "Zq3v8Xk1Lr7Tn2Bw9Hc4Jd6Fs0Gm5Ya_";
/** A tokens file with two backends, as `jetgate token new` prints their entries. */
const TOKENS_FILE = `tokens:\n  - name: notifier\n    sha256: ${"ab".repeat(32)}\n    scopes: [dispatch, presence]\n  - name: support\n    sha256: ${"cd".repeat(32)}\n    scopes: [read, sessions, revoke]\n    not_after: "2027-03-01T00:00:00Z"\n`;
const jwtPem = generateKeyPairSync("ed25519").publicKey.export({ type: "spki", format: "pem" }).toString();
/** The Secret values-ha.yaml names, as the chart's README has the operator create it. */
const operatorSecret = { name: "jetgate", data: { JETGATE_CURSOR_KEYS: cursorKey, JETGATE_SERVICE_TOKEN: SERVICE_TOKEN, JETGATE_JWT_SECRET: "j".repeat(40) } };
const HA = join(CHART_DIR, "values-ha.yaml");
const DEFAULTS_WITH_SECRETS = { secrets: { cursorKeys: cursorKey, jwtSecret: "j".repeat(40), serviceToken: SERVICE_TOKEN } };
/** Over values-ha.yaml: every optional branch of the templates. */
const EXTRAS = {
  secrets: { jwtPublicKeys: jwtPem, serviceTokens: TOKENS_FILE },
  imagePullSecrets: [{ name: "registry" }],
  gateway: {
    autoscaling: { targetConnectionsPerPod: 20000 },
    podAnnotations: { "example.com/team": "edge" },
    nodeSelector: { "kubernetes.io/os": "linux" },
    tolerations: [{ key: "edge", operator: "Exists", effect: "NoSchedule" }],
    service: { type: "LoadBalancer", annotations: { "example.com/lb": "internal" } },
  },
  worker: { podAnnotations: { "example.com/team": "edge" }, nodeSelector: { "kubernetes.io/os": "linux" } },
  config: { JETGATE_LANES: "default,chat" },
};
const kinds = (objs: Obj[]) => objs.map((o) => o.kind).sort();

test("chart render - the default values, with the secrets they require", () => {
  const objs = render([valuesFile(DEFAULTS_WITH_SECRETS)]);
  assert.deepEqual(kinds(objs), ["ConfigMap", "ConfigMap", "Deployment", "Deployment", "Job", "PodDisruptionBudget", "PodDisruptionBudget", "Secret", "Service", "Service", "Service"]);
  checkInstall(objs);
  const gw = byName(ofKind<IDeployment>(objs, "Deployment"), "release-name-jetgate-gateway")!;
  assert.equal(gw.spec!.replicas, 2);
});

test("chart render - values-ha.yaml: autoscaled gateways, 3 workers, budgets, ingress, monitoring", () => {
  const objs = render([HA]);
  checkInstall(objs, operatorSecret);
  for (const kind of ["HorizontalPodAutoscaler", "Ingress", "ServiceMonitor", "PrometheusRule"]) assert.equal(ofKind(objs, kind).length, 1, kind);
  assert.equal(ofKind(objs, "PodDisruptionBudget").length, 2);
  assert.equal(ofKind(objs, "Secret").length, 0, "the operator's Secret, not the chart's");
  const hpa = ofKind<IHorizontalPodAutoscaler>(objs, "HorizontalPodAutoscaler")[0]!;
  assert.ok(hpa.spec!.minReplicas! >= 3);
  const worker = byName(ofKind<IDeployment>(objs, "Deployment"), "release-name-jetgate-worker")!;
  assert.ok(worker.spec!.replicas! >= 2);
  const job = ofKind<IJob>(objs, "Job")[0]!;
  assert.equal(job.spec!.template.spec!.containers[0]!.env!.find((e) => e.name === "JETGATE_STREAM_REPLICAS")?.value, "3");
  // NATS credentials in the operator's Secret reach the init Job too
  assert.ok(job.spec!.template.spec!.containers[0]!.envFrom!.some((f) => f.secretRef?.name === "jetgate"), "the init Job reads secrets.existingSecret");
  // .Files.Get: the dashboard ConfigMap carries the chart's file as it is
  const dash = ofKind<IConfigMap>(objs, "ConfigMap").find((m) => m.data?.["jetgate.json"] !== undefined);
  assert.ok(dash, "the Grafana dashboard ConfigMap");
  assert.deepEqual(JSON.parse(dash.data!["jetgate.json"]!), JSON.parse(readFileSync(join(CHART_DIR, "dashboards/jetgate.json"), "utf8")));
});

test("chart render - values-ha.yaml with every optional branch: JWT keys file, connection-based scaling, pod placement", () => {
  const objs = render([HA, valuesFile(EXTRAS)], ["--namespace", "edge", "jg"]);
  checkInstall(objs, { ...operatorSecret, data: { JETGATE_CURSOR_KEYS: cursorKey } });
  assert.deepEqual(ofKind<ISecret>(objs, "Secret").map((s) => s.metadata.name), ["jg-jetgate-jwt", "jg-jetgate-service-tokens"]);
  // the tokens file reaches the gateways only, whole-folder mounted (a Secret update reaches it)
  const deployments = ofKind<IDeployment>(objs, "Deployment");
  const envOf = (name: string) => byName(deployments, name)!.spec!.template.spec!.containers[0]!.env ?? [];
  assert.equal(envOf("jg-jetgate-gateway").find((e) => e.name === "JETGATE_SERVICE_TOKENS_FILE")?.value, "/etc/jetgate/service-tokens/tokens.yaml");
  assert.equal(envOf("jg-jetgate-worker").find((e) => e.name === "JETGATE_SERVICE_TOKENS_FILE"), undefined);
  const hpa = ofKind<IHorizontalPodAutoscaler>(objs, "HorizontalPodAutoscaler")[0]!;
  assert.deepEqual(hpa.spec!.metrics!.map((m) => m.type), ["Resource", "Pods"]);
  const rule = ofKind<IPrometheusRule>(objs, "PrometheusRule")[0]!;
  assert.match(JSON.stringify(rule.spec), /namespace=\\"edge\\", service=~\\"jg-jetgate-/);
});

test("chart render - no rendered object has a field Kubernetes does not know", () => {
  const objs = [...render([valuesFile(DEFAULTS_WITH_SECRETS)]), ...render([HA]), ...render([HA, valuesFile(EXTRAS)], ["jg"])];
  assert.deepEqual(unknownFields(objs), []);
});

test("chart render - required values and misplaced settings fail the render, naming the value", () => {
  const fails = (values: unknown, message: RegExp) => {
    const r = run([valuesFile(values)]);
    assert.notEqual(r.status, 0, `rendered although ${message}`);
    assert.match(r.stderr, message);
    assert.equal(r.stdout, "", "no manifests from a failed render");
  };
  // the gateways run with JETGATE_ENV=production, where they refuse to start without these
  fails({}, /execution error at \(jetgate\/templates\/secret\.yaml:\d+:\d+\): secrets\.cursorKeys is required/);
  fails({ secrets: { cursorKeys: cursorKey } }, /secrets\.jwtPublicKeys or secrets\.jwtSecret is required/);
  // an env entry would silently win over the ConfigMap's value
  fails({ secrets: { existingSecret: "jetgate" }, config: { JETGATE_NATS_URL: "nats://elsewhere:4222" } }, /config\.JETGATE_NATS_URL is set by the chart: use nats\.url/);
  // values.schema.json, as helm checks it
  fails({ secrets: { existingSecret: "jetgate" }, gateway: { replica: 3 } }, /values don't meet the specifications[\s\S]*\n- at '\/gateway': additional properties 'replica' not allowed/);
  fails({ secrets: { existingSecret: "jetgate" }, config: { JETGATE_LANES: 3 } }, /- at '\/config\/JETGATE_LANES': got number, want string/);
  // the Secret named instead of the values: nothing to require
  assert.equal(run([valuesFile({ secrets: { existingSecret: "jetgate" } })]).status, 0);
});

test("chart render - helm lint --strict passes the default values, values-ha.yaml and every optional branch", () => {
  const lint = (valueFiles: string[], flags: string[] = []) => {
    const r = helm(["lint", "--strict", ...flags, CHART_DIR, ...valueFiles.flatMap((f) => ["-f", f])]);
    assert.equal(r.status, 0, `helm lint --strict ${valueFiles.join(" ")}:\n${r.stdout}${r.stderr}`);
    assert.match(r.stdout, /1 chart\(s\) linted, 0 chart\(s\) failed/);
  };
  lint([valuesFile(DEFAULTS_WITH_SECRETS)]);
  lint([HA]);
  lint([HA, valuesFile(EXTRAS)], ["--namespace", "edge"]);
  // and it fails the values the render refuses
  const bad = helm(["lint", "--strict", CHART_DIR, "-f", valuesFile({ secrets: { existingSecret: "jetgate" }, gateway: { replica: 3 } })]);
  assert.notEqual(bad.status, 0);
  assert.match(bad.stdout + bad.stderr, /\[ERROR\] values\.yaml: - at '\/gateway': additional properties 'replica' not allowed/);
});
