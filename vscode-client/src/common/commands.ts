/**
 * The server's on-request features (docs/server-commands.md): their ids, the
 * argument each palette command sends, and how each result is told to the user.
 * Pure: no VS Code, no processes.
 */
import type { ExtensionSettings } from "./settings";

export const SERVER_COMMANDS = {
  profile: "oom-lsp.profile",
  estimate: "oom-lsp.estimate",
  whatIf: "oom-lsp.whatIf",
  explainOom: "oom-lsp.explainOom",
  askAi: "oom-lsp.askAi",
  validateFix: "oom-lsp.validateFix",
  showReport: "oom-lsp.showReport",
} as const;

export type ServerCommandId = (typeof SERVER_COMMANDS)[keyof typeof SERVER_COMMANDS];

/** The server commands that run the workspace's code (its scripts, under the user's Python):
 * not offered in VS Code's restricted mode, where the server sends no lens for them either. */
export const RUNS_WORKSPACE_CODE: ReadonlySet<ServerCommandId> = new Set<ServerCommandId>([
  SERVER_COMMANDS.profile,
  SERVER_COMMANDS.estimate,
  SERVER_COMMANDS.whatIf,
  SERVER_COMMANDS.validateFix,
]);

/** Why a command is not run in restricted mode, in one line the user can act on. */
export function untrustedMessage(command: ServerCommandId): string {
  return `oom-lsp: to ${COMMAND_PURPOSE[command]}, oom-lsp runs this workspace's code, and the workspace is in Restricted Mode. Trust the workspace to run it.`;
}

/** What each server command does, for messages ("... cannot profile memory"). */
export const COMMAND_PURPOSE: Record<ServerCommandId, string> = {
  "oom-lsp.profile": "profile memory",
  "oom-lsp.estimate": "estimate peak memory",
  "oom-lsp.whatIf": "measure what each fix saves",
  "oom-lsp.explainOom": "explain an OOM error",
  "oom-lsp.askAi": "ask AI to fix",
  "oom-lsp.validateFix": "validate the last fix",
  "oom-lsp.showReport": "show the memory report",
};

export interface ProfileArguments {
  uri: string;
  steps: number;
  args?: string[];
  python?: string;
}

export function profileArguments(settings: ExtensionSettings, uri: string, python: string | null): ProfileArguments {
  const argument: ProfileArguments = { uri, steps: settings.profile.steps };
  if (settings.profile.args.length > 0) {
    argument.args = settings.profile.args;
  }
  if (python !== null) {
    argument.python = python;
  }
  return argument;
}

export interface EstimateArguments {
  uri: string;
  python?: string;
  /** false: the palette shows the answer's message itself (with "Open report"); the lens, which
   * sends the file alone, gets the server's window/showMessage. */
  showResult?: boolean;
}

/** The estimate's and the what-if's arguments: the file (and the project's interpreter). The
 * target GPU, the world size and the script's arguments are the server's settings (`oomLsp.gpu`,
 * `gpuMemory`, `worldSize`, `profile.args`, sent with the others), so that the palette command
 * and the code lens, which sends the file alone, estimate the same thing. */
export function estimateArguments(uri: string, python: string | null): EstimateArguments {
  return python !== null ? { uri, python } : { uri };
}

const GIB = 2 ** 30;
const MIB = 2 ** 20;

function oneDecimal(value: number): string {
  const rounded = value.toFixed(1);
  return rounded.endsWith(".0") ? rounded.slice(0, -2) : rounded;
}

/** Bytes as GiB with one decimal ("14.2", "24"). */
export function formatGiB(bytes: number): string {
  return oneDecimal(bytes / GIB);
}

/** Bytes with their unit: GiB from 1 GiB up, MiB below ("14.2 GiB", "9.5 MiB"). */
export function formatBytes(bytes: number): string {
  return bytes >= GIB ? `${formatGiB(bytes)} GiB` : `${oneDecimal(bytes / MIB)} MiB`;
}

/** The `oomLsp/memoryStatus` notification. */
export interface MemoryStatus {
  uri: string;
  peakBytes: number | null;
  /** An estimate's process total (reserved memory and the CUDA context): what its verdict holds. */
  neededBytes?: number | null;
  gpuMemoryBytes?: number | null;
  gpuName?: string | null;
  source?: string;
  reportPath?: string | null;
  exceedsGpu?: boolean;
}

export interface StatusBarView {
  text: string;
  tooltip: string;
  warning: boolean;
}

/** The status bar for a file's last result; null when there is none to show. */
export function memoryStatusView(status: MemoryStatus): StatusBarView | null {
  if (typeof status.peakBytes !== "number") {
    return null;
  }
  // An estimate's bar shows the process total, the figure its verdict holds against the GPU.
  const allocated = status.peakBytes;
  const peak = typeof status.neededBytes === "number" ? status.neededBytes : allocated;
  const capacity = typeof status.gpuMemoryBytes === "number" ? status.gpuMemoryBytes : null;
  let text: string;
  if (capacity === null) {
    text = `OOM: ${formatBytes(peak)}`;
  } else if (peak >= GIB && capacity >= GIB) {
    text = `OOM: ${formatGiB(peak)} / ${formatGiB(capacity)} GiB`;
  } else {
    text = `OOM: ${formatBytes(peak)} / ${formatBytes(capacity)}`;
  }
  const gpu = status.gpuName ? ` on ${status.gpuName}` : "";
  const origin = status.source === "profile" ? "Profiled" : "Estimated";
  const verdict = status.exceedsGpu ? " (more than the GPU has)" : "";
  const named =
    peak !== allocated
      ? `${origin} process total: ${formatBytes(peak)} (reserved + CUDA context), ${formatBytes(allocated)} allocated`
      : `${origin} peak: ${formatBytes(peak)}`;
  return {
    text,
    tooltip: `${named}${gpu}${verdict}. Click to open the report.`,
    warning: status.exceedsGpu === true,
  };
}

export interface ProfileResult {
  reportPath: string;
  peakBytes: number | null;
  reservedBytes?: number;
  device: string;
  steps: number;
  status?: string;
  /** Why a run that timed out, crashed or failed stopped. */
  message?: string;
  oom?: unknown;
}

export function describeProfile(result: ProfileResult): string {
  if (result.oom) {
    return `Profiling ran out of memory on ${result.device}; the failing line is marked and the report says where the memory went.`;
  }
  if (result.message) {
    return `Profiling stopped (${result.status ?? "error"}): ${result.message}`;
  }
  const steps = `${result.steps} step${result.steps === 1 ? "" : "s"}`;
  if (typeof result.peakBytes !== "number") {
    return `Profiled ${steps} on ${result.device}.`;
  }
  const reserved = typeof result.reservedBytes === "number" ? ` (${formatBytes(result.reservedBytes)} reserved)` : "";
  return `Profiled ${steps} on ${result.device}: peak ${formatBytes(result.peakBytes)}${reserved}.`;
}

export interface EstimateResult {
  reportPath: string;
  peakBytes: number;
  reservedBytes?: number | null;
  gpuName?: string;
  gpuMemoryBytes: number | null;
  verdict: "fits" | "tight" | "oom" | null;
  batchSize?: number | null;
  maxBatch?: number;
  worldSize?: number;
  /** The estimate of a script a what-if predicted (a fix applied): how the two compare. */
  whatIfCheck?: WhatIfCheck;
  /** The server's one line, the figures and verdict of `oom-lsp estimate`, the peaks named. */
  message?: string;
  /** The memory timeline page (`oom-lsp estimate --html`'s), written beside the report. */
  pagePath?: string;
}

export interface WhatIfCheck {
  change: string;
  predictedBytes: number;
  estimatedBytes: number;
  differencePercent: number;
  agrees: boolean;
  message: string;
}

export interface WhatIfResult {
  markdownPath: string;
  shown: boolean;
}

const VERDICT: Record<NonNullable<EstimateResult["verdict"]>, string> = {
  fits: "fits",
  tight: "is tight",
  oom: "does not fit",
};

export function describeEstimate(result: EstimateResult): string {
  if (typeof result.message === "string") {
    // The server's words, the same the lens and Neovim show; a what-if check within 5 % follows.
    return result.message + (result.whatIfCheck?.agrees ? ` The ${result.whatIfCheck.message}.` : "");
  }
  const batch = typeof result.batchSize === "number" ? ` at batch size ${result.batchSize}` : "";
  const gpu =
    typeof result.gpuMemoryBytes === "number"
      ? ` on ${result.gpuName ? `${result.gpuName}, ` : ""}${formatBytes(result.gpuMemoryBytes)}`
      : "";
  const verdict = result.verdict ? `: ${VERDICT[result.verdict] ?? result.verdict}` : "";
  const maxBatch = typeof result.maxBatch === "number" ? ` Largest batch that fits: ${result.maxBatch}.` : "";
  const perRank = typeof result.worldSize === "number" ? ` per rank of ${result.worldSize}` : "";
  // A prediction that was off comes as the server's own warning; one within 5 % is a line here.
  const check = result.whatIfCheck?.agrees ? ` The ${result.whatIfCheck.message}.` : "";
  return `Estimated peak ${formatBytes(result.peakBytes)}${perRank}${batch}${gpu}${verdict}.${maxBatch}${check}`;
}

/** The server shows a what-if's table with window/showDocument: a Markdown file under the
 * results folder, which VS Code shows best as a preview, not as its source. */
/** The estimate command's answer, where it wrote a memory timeline page (a self-contained .html). */
export function estimatePage(result: unknown): string | undefined {
  const page = (result as { pagePath?: unknown } | null | undefined)?.pagePath;
  return typeof page === "string" && page.endsWith(".html") ? page : undefined;
}

export function isWhatIfTable(uri: string): boolean {
  return /^file:.*\/\.oom_lsp\/what-if\/[^/]+\.md$/.test(uri);
}

export interface ValidationResult {
  before: number;
  after: number;
  change: number;
  source: "profile" | "estimate";
}

export function describeValidation(result: ValidationResult): string {
  const percent = result.before > 0 ? ` (${((100 * (result.after - result.before)) / result.before).toFixed(0)}%)` : "";
  const direction = result.after < result.before ? "down" : result.after > result.before ? "up" : "unchanged";
  return `Peak memory ${direction}: ${formatBytes(result.before)} before, ${formatBytes(result.after)} after${percent}, by ${result.source}.`;
}

export interface OomFrame {
  path?: string;
  line?: number;
  function?: string;
  code?: string;
}

export interface OomError {
  triedToAllocate?: number | null;
  totalCapacity?: number | null;
  allocated?: number | null;
  reserved?: number | null;
  free?: number | null;
  device?: string | null;
  hint?: string | null;
  frame?: OomFrame | null;
}

function size(bytes: number | null | undefined): string | null {
  return typeof bytes === "number" ? formatBytes(bytes) : null;
}

/** A Markdown explanation of the OOM errors found in a log. */
export function explainMarkdown(errors: OomError[]): string {
  if (errors.length === 0) {
    return "# No CUDA out-of-memory error found\n\nThe text did not contain a `torch.OutOfMemoryError` (`CUDA out of memory`) message.\n";
  }
  const sections = errors.map((error, index) => {
    const lines = [`## OOM ${index + 1}${error.device ? ` on ${error.device}` : ""}`, ""];
    const numbers: [string, string | null][] = [
      ["Tried to allocate", size(error.triedToAllocate)],
      ["Total capacity", size(error.totalCapacity)],
      ["Allocated by PyTorch", size(error.allocated)],
      ["Reserved by PyTorch", size(error.reserved)],
      ["Free", size(error.free)],
    ];
    for (const [label, value] of numbers) {
      if (value !== null) {
        lines.push(`- ${label}: ${value}`);
      }
    }
    if (error.frame?.path) {
      const where = `${error.frame.path}${error.frame.line ? `:${error.frame.line}` : ""}`;
      lines.push("", `Failing line, in \`${error.frame.function ?? "?"}\` at ${where}:`);
      if (error.frame.code) {
        lines.push("", "```python", error.frame.code, "```");
      }
    }
    if (error.hint) {
      lines.push("", error.hint);
    }
    return lines.join("\n");
  });
  return `# CUDA out-of-memory explained\n\n${sections.join("\n\n")}\n`;
}

export type CommandFailure =
  | { kind: "cancelled" }
  | { kind: "unavailable"; message: string }
  | { kind: "failed"; message: string };

/** JSON-RPC error codes that matter here. */
export const METHOD_NOT_FOUND = -32601;
export const INVALID_PARAMS = -32602;
export const REQUEST_CANCELLED = -32800;

/** How a failed `workspace/executeCommand` is told to the user. */
export function describeCommandError(
  command: ServerCommandId,
  error: { code?: number; message?: string },
): CommandFailure {
  const message = error.message ?? String(error);
  if (error.code === REQUEST_CANCELLED) {
    return { kind: "cancelled" };
  }
  // pygls answers an unknown command with InvalidParams: "Command name '...' is not defined".
  if (error.code === METHOD_NOT_FOUND || /command .*(not found|not defined)|unknown command/i.test(message)) {
    return { kind: "unavailable", message: unavailableMessage(command) };
  }
  if (error.code === INVALID_PARAMS) {
    return {
      kind: "failed",
      message: `oom-lsp could not ${COMMAND_PURPOSE[command]}: the server did not accept the request (${message}). The extension and the server may be from different versions.`,
    };
  }
  return { kind: "failed", message: `oom-lsp could not ${COMMAND_PURPOSE[command]}: ${message}` };
}

export function unavailableMessage(command: ServerCommandId): string {
  return `This oom-lsp server cannot ${COMMAND_PURPOSE[command]} (it has no "${command}" command). Update oom-lsp in the environment the server runs from.`;
}

/** A `$/progress` value of the LSP work-done protocol. */
export interface WorkDoneValue {
  kind: "begin" | "report" | "end";
  title?: string;
  message?: string;
  percentage?: number;
}

export interface ProgressUpdate {
  message?: string;
  increment?: number;
}

/** Turns work-done values (absolute percentages) into VS Code progress updates
 * (increments); null at the end. `showTitle`: the server's title becomes the
 * first message (not when our own notification already has a title). */
export class ProgressRelay {
  private reported = 0;

  constructor(private readonly showTitle: boolean) {}

  update(value: WorkDoneValue): ProgressUpdate | null {
    if (value.kind === "end") {
      return null;
    }
    const update: ProgressUpdate = {};
    const message = value.message ?? (value.kind === "begin" && this.showTitle ? value.title : undefined);
    if (message !== undefined) {
      update.message = message;
    }
    if (typeof value.percentage === "number") {
      const percentage = Math.max(0, Math.min(100, value.percentage));
      if (percentage > this.reported) {
        update.increment = percentage - this.reported;
        this.reported = percentage;
      }
    }
    return update;
  }
}
