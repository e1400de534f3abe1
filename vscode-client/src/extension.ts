/**
 * The oom-lsp extension: starts the language server, keeps its settings in
 * step, offers the server's on-request features as palette commands with
 * cancellable progress, and shows the last memory estimate in the status bar.
 */
import { randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as vscode from "vscode";
import {
  ConfigurationParams,
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  NotificationType,
  ProgressToken,
  RevealOutputChannelOn,
  ServerOptions,
  TransportKind,
  WorkDoneProgress,
  WorkDoneProgressCancelNotification,
  WorkDoneProgressCreateRequest,
} from "vscode-languageclient/node";
import {
  COMMAND_PURPOSE,
  EstimateResult,
  RUNS_WORKSPACE_CODE,
  MemoryStatus,
  OomError,
  ProfileResult,
  ProgressRelay,
  ProgressUpdate,
  SERVER_COMMANDS,
  ServerCommandId,
  ValidationResult,
  WhatIfResult,
  describeCommandError,
  describeEstimate,
  describeProfile,
  describeValidation,
  estimateArguments,
  estimatePage,
  explainMarkdown,
  isWhatIfTable,
  memoryStatusView,
  profileArguments,
  unavailableMessage,
  untrustedMessage,
} from "./common/commands";
import { nodeProbes } from "./common/probes";
import { onDidChangeInterpreter, selectedInterpreter } from "./common/python";
import { ServerCommand, expandPathSetting, resolveServerCommand, usableExtensionInterpreter } from "./common/server";
import {
  RESTART_SETTINGS,
  SECTION,
  buildInitializationOptions,
  buildServerSettings,
  configurationFor,
  readSettings,
} from "./common/settings";

const CLIENT_ID = "oomLsp"; // the languageclient reads `oomLsp.trace.server`
const CLIENT_NAME = "oom-lsp";
const MEMORY_STATUS = new NotificationType<MemoryStatus>("oomLsp/memoryStatus");
const DEFAULT_FIX_LOG = "OOM_FIXES.md";
const EXPLANATION_SCHEME = "oom-lsp-explanation";

export interface OomLspApi {
  /** The running client, for tests that drive the extension. */
  getClient(): LanguageClient | undefined;
  getServerCommand(): ServerCommand | undefined;
}

class OomLspExtension implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private server: ServerCommand | undefined;
  private readonly outputChannel = vscode.window.createOutputChannel(CLIENT_NAME, { log: true });
  private readonly statusBar = vscode.window.createStatusBarItem("oomLsp.memory", vscode.StatusBarAlignment.Right, 100);
  private readonly memoryStatuses = new Map<string, MemoryStatus>();
  // The estimate's memory timeline, reused by the next estimate.
  private timelinePanel: vscode.WebviewPanel | undefined;
  private readonly disposables: vscode.Disposable[] = [this.outputChannel, this.statusBar];
  // Starts and restarts run one after the other: settings can change mid-start.
  private lifecycle: Promise<void> = Promise.resolve();
  private clientSubscriptions: vscode.Disposable[] = [];
  // Commands waiting for the progress token the server creates for them.
  private readonly progressAdopters: ((token: ProgressToken) => void)[] = [];
  private readonly explanations = new Map<string, string>();
  private explanationCount = 0;
  // The server's working folder: empty, so that `python -m oom_lsp` imports nothing of the
  // workspace (`-m` puts the working folder first on sys.path).
  private neutralFolder: string | undefined;

  constructor() {
    this.statusBar.name = "oom-lsp memory";
    this.statusBar.command = "oomLsp.showReport";
  }

  async activate(): Promise<void> {
    const register = (id: string, handler: () => Promise<unknown>) =>
      this.disposables.push(vscode.commands.registerCommand(id, () => handler()));
    register("oomLsp.profileFile", () => this.profile());
    register("oomLsp.estimateFile", () => this.estimate());
    register("oomLsp.whatIfFile", () => this.whatIf());
    register("oomLsp.explainOomFromFile", () => this.explainFromFile());
    register("oomLsp.explainOomFromClipboard", () => this.explainFromClipboard());
    register("oomLsp.askAi", () => this.askAi());
    register("oomLsp.validateFix", () => this.validateFix());
    register("oomLsp.showReport", () => this.showReport());
    register("oomLsp.showFixLog", () => this.showFixLog());
    register("oomLsp.restartServer", () => this.restart());
    register("oomLsp.showServerLog", async () => this.outputChannel.show());

    this.disposables.push(
      vscode.workspace.registerTextDocumentContentProvider(EXPLANATION_SCHEME, {
        provideTextDocumentContent: (uri) => this.explanations.get(uri.toString()),
      }),
      vscode.workspace.onDidChangeConfiguration((event) => this.onDidChangeConfiguration(event)),
      // Restricted Mode lifted: the server offers the lenses and commands that run the workspace's code.
      vscode.workspace.onDidGrantWorkspaceTrust(() => this.onDidGrantWorkspaceTrust()),
      vscode.window.onDidChangeActiveTextEditor(() => this.updateStatusBar()),
    );
    const interpreterWatch = await onDidChangeInterpreter(() => {
      // The Python extension's choice matters only when no setting overrides it.
      const settings = readSettings(configurationFor(this.workspaceResource()));
      if (settings.path.length === 0 && settings.interpreter.length === 0) {
        void this.restart();
      }
    });
    if (interpreterWatch !== null) {
      this.disposables.push(interpreterWatch);
    }
    await this.restart();
  }

  api(): OomLspApi {
    return { getClient: () => this.client, getServerCommand: () => this.server };
  }

  // --- server lifecycle ----------------------------------------------------------

  restart(): Promise<void> {
    const next = async () => {
      await this.stop();
      await this.start();
    };
    // A failed start must not block the restarts after it.
    this.lifecycle = this.lifecycle.then(next, next);
    return this.lifecycle;
  }

  private async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.server = undefined;
    for (const subscription of this.clientSubscriptions.splice(0)) {
      subscription.dispose();
    }
    if (client !== undefined) {
      try {
        await client.stop();
      } catch (error) {
        this.outputChannel.warn(`Stopping the server: ${String(error)}`);
      }
    }
  }

  /** The workspace folder of the active file, else the first one. The active
   * editor may be no file at all (an output channel has focus). */
  private workspaceFolder(): vscode.WorkspaceFolder | undefined {
    const active = vscode.window.activeTextEditor?.document.uri;
    return (active && vscode.workspace.getWorkspaceFolder(active)) || vscode.workspace.workspaceFolders?.[0];
  }

  /** The scope for reading settings: the active file when it is in the workspace. */
  private workspaceResource(): vscode.Uri | undefined {
    const active = vscode.window.activeTextEditor?.document.uri;
    return active && vscode.workspace.getWorkspaceFolder(active) ? active : this.workspaceFolder()?.uri;
  }

  private async start(): Promise<void> {
    const resource = this.workspaceResource();
    const settings = readSettings(configurationFor(resource));
    const variables = {
      workspaceFolder: this.workspaceFolder()?.uri.fsPath ?? null,
      home: os.homedir(),
    };
    const trusted = vscode.workspace.isTrusted;
    const folders = (vscode.workspace.workspaceFolders ?? []).map((folder) => folder.uri.fsPath);
    const selected = await selectedInterpreter(resource);
    const pythonExtensionInterpreter = usableExtensionInterpreter(selected, trusted, folders);
    if (selected !== null && pythonExtensionInterpreter === null) {
      this.outputChannel.info(
        `Restricted Mode: not starting the workspace's own Python (${selected[0]}); trust the workspace to use it`,
      );
    }
    const resolution = await resolveServerCommand(
      {
        path: expandPathSetting(settings.path, variables),
        interpreter: expandPathSetting(settings.interpreter, variables),
        pythonExtensionInterpreter,
      },
      nodeProbes,
    );
    if (!resolution.ok) {
      this.outputChannel.error(resolution.problem.message);
      this.notifyError(resolution.problem.message);
      return;
    }
    const server = resolution.server;
    this.outputChannel.info(`Starting ${[server.command, ...server.args].join(" ")} (from ${server.source})`);
    const serverOptions: ServerOptions = {
      command: server.command,
      args: server.args,
      transport: TransportKind.stdio,
      options: { cwd: this.serverFolder(), env: { ...process.env, PYTHONUNBUFFERED: "1" } },
    };
    const client = new LanguageClient(CLIENT_ID, CLIENT_NAME, serverOptions, this.clientOptions());
    this.clientSubscriptions.push(client.onNotification(MEMORY_STATUS, (status) => this.onMemoryStatus(status)));
    try {
      await client.start();
      // Replaces the client's own handler (registered by start): progress the
      // server creates for one of our commands is shown in that command's
      // notification, not as a second indicator.
      this.clientSubscriptions.push(
        client.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
          const adopt = this.progressAdopters.shift();
          if (adopt !== undefined) {
            adopt(token);
          } else {
            showWindowProgress(client, token);
          }
        }),
      );
    } catch (error) {
      this.outputChannel.error(`The server did not start: ${String(error)}`);
      this.notifyError(
        `oom-lsp: the language server (${[server.command, ...server.args].join(" ")}, from ${server.source}) did not start. The server log says why.`,
      );
      return;
    }
    this.client = client;
    this.server = server;
  }

  private serverFolder(): string {
    if (this.neutralFolder === undefined || !fs.existsSync(this.neutralFolder)) {
      this.neutralFolder = fs.mkdtempSync(path.join(os.tmpdir(), "oom-lsp-server-"));
    }
    return this.neutralFolder;
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [
        { scheme: "file", language: "python" },
        { scheme: "untitled", language: "python" },
        { scheme: "vscode-notebook-cell", language: "python" },
      ],
      initializationOptions: buildInitializationOptions(configurationFor(), vscode.workspace.isTrusted),
      outputChannel: this.outputChannel,
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      middleware: {
        // The estimate lens runs the server's command through here: its memory timeline page
        // opens in a webview beside the file (the palette's command offers it with its message).
        executeCommand: async (command, args, next) => {
          const result = await next(command, args);
          const page = command === SERVER_COMMANDS.estimate ? estimatePage(result) : undefined;
          if (page !== undefined) {
            this.showTimeline(page);
          }
          return result;
        },
        window: {
          // The what-if's table (from the lens or the palette) opens as a Markdown preview beside
          // the file, which stays in its editor.
          showDocument: async (params, token, next) => {
            if (!isWhatIfTable(params.uri)) {
              return next(params, token);
            }
            await vscode.commands.executeCommand("markdown.showPreviewToSide", vscode.Uri.parse(params.uri));
            return { success: true };
          },
        },
        workspace: {
          // The server gets exactly the payload of buildServerSettings, never
          // the raw section: it rejects keys it does not know (path, trace, ...).
          configuration: async (params: ConfigurationParams, token, next) => {
            const answers = await next(params, token);
            if (!Array.isArray(answers)) {
              return answers;
            }
            return params.items.map((item, index) =>
              item.section === SECTION
                ? buildServerSettings(
                    readSettings(configurationFor(item.scopeUri ? vscode.Uri.parse(item.scopeUri) : undefined)),
                    vscode.workspace.isTrusted,
                  )
                : answers[index],
            );
          },
        },
      },
    };
  }

  private onDidChangeConfiguration(event: vscode.ConfigurationChangeEvent): void {
    if (RESTART_SETTINGS.some((key) => event.affectsConfiguration(key))) {
      void this.restart();
    } else if (event.affectsConfiguration(SECTION)) {
      this.sendSettings();
    }
  }

  private sendSettings(): void {
    if (this.client?.isRunning()) {
      void this.client.sendNotification(DidChangeConfigurationNotification.type, {
        settings: { [SECTION]: buildServerSettings(readSettings(configurationFor()), vscode.workspace.isTrusted) },
      });
    }
  }

  private onDidGrantWorkspaceTrust(): void {
    const settings = readSettings(configurationFor(this.workspaceResource()));
    if (settings.path.length === 0 && settings.interpreter.length === 0) {
      // The workspace's own Python (from the Python extension) may serve now: start again.
      void this.restart();
    } else {
      this.sendSettings();
    }
  }

  /** Not awaited: activation must not wait for the user to read it. */
  private notifyError(message: string): void {
    void vscode.window.showErrorMessage(message, "Open Settings", "Show Server Log").then((choice) => {
      if (choice === "Open Settings") {
        void vscode.commands.executeCommand("workbench.action.openSettings", "@ext:oom-lsp.oom-lsp");
      } else if (choice === "Show Server Log") {
        this.outputChannel.show();
      }
    });
  }

  // --- server commands -------------------------------------------------------------

  /** Runs a server command with cancellable progress in the notification area;
   * undefined when it failed, was cancelled or is not available (the user has
   * been told). */
  private async runServerCommand<T>(command: ServerCommandId, title: string, argument: object): Promise<T | undefined> {
    if (RUNS_WORKSPACE_CODE.has(command) && !vscode.workspace.isTrusted) {
      const choice = await vscode.window.showWarningMessage(untrustedMessage(command), "Manage Workspace Trust");
      if (choice === "Manage Workspace Trust") {
        await vscode.commands.executeCommand("workbench.trust.manage");
      }
      return undefined;
    }
    const client = this.client;
    if (client === undefined || !client.isRunning()) {
      const choice = await vscode.window.showErrorMessage(
        `oom-lsp: the language server is not running, so it cannot ${COMMAND_PURPOSE[command]}.`,
        "Restart Server",
        "Show Server Log",
      );
      if (choice === "Restart Server") {
        await this.restart();
      } else if (choice === "Show Server Log") {
        this.outputChannel.show();
      }
      return undefined;
    }
    const provided = client.initializeResult?.capabilities.executeCommandProvider?.commands ?? [];
    if (!provided.includes(command)) {
      void vscode.window.showWarningMessage(`oom-lsp: ${unavailableMessage(command)}`);
      return undefined;
    }
    let failure: ReturnType<typeof describeCommandError> | undefined;
    const result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `oom-lsp: ${title}`, cancellable: true },
      async (progress, token) => {
        // The server reports progress on the token we pass, or on one it creates
        // (adopted below); both are shown in this notification.
        const relay = new ProgressRelay(false);
        const listen = (progressToken: ProgressToken) =>
          client.onProgress(WorkDoneProgress.type, progressToken, (value) => {
            const update = relay.update(value);
            if (update !== null) {
              progress.report(update);
            }
          });
        const workDoneToken = randomUUID();
        const adoptedTokens: ProgressToken[] = [];
        const listeners = [listen(workDoneToken)];
        const adopt = (progressToken: ProgressToken) => {
          adoptedTokens.push(progressToken);
          listeners.push(listen(progressToken));
        };
        this.progressAdopters.push(adopt);
        // Cancelling the request stops the command; the progress is cancelled too
        // for a server that watches only that.
        const onCancel = token.onCancellationRequested(() => {
          for (const adopted of adoptedTokens) {
            void client.sendNotification(WorkDoneProgressCancelNotification.type, { token: adopted });
          }
        });
        try {
          return (await client.sendRequest(
            ExecuteCommandRequest.type,
            { command, arguments: [argument], workDoneToken },
            token,
          )) as T;
        } catch (error) {
          failure = token.isCancellationRequested ? { kind: "cancelled" } : describeCommandError(command, error as object);
          return undefined;
        } finally {
          const waiting = this.progressAdopters.indexOf(adopt);
          if (waiting >= 0) {
            this.progressAdopters.splice(waiting, 1);
          }
          onCancel.dispose();
          for (const listener of listeners) {
            listener.dispose();
          }
        }
      },
    );
    if (failure === undefined) {
      return result ?? undefined;
    }
    if (failure.kind === "cancelled") {
      this.outputChannel.info(`${command} cancelled`);
    } else if (failure.kind === "unavailable") {
      void vscode.window.showWarningMessage(`oom-lsp: ${failure.message}`);
    } else {
      this.outputChannel.error(failure.message);
      void vscode.window.showErrorMessage(failure.message, "Show Server Log").then((choice) => {
        if (choice) {
          this.outputChannel.show();
        }
      });
    }
    return undefined;
  }

  /** The active Python file, saved (the server's subprocesses read it from disk). */
  private async activePythonFile(purpose: string): Promise<vscode.TextDocument | undefined> {
    const document = vscode.window.activeTextEditor?.document;
    if (document === undefined || document.languageId !== "python") {
      void vscode.window.showInformationMessage(`oom-lsp: open a Python file to ${purpose}.`);
      return undefined;
    }
    if (document.uri.scheme !== "file") {
      void vscode.window.showInformationMessage(`oom-lsp: save the file first to ${purpose}.`);
      return undefined;
    }
    if (document.isDirty && !(await document.save())) {
      return undefined;
    }
    return document;
  }

  private async openReportOffer(message: string, reportPath: string | undefined): Promise<void> {
    if (!reportPath) {
      void vscode.window.showInformationMessage(message);
      return;
    }
    if ((await vscode.window.showInformationMessage(message, "Open Report")) === "Open Report") {
      await this.openFile(reportPath);
    }
  }

  /** The estimate's memory timeline page in a webview beside the file: the page is one
   *  self-contained HTML file (inline SVG; its one script is JSON data), shown with scripts off. */
  private showTimeline(page: string): void {
    let html: string;
    try {
      html = fs.readFileSync(page, "utf-8");
    } catch (error) {
      void vscode.window.showWarningMessage(`oom-lsp: cannot read the memory timeline ${page}: ${String(error)}`);
      return;
    }
    const title = `Memory timeline: ${path.basename(page, ".html")}`;
    if (this.timelinePanel === undefined) {
      this.timelinePanel = vscode.window.createWebviewPanel(
        "oomLsp.timeline",
        title,
        { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true },
        { enableScripts: false, localResourceRoots: [] },
      );
      this.timelinePanel.onDidDispose(() => (this.timelinePanel = undefined), null, this.disposables);
    } else {
      this.timelinePanel.reveal(vscode.ViewColumn.Beside, true);
    }
    this.timelinePanel.title = title;
    this.timelinePanel.webview.html = html;
  }

  private async openFile(file: string): Promise<void> {
    await vscode.window.showTextDocument(vscode.Uri.file(file), { preview: true });
  }

  private async profile(): Promise<void> {
    const settings = readSettings(configurationFor(this.workspaceResource()));
    let uri: vscode.Uri;
    if (settings.profile.entryPoint !== null) {
      const folder = this.workspaceFolder();
      const entryPoint = settings.profile.entryPoint;
      uri = vscode.Uri.file(path.isAbsolute(entryPoint) || !folder ? entryPoint : path.join(folder.uri.fsPath, entryPoint));
    } else {
      const document = await this.activePythonFile("profile its memory");
      if (document === undefined) {
        return;
      }
      uri = document.uri;
    }
    const argument = profileArguments(settings, uri.toString(), this.server?.python ?? null);
    const result = await this.runServerCommand<ProfileResult>(
      SERVER_COMMANDS.profile,
      `Profiling ${path.basename(uri.fsPath)}`,
      argument,
    );
    if (result) {
      await this.openReportOffer(`oom-lsp: ${describeProfile(result)}`, result.reportPath);
    }
  }

  private async estimate(): Promise<void> {
    const document = await this.activePythonFile("estimate its peak memory");
    if (document === undefined) {
      return;
    }
    // The notification below says the server's message, with "Open report": not twice.
    const argument = { ...estimateArguments(document.uri.toString(), this.server?.python ?? null), showResult: false };
    const result = await this.runServerCommand<EstimateResult>(
      SERVER_COMMANDS.estimate,
      `Estimating the peak memory of ${path.basename(document.uri.fsPath)}`,
      argument,
    );
    if (result) {
      const page = estimatePage(result);
      const message = `oom-lsp: ${describeEstimate(result)}`;
      if (page === undefined) {
        await this.openReportOffer(message, result.reportPath);
        return;
      }
      const choice = await vscode.window.showInformationMessage(message, "Open Timeline", "Open Report");
      if (choice === "Open Timeline") {
        this.showTimeline(page);
      } else if (choice === "Open Report") {
        await this.openFile(result.reportPath);
      }
    }
  }

  /** The server shows the table itself (window/showDocument, opened as a preview above). */
  private async whatIf(): Promise<void> {
    const document = await this.activePythonFile("measure what each fix saves");
    if (document === undefined) {
      return;
    }
    const argument = estimateArguments(document.uri.toString(), this.server?.python ?? null);
    const result = await this.runServerCommand<WhatIfResult>(
      SERVER_COMMANDS.whatIf,
      `What if: measuring each change to ${path.basename(document.uri.fsPath)}`,
      argument,
    );
    if (result && !result.shown) {
      await vscode.commands.executeCommand("markdown.showPreviewToSide", vscode.Uri.file(result.markdownPath));
    }
  }

  private async explain(argument: { text: string } | { path: string }): Promise<void> {
    const result = await this.runServerCommand<{ errors: OomError[] }>(
      SERVER_COMMANDS.explainOom,
      "Explaining the out-of-memory error",
      argument,
    );
    if (result) {
      // A read-only document: closing it asks nothing.
      this.explanationCount += 1;
      const uri = vscode.Uri.from({ scheme: EXPLANATION_SCHEME, path: `/OOM explanation ${this.explanationCount}.md` });
      this.explanations.set(uri.toString(), explainMarkdown(result.errors));
      const document = await vscode.workspace.openTextDocument(uri);
      await vscode.languages.setTextDocumentLanguage(document, "markdown");
      await vscode.window.showTextDocument(document, { preview: true, viewColumn: vscode.ViewColumn.Beside });
    }
  }

  private async explainFromFile(): Promise<void> {
    const picked = await vscode.window.showOpenDialog({
      canSelectMany: false,
      openLabel: "Explain OOM",
      title: "A log with a CUDA out-of-memory error",
      filters: { Logs: ["log", "txt", "out", "err"], "All files": ["*"] },
    });
    if (picked?.[0]) {
      await this.explain({ path: picked[0].fsPath });
    }
  }

  private async explainFromClipboard(): Promise<void> {
    const text = await vscode.env.clipboard.readText();
    if (text.trim() === "") {
      void vscode.window.showInformationMessage("oom-lsp: the clipboard is empty. Copy the traceback of the OOM error first.");
      return;
    }
    await this.explain({ text });
  }

  private async askAi(): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    const document = await this.activePythonFile("ask AI to fix it");
    if (document === undefined || editor === undefined) {
      return;
    }
    const result = await this.runServerCommand<{ applied: boolean; message: string }>(
      SERVER_COMMANDS.askAi,
      "Asking AI for a fix",
      // 1-based, like every line number oom-lsp reports.
      { uri: document.uri.toString(), line: editor.selection.active.line + 1 },
    );
    if (result) {
      // The server has shown the message already.
      this.outputChannel.info(`Ask AI: ${result.applied ? "applied" : "not applied"}: ${result.message}`);
    }
  }

  private async validateFix(): Promise<void> {
    const document = await this.activePythonFile("validate its last fix");
    if (document === undefined) {
      return;
    }
    const result = await this.runServerCommand<ValidationResult>(
      SERVER_COMMANDS.validateFix,
      "Validating the last fix",
      { uri: document.uri.toString() },
    );
    if (result) {
      // The server has shown the comparison already.
      this.outputChannel.info(describeValidation(result));
    }
  }

  private async showReport(): Promise<void> {
    const uri = vscode.window.activeTextEditor?.document.uri;
    if (uri === undefined) {
      void vscode.window.showInformationMessage("oom-lsp: open a Python file to see its memory report.");
      return;
    }
    const known = this.memoryStatuses.get(uri.toString())?.reportPath;
    if (known) {
      await this.openFile(known);
      return;
    }
    const result = await this.runServerCommand<{ reportPath: string | null }>(
      SERVER_COMMANDS.showReport,
      "Finding the memory report",
      { uri: uri.toString() },
    );
    if (result?.reportPath) {
      await this.openFile(result.reportPath);
    } else if (result) {
      void vscode.window.showInformationMessage("oom-lsp: no estimate or profile of this file yet.");
    }
  }

  private async showFixLog(): Promise<void> {
    const folder = this.workspaceFolder();
    const fixLog = readSettings(configurationFor(this.workspaceResource())).llm.fixLog ?? DEFAULT_FIX_LOG;
    const file = path.isAbsolute(fixLog) || folder === undefined ? fixLog : path.join(folder.uri.fsPath, fixLog);
    try {
      await vscode.workspace.fs.stat(vscode.Uri.file(file));
    } catch {
      void vscode.window.showInformationMessage(
        `oom-lsp: no fix log yet (${file}). Fixes applied with "Ask AI to fix" are recorded there.`,
      );
      return;
    }
    await this.openFile(file);
  }

  // --- status bar ---------------------------------------------------------------------

  private onMemoryStatus(status: MemoryStatus): void {
    if (typeof status.peakBytes === "number") {
      this.memoryStatuses.set(status.uri, status);
    } else {
      this.memoryStatuses.delete(status.uri);
    }
    this.updateStatusBar();
  }

  private updateStatusBar(): void {
    const uri = vscode.window.activeTextEditor?.document.uri.toString();
    const status = uri !== undefined ? this.memoryStatuses.get(uri) : undefined;
    const view = status !== undefined ? memoryStatusView(status) : null;
    if (view === null) {
      this.statusBar.hide();
      return;
    }
    this.statusBar.text = `$(pulse) ${view.text}`;
    this.statusBar.tooltip = view.tooltip;
    this.statusBar.backgroundColor = view.warning ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
    this.statusBar.show();
  }

  async dispose(): Promise<void> {
    await this.lifecycle;
    await this.stop();
    for (const disposable of this.disposables) {
      disposable.dispose();
    }
    if (this.neutralFolder !== undefined) {
      fs.rmSync(this.neutralFolder, { recursive: true, force: true });
    }
  }
}

/** Server progress outside our commands, in the status bar as the client
 * would show it. Listening starts at once: `begin` may come before VS Code
 * runs the progress callback. */
function showWindowProgress(client: LanguageClient, token: ProgressToken): void {
  const relay = new ProgressRelay(true);
  const pending: ProgressUpdate[] = [];
  let target: vscode.Progress<ProgressUpdate> | undefined;
  let finish: (() => void) | undefined;
  let ended = false;
  const listener = client.onProgress(WorkDoneProgress.type, token, (value) => {
    const update = relay.update(value);
    if (update === null) {
      ended = true;
      listener.dispose();
      finish?.();
    } else if (target !== undefined) {
      target.report(update);
    } else {
      pending.push(update);
    }
  });
  void vscode.window.withProgress({ location: vscode.ProgressLocation.Window, title: CLIENT_NAME }, (progress) => {
    target = progress;
    for (const update of pending.splice(0)) {
      progress.report(update);
    }
    return ended ? Promise.resolve() : new Promise<void>((resolve) => (finish = resolve));
  });
}

let extension: OomLspExtension | undefined;

export async function activate(): Promise<OomLspApi> {
  extension = new OomLspExtension();
  await extension.activate();
  return extension.api();
}

export async function deactivate(): Promise<void> {
  await extension?.dispose();
  extension = undefined;
}
