import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import {
  describeCommandError,
  describeEstimate,
  describeProfile,
  describeValidation,
  estimateArguments,
  estimatePage,
  explainMarkdown,
  formatBytes,
  formatGiB,
  isWhatIfTable,
  memoryStatusView,
  profileArguments,
  ProgressRelay,
  RUNS_WORKSPACE_CODE,
  untrustedMessage,
} from "../src/common/commands";
import { readSettings } from "../src/common/settings";

function settingsOf(values: Record<string, unknown>) {
  return readSettings({ get: <T>(key: string) => values[key] as T | undefined });
}

test("GiB with one decimal, whole numbers bare; MiB below a GiB", () => {
  assert.equal(formatGiB(15_246_000_000), "14.2");
  assert.equal(formatGiB(25_769_803_776), "24");
  assert.equal(formatGiB(0), "0");
  assert.equal(formatBytes(15_246_000_000), "14.2 GiB");
  assert.equal(formatBytes(9.5 * 2 ** 20), "9.5 MiB");
  assert.equal(formatBytes(0), "0 MiB");
});

test("the status bar reads like the docs' example and warns when the GPU is too small", () => {
  const status = {
    uri: "file:///w/train.py",
    peakBytes: 15_246_000_000,
    gpuMemoryBytes: 25_769_803_776,
    gpuName: "RTX 3090",
    source: "estimate",
    reportPath: "/w/.oom_lsp/estimate/report.json",
    exceedsGpu: false,
  };
  assert.deepEqual(memoryStatusView(status), {
    text: "OOM: 14.2 / 24 GiB",
    tooltip: "Estimated peak: 14.2 GiB on RTX 3090. Click to open the report.",
    warning: false,
  });
  const over = memoryStatusView({ ...status, peakBytes: 30 * 2 ** 30, exceedsGpu: true, source: "profile" });
  assert.equal(over?.text, "OOM: 30 / 24 GiB");
  assert.equal(over?.warning, true);
  assert.match(over?.tooltip ?? "", /^Profiled peak: 30 GiB on RTX 3090 \(more than the GPU has\)/);
  assert.equal(memoryStatusView({ ...status, peakBytes: null }), null);
  assert.equal(memoryStatusView({ uri: status.uri, peakBytes: 2 ** 30 })?.text, "OOM: 1 GiB");
  // An estimate on CUDA: the process total the verdict holds, the allocated peak named beside it.
  const cuda = memoryStatusView({ ...status, peakBytes: 9.5 * 2 ** 20, neededBytes: 448 * 2 ** 20 });
  assert.equal(cuda?.text, "OOM: 448 MiB / 24 GiB");
  assert.equal(
    cuda?.tooltip,
    "Estimated process total: 448 MiB (reserved + CUDA context), 9.5 MiB allocated on RTX 3090. Click to open the report.",
  );
  // A small model is not "0 GiB".
  assert.equal(memoryStatusView({ ...status, peakBytes: 9.5 * 2 ** 20 })?.text, "OOM: 9.5 MiB / 24 GiB");
});

test("profile arguments carry the profile's settings; the estimate's the file alone, as the lens sends it", () => {
  const settings = settingsOf({
    "profile.steps": 2,
    "profile.args": ["--epochs", "1"],
    gpu: "A100-80GB",
    gpuMemory: "80GiB",
    worldSize: 8,
  });
  assert.deepEqual(profileArguments(settings, "file:///w/train.py", "/w/.venv/bin/python"), {
    uri: "file:///w/train.py",
    steps: 2,
    args: ["--epochs", "1"],
    python: "/w/.venv/bin/python",
  });
  // The GPU, the world size and the script's arguments reach the server as settings (settings.ts).
  assert.deepEqual(estimateArguments("file:///w/train.py", null), { uri: "file:///w/train.py" });
  assert.deepEqual(estimateArguments("file:///w/train.py", "/w/.venv/bin/python"), {
    uri: "file:///w/train.py",
    python: "/w/.venv/bin/python",
  });
  assert.deepEqual(profileArguments(settingsOf({}), "file:///w/t.py", null), { uri: "file:///w/t.py", steps: 3 });
});

test("an estimate is told in the server's words when it sends them", () => {
  const message =
    "Estimated peak of mlp.py at batch 32: ≈ 91 MiB allocated, 506 MiB process total / 24 GiB RTX 3090: fits.";
  assert.equal(
    describeEstimate({ reportPath: "/r.json", peakBytes: 1, gpuMemoryBytes: null, verdict: "fits", message }),
    message,
  );
});

test("results are told in one sentence", () => {
  assert.equal(
    describeEstimate({
      reportPath: "/r.json",
      peakBytes: 15_246_000_000,
      gpuName: "RTX 3090",
      gpuMemoryBytes: 25_769_803_776,
      verdict: "fits",
      maxBatch: 96,
    }),
    "Estimated peak 14.2 GiB on RTX 3090, 24 GiB: fits. Largest batch that fits: 96.",
  );
  // No GPU known (nothing configured, none detected): no capacity, no verdict.
  assert.equal(
    describeEstimate({ reportPath: "/r.json", peakBytes: 2 ** 30, gpuMemoryBytes: null, verdict: null, batchSize: 64 }),
    "Estimated peak 1 GiB at batch size 64.",
  );
  assert.equal(
    describeEstimate({
      reportPath: "/r.json",
      peakBytes: 2 ** 30,
      gpuName: "A100 40GB",
      gpuMemoryBytes: 40 * 2 ** 30,
      verdict: "fits",
      batchSize: 8,
      worldSize: 4,
    }),
    "Estimated peak 1 GiB per rank of 4 at batch size 8 on A100 40GB, 40 GiB: fits.",
  );
  assert.equal(
    describeProfile({ reportPath: "/r", peakBytes: 3 * 2 ** 30, device: "cuda", steps: 2, status: "complete" }),
    "Profiled 2 steps on cuda: peak 3 GiB.",
  );
  assert.equal(
    describeProfile({ reportPath: "/r", peakBytes: null, device: "cpu", steps: 0, status: "crashed", message: "exit 1" }),
    "Profiling stopped (crashed): exit 1",
  );
  assert.equal(
    describeValidation({ before: 20 * 2 ** 30, after: 15 * 2 ** 30, change: -5 * 2 ** 30, source: "estimate" }),
    "Peak memory down: 20 GiB before, 15 GiB after (-25%), by estimate.",
  );
});

test("a server without the command, a cancel and a bad request are told apart", () => {
  assert.deepEqual(describeCommandError("oom-lsp.profile", { code: -32800, message: "cancelled" }), { kind: "cancelled" });
  const missing = describeCommandError("oom-lsp.askAi", { code: -32601, message: "Unhandled method" });
  assert.equal(missing.kind, "unavailable");
  assert.match(missing.kind === "unavailable" ? missing.message : "", /cannot ask AI to fix \(it has no "oom-lsp.askAi" command\)/);
  assert.equal(describeCommandError("oom-lsp.estimate", { code: -32603, message: 'Command "oom-lsp.estimate" not found' }).kind, "unavailable");
  const undefinedInPygls = describeCommandError("oom-lsp.validateFix", {
    code: -32602,
    message: "Command name 'oom-lsp.validateFix' is not defined",
  });
  assert.equal(undefinedInPygls.kind, "unavailable");
  const invalid = describeCommandError("oom-lsp.estimate", { code: -32602, message: "uri: missing" });
  assert.equal(invalid.kind, "failed");
  assert.match(invalid.kind === "failed" ? invalid.message : "", /did not accept the request \(uri: missing\)/);
});

test("an OOM explanation lists the numbers and the failing line", () => {
  const markdown = explainMarkdown([
    {
      triedToAllocate: 2 * 2 ** 30,
      totalCapacity: 24 * 2 ** 30,
      allocated: 21.5 * 2 ** 30,
      free: 0.5 * 2 ** 30,
      device: "cuda:0",
      hint: "Lower the batch size.",
      frame: { path: "train.py", line: 42, function: "train", code: "loss = model(x)" },
    },
  ]);
  assert.match(markdown, /## OOM 1 on cuda:0/);
  assert.match(markdown, /- Tried to allocate: 2 GiB\n- Total capacity: 24 GiB\n- Allocated by PyTorch: 21.5 GiB\n- Free: 512 MiB/);
  assert.match(markdown, /in `train` at train.py:42:\n\n```python\nloss = model\(x\)\n```\n\nLower the batch size\./);
  assert.match(explainMarkdown([]), /No CUDA out-of-memory error found/);
});

test("server progress becomes increments and messages; the end closes it", () => {
  const relay = new ProgressRelay(true);
  assert.deepEqual(relay.update({ kind: "begin", title: "Profiling", percentage: 0 }), { message: "Profiling" });
  assert.deepEqual(relay.update({ kind: "report", message: "step 1/2", percentage: 40 }), {
    message: "step 1/2",
    increment: 40,
  });
  assert.deepEqual(relay.update({ kind: "report", percentage: 30 }), {});
  assert.deepEqual(relay.update({ kind: "report", message: "step 2/2", percentage: 150 }), {
    message: "step 2/2",
    increment: 60,
  });
  assert.equal(relay.update({ kind: "end", message: "done" }), null);
  // In a notification that has its own title, the server's title is not repeated.
  assert.deepEqual(new ProgressRelay(false).update({ kind: "begin", title: "Estimating mlp.py" }), {});
});

test("an estimate after a fix says how it compares with the what-if's prediction", () => {
  const result = {
    reportPath: "/r.json",
    peakBytes: 2 ** 30,
    gpuMemoryBytes: null,
    verdict: null,
    batchSize: 128,
  } as const;
  const check = {
    change: "OOM304 line 59: Drop `retain_graph=True`",
    predictedBytes: 850 * 2 ** 20,
    estimatedBytes: 850 * 2 ** 20,
    differencePercent: 0,
    agrees: true,
    message: "what-if check: OOM304 line 59: Drop `retain_graph=True`: predicted 850.00 MiB, estimated now 850.00 MiB (+0.0 %, within 5%)",
  };
  assert.equal(
    describeEstimate({ ...result, whatIfCheck: check }),
    `Estimated peak 1 GiB at batch size 128. The ${check.message}.`,
  );
  // Off by more: the server's warning says so; the sentence does not repeat it.
  assert.equal(
    describeEstimate({ ...result, whatIfCheck: { ...check, agrees: false, differencePercent: 25 } }),
    "Estimated peak 1 GiB at batch size 128.",
  );
});

test("only the what-if's table opens as a Markdown preview", () => {
  assert.equal(isWhatIfTable("file:///home/me/project/.oom_lsp/what-if/train.md"), true);
  assert.equal(isWhatIfTable("file:///home/me/project/notes.md"), false);
  assert.equal(isWhatIfTable("file:///home/me/project/.oom_lsp/what-if/train.json"), false);
  assert.equal(isWhatIfTable("file:///home/me/project/train.py"), false);
});

test("the estimate's answer names the memory timeline page the lens opens in a webview", () => {
  const answer = { reportPath: "/p/.oom_lsp/estimate/train.json", pagePath: "/p/.oom_lsp/estimate/train.html" };
  assert.equal(estimatePage(answer), "/p/.oom_lsp/estimate/train.html");
  assert.equal(estimatePage({ reportPath: "/p/.oom_lsp/estimate/train.json" }), undefined); // a notebook: no page
  assert.equal(estimatePage({ pagePath: "/p/train.json" }), undefined);
  assert.equal(estimatePage(null), undefined);
});

test("Restricted Mode: the commands that run the workspace's code are the palette entries hidden until trust", () => {
  assert.deepEqual(
    [...RUNS_WORKSPACE_CODE].sort(),
    ["oom-lsp.estimate", "oom-lsp.profile", "oom-lsp.validateFix", "oom-lsp.whatIf"],
  );
  const manifest = JSON.parse(readFileSync(path.resolve(__dirname, "../../package.json"), "utf8"));
  assert.equal(manifest.capabilities.untrustedWorkspaces.supported, "limited");
  const hidden = manifest.contributes.menus.commandPalette
    .filter((entry: { when?: string }) => entry.when?.includes("isWorkspaceTrusted"))
    .map((entry: { command: string }) => entry.command)
    .sort();
  assert.deepEqual(hidden, ["oomLsp.estimateFile", "oomLsp.profileFile", "oomLsp.validateFix", "oomLsp.whatIfFile"]);
  assert.equal(
    untrustedMessage("oom-lsp.estimate"),
    "oom-lsp: to estimate peak memory, oom-lsp runs this workspace's code, and the workspace is in Restricted Mode. Trust the workspace to run it.",
  );
});
