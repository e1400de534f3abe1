/**
 * The `oomLsp.*` settings: read once into a typed snapshot, and turned into the
 * payload the language server accepts.
 *
 * The server rejects a settings object with an unknown key (it shows an error and
 * falls back to its defaults), so only the keys it parses are sent, and only when
 * they say something: an empty list or an unset value would *replace* the server's
 * default (an empty `select` would turn every rule off). What the server's commands
 * read (`gpu`, `worldSize`, `profile.args`, `profile.steps`) is sent too, so that a
 * command run with the file alone (a code lens) uses the settings the palette command
 * passes. Extension-only settings (`path`, `interpreter`, `profile.entryPoint`,
 * `trace.server`) stay in the extension.
 */
import * as vscode from "vscode";

export const SECTION = "oomLsp";
/** The optimizer steps a profile runs when `oomLsp.profile.steps` is unset (the server's default too). */
export const DEFAULT_PROFILE_STEPS = 3;

export type Severity = "error" | "warning" | "info" | "hint";
export type LogLevel = "error" | "warning" | "info" | "debug";

export interface LlmSettings {
  enabled: boolean;
  baseUrl: string | null;
  model: string | null;
  apiKeyEnv: string | null;
  timeout: number | null;
  responseFormat: "text" | "json_schema" | null;
  fixLog: string | null;
}

export interface ProfileSettings {
  entryPoint: string | null;
  args: string[];
  steps: number;
}

export interface ExtensionSettings {
  /** How to start the server: a full command line; wins over everything. */
  path: string[];
  /** The Python that runs `-m oom_lsp` and the profiled code. */
  interpreter: string[];
  select: string[] | null;
  extendSelect: string[];
  ignore: string[];
  perFileIgnores: Record<string, string[]>;
  exclude: string[] | null;
  extendExclude: string[];
  maxBatchSize: number | null;
  /** Every finding the rules prove (`strict`); null: the project's setting. */
  strict: boolean | null;
  severity: Record<string, Severity>;
  gpuMemory: string | null;
  gpu: string | null;
  worldSize: number | null;
  profile: ProfileSettings;
  llm: LlmSettings;
  logLevel: LogLevel;
  logFile: string | null;
}

/** Settings whose change needs a new server process, not just a new snapshot. */
export const RESTART_SETTINGS = ["path", "interpreter"].map((key) => `${SECTION}.${key}`);

/** The subset of vscode.WorkspaceConfiguration this module reads. */
export interface ConfigurationReader {
  get<T>(key: string): T | undefined;
}

function stringList(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((item): item is string => typeof item === "string") : [];
}

function optionalStringList(value: unknown): string[] | null {
  return Array.isArray(value) ? stringList(value) : null;
}

function optionalBoolean(value: unknown): boolean | null {
  return typeof value === "boolean" ? value : null;
}

function optionalString(value: unknown): string | null {
  return typeof value === "string" && value.trim() !== "" ? value.trim() : null;
}

function optionalPositiveNumber(value: unknown): number | null {
  return typeof value === "number" && Number.isFinite(value) && value > 0 ? value : null;
}

function optionalWholeNumber(value: unknown): number | null {
  return typeof value === "number" && Number.isInteger(value) && value > 0 ? value : null;
}

function stringTable<T>(value: unknown, accept: (item: unknown) => item is T): Record<string, T> {
  const table: Record<string, T> = {};
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    for (const [key, item] of Object.entries(value)) {
      if (accept(item)) {
        table[key] = item;
      }
    }
  }
  return table;
}

const SEVERITIES: readonly string[] = ["error", "warning", "info", "hint"];
const LOG_LEVELS: readonly string[] = ["error", "warning", "info", "debug"];

function isSeverity(item: unknown): item is Severity {
  return typeof item === "string" && SEVERITIES.includes(item);
}

function isStringList(item: unknown): item is string[] {
  return Array.isArray(item) && item.every((entry) => typeof entry === "string");
}

export function readSettings(config: ConfigurationReader): ExtensionSettings {
  const logLevel = config.get<string>("logLevel");
  const responseFormat = config.get<string>("llm.responseFormat");
  const steps = config.get<number>("profile.steps");
  return {
    path: stringList(config.get("path")),
    interpreter: stringList(config.get("interpreter")),
    select: optionalStringList(config.get("select")),
    extendSelect: stringList(config.get("extendSelect")),
    ignore: stringList(config.get("ignore")),
    perFileIgnores: stringTable(config.get("perFileIgnores"), isStringList),
    exclude: optionalStringList(config.get("exclude")),
    extendExclude: stringList(config.get("extendExclude")),
    maxBatchSize: optionalPositiveNumber(config.get("maxBatchSize")),
    strict: optionalBoolean(config.get("strict")),
    severity: stringTable(config.get("severity"), isSeverity),
    gpuMemory: optionalString(config.get("gpuMemory")),
    gpu: optionalString(config.get("gpu")),
    worldSize: optionalWholeNumber(config.get("worldSize")),
    profile: {
      entryPoint: optionalString(config.get("profile.entryPoint")),
      args: stringList(config.get("profile.args")),
      steps: typeof steps === "number" && Number.isInteger(steps) && steps > 0 ? steps : DEFAULT_PROFILE_STEPS,
    },
    llm: {
      enabled: config.get<boolean>("llm.enabled") === true,
      baseUrl: optionalString(config.get("llm.baseUrl")),
      model: optionalString(config.get("llm.model")),
      apiKeyEnv: optionalString(config.get("llm.apiKeyEnv")),
      timeout: optionalPositiveNumber(config.get("llm.timeout")),
      responseFormat: responseFormat === "text" || responseFormat === "json_schema" ? responseFormat : null,
      fixLog: optionalString(config.get("llm.fixLog")),
    },
    logLevel: logLevel !== undefined && LOG_LEVELS.includes(logLevel) ? (logLevel as LogLevel) : "info",
    logFile: optionalString(config.get("logFile")),
  };
}

/** The `oomLsp` object the server parses (camelCase keys of `[tool.oom-lsp]`, its own
 * `logLevel` / `logFile`, and the settings of its commands). */
export type ServerSettings = Record<string, unknown>;

/** `trusted`: VS Code's workspace trust. An untrusted workspace is said (`workspaceTrusted:
 * false`): the server then sends no lens, and runs no command, that runs the workspace's code.
 * Trusted is the server's default, so nothing is sent for it. */
export function buildServerSettings(settings: ExtensionSettings, trusted = true): ServerSettings {
  const payload: ServerSettings = {};
  if (!trusted) {
    payload.workspaceTrusted = false;
  }
  if (settings.select !== null) {
    payload.select = settings.select;
  }
  if (settings.extendSelect.length > 0) {
    payload.extendSelect = settings.extendSelect;
  }
  if (settings.ignore.length > 0) {
    payload.ignore = settings.ignore;
  }
  if (Object.keys(settings.perFileIgnores).length > 0) {
    payload.perFileIgnores = settings.perFileIgnores;
  }
  if (settings.exclude !== null) {
    payload.exclude = settings.exclude;
  }
  if (settings.extendExclude.length > 0) {
    payload.extendExclude = settings.extendExclude;
  }
  if (settings.maxBatchSize !== null) {
    payload.maxBatchSize = settings.maxBatchSize;
  }
  if (settings.strict !== null) {
    payload.strict = settings.strict;
  }
  if (Object.keys(settings.severity).length > 0) {
    payload.severity = settings.severity;
  }
  if (settings.gpuMemory !== null) {
    payload.gpuMemory = settings.gpuMemory;
  }
  if (settings.gpu !== null) {
    payload.gpu = settings.gpu;
  }
  if (settings.worldSize !== null) {
    payload.worldSize = settings.worldSize;
  }
  const { args, steps } = settings.profile;
  if (args.length > 0 || steps !== DEFAULT_PROFILE_STEPS) {
    payload.profile = args.length > 0 ? { steps, args } : { steps };
  }
  payload.llm = buildLlmSettings(settings.llm);
  payload.logLevel = settings.logLevel;
  if (settings.logFile !== null) {
    payload.logFile = settings.logFile;
  }
  return payload;
}

function buildLlmSettings(llm: LlmSettings): Record<string, unknown> {
  const table: Record<string, unknown> = { enabled: llm.enabled };
  const optional: [string, unknown][] = [
    ["baseUrl", llm.baseUrl],
    ["model", llm.model],
    ["apiKeyEnv", llm.apiKeyEnv],
    ["timeout", llm.timeout],
    ["responseFormat", llm.responseFormat],
    ["fixLog", llm.fixLog],
  ];
  for (const [key, value] of optional) {
    if (value !== null) {
      table[key] = value;
    }
  }
  return table;
}

/** What the extension sends as `initializationOptions`: the same object it
 * answers to `workspace/configuration`, so both paths agree. */
export function buildInitializationOptions(config: ConfigurationReader, trusted = true): { settings: ServerSettings } {
  return { settings: buildServerSettings(readSettings(config), trusted) };
}

/** The `oomLsp` configuration of a resource (or of the window). */
export function configurationFor(scope?: vscode.ConfigurationScope): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION, scope);
}
