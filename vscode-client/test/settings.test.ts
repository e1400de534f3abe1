import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { beforeEach, test } from "node:test";
import { __setConfiguration } from "./stub/vscode";
import { buildInitializationOptions, buildServerSettings, configurationFor, readSettings } from "../src/common/settings";

// The payload that tests/server/test_vscode_init_options.py replays against the real server.
const FIXTURE = path.resolve(__dirname, "../../../tests/server/fixtures/vscode_initialization_options.json");

/** A user's settings.json, extension-only settings included. */
const USER_SETTINGS = {
  "oomLsp.path": [],
  "oomLsp.interpreter": ["/opt/venv/bin/python"],
  "oomLsp.select": null,
  "oomLsp.extendSelect": ["OOM900", "OOM101"],
  "oomLsp.ignore": ["OOM202"],
  "oomLsp.perFileIgnores": { "tests/**": ["OOM101"] },
  "oomLsp.exclude": null,
  "oomLsp.extendExclude": ["scratch/**"],
  "oomLsp.maxBatchSize": 64,
  "oomLsp.strict": true,
  "oomLsp.severity": { OOM5: "error", OOM101: "hint" },
  "oomLsp.gpuMemory": "24GiB",
  "oomLsp.gpu": "RTX 3090",
  "oomLsp.worldSize": 2,
  "oomLsp.profile.entryPoint": "train.py",
  "oomLsp.profile.args": ["--epochs", "1"],
  "oomLsp.profile.steps": 2,
  "oomLsp.llm.enabled": false,
  "oomLsp.llm.baseUrl": "http://localhost:11434/v1",
  "oomLsp.llm.model": "qwen2.5-coder:14b",
  "oomLsp.llm.apiKeyEnv": "OLLAMA_API_KEY",
  "oomLsp.llm.timeout": 90,
  "oomLsp.llm.responseFormat": "text",
  "oomLsp.llm.fixLog": null,
  "oomLsp.logLevel": "info",
  "oomLsp.logFile": null,
  "oomLsp.trace.server": "verbose",
};

const EXPECTED_PAYLOAD = {
  settings: {
    extendSelect: ["OOM900", "OOM101"],
    ignore: ["OOM202"],
    perFileIgnores: { "tests/**": ["OOM101"] },
    extendExclude: ["scratch/**"],
    maxBatchSize: 64,
    strict: true,
    severity: { OOM5: "error", OOM101: "hint" },
    gpuMemory: "24GiB",
    gpu: "RTX 3090",
    worldSize: 2,
    profile: { steps: 2, args: ["--epochs", "1"] },
    llm: {
      enabled: false,
      baseUrl: "http://localhost:11434/v1",
      model: "qwen2.5-coder:14b",
      apiKeyEnv: "OLLAMA_API_KEY",
      timeout: 90,
      responseFormat: "text",
    },
    logLevel: "info",
  },
};

beforeEach(() => __setConfiguration({}));

test("the initializationOptions of a user's settings are exactly the server's keys", () => {
  __setConfiguration(USER_SETTINGS);
  const payload = buildInitializationOptions(configurationFor());
  assert.deepEqual(payload, EXPECTED_PAYLOAD);
  mkdirSync(path.dirname(FIXTURE), { recursive: true });
  writeFileSync(FIXTURE, `${JSON.stringify(payload, null, 2)}\n`);
});

test("nothing configured sends only what cannot replace a server default", () => {
  assert.deepEqual(buildInitializationOptions(configurationFor()), {
    settings: { llm: { enabled: false }, logLevel: "info" },
  });
});

test("an explicit empty select is sent: it means no rules", () => {
  __setConfiguration({ "oomLsp.select": [] });
  assert.deepEqual(buildInitializationOptions(configurationFor()).settings.select, []);
});

test("values of the wrong type or out of range fall back to the defaults", () => {
  __setConfiguration({
    "oomLsp.maxBatchSize": 0,
    "oomLsp.strict": "yes",
    "oomLsp.severity": { OOM5: "fatal", OOM101: "hint" },
    "oomLsp.perFileIgnores": { "a/**": "OOM101" },
    "oomLsp.logLevel": "verbose",
    "oomLsp.llm.responseFormat": "xml",
    "oomLsp.gpuMemory": "   ",
    "oomLsp.profile.steps": 1.5,
  });
  const settings = readSettings(configurationFor());
  assert.equal(settings.maxBatchSize, null);
  assert.equal(settings.strict, null);
  assert.deepEqual(settings.severity, { OOM101: "hint" });
  assert.deepEqual(settings.perFileIgnores, {});
  assert.equal(settings.logLevel, "info");
  assert.equal(settings.llm.responseFormat, null);
  assert.equal(settings.gpuMemory, null);
  assert.equal(settings.profile.steps, 3);
});

test("the extension-only settings are read for the extension", () => {
  __setConfiguration(USER_SETTINGS);
  const settings = readSettings(configurationFor());
  assert.deepEqual(settings.interpreter, ["/opt/venv/bin/python"]);
  assert.equal(settings.gpu, "RTX 3090");
  assert.deepEqual(settings.profile, { entryPoint: "train.py", args: ["--epochs", "1"], steps: 2 });
});

test("an untrusted workspace is said to the server, in both payloads; a trusted one sends nothing new", () => {
  __setConfiguration(USER_SETTINGS);
  const untrusted = buildInitializationOptions(configurationFor(), false);
  assert.equal(untrusted.settings.workspaceTrusted, false);
  assert.deepEqual(buildServerSettings(readSettings(configurationFor()), false), untrusted.settings);
  const { workspaceTrusted: _, ...rest } = untrusted.settings;
  assert.deepEqual({ settings: rest }, EXPECTED_PAYLOAD);
  assert.equal("workspaceTrusted" in buildInitializationOptions(configurationFor(), true).settings, false);
});
