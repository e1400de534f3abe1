// VS Code's Restricted Mode (issue 28): the folder opened untrusted, in a code-server started
// with workspace trust on (no --disable-workspace-trust) and no trust prompt
// (security.workspace.trust.startupPrompt "never", so the folder stays untrusted, as when a
// user picks "Don't Trust"). The checks, as a user sees them:
// - the status bar says Restricted Mode;
// - oom-lsp's diagnostics still show in the Problems panel (lint runs no workspace code);
// - no "Estimate peak memory" / "What if…" / "Profile memory" lens above the training loop,
//   where a trusted workspace has them (every lens runs the script);
// - the palette lists oom-lsp's other commands but none that runs the script (Estimate peak
//   memory, What if…, Profile memory, Validate last fix), and nothing ran (no .oom_lsp/
//   results in the workspace);
// - once the user trusts the folder (the Workspace Trust editor's "Trust" button), the lenses
//   and those commands appear, without a restart: their absence above was the trust, not a
//   slow server.
// Screenshots go to $OOM_E2E_SCREENSHOTS (names starting with "restricted-"); any failed
// check exits 1.
//
// Environment: OOM_E2E_URL (code-server with ?folder=...), OOM_E2E_WORKSPACE,
// OOM_E2E_SCREENSHOTS, OOM_E2E_PLAYWRIGHT, OOM_E2E_CHROMIUM (default /usr/bin/chromium).
import { existsSync } from "node:fs";
import * as path from "node:path";

import { goToLine, launchBrowser, lineOf, openFile, runCommand, showProblems } from "./common.mjs";

const url = process.env.OOM_E2E_URL;
const workspace = process.env.OOM_E2E_WORKSPACE;
const screenshots = process.env.OOM_E2E_SCREENSHOTS;
const riskyLoopPy = path.join(workspace, "risky_loop.py");
const SLOW = 90_000; // the first diagnostics wait for the server to start on a busy machine
const LENS_TITLES = /Estimate peak memory|What if…|Profile memory/;
// The palette's commands that run the workspace's code.
const RUNS_THE_SCRIPT = /Estimate peak memory|What if|Profile memory|Validate last fix/;

async function shot(page, name) {
  const file = path.join(screenshots, `restricted-${name}.png`);
  await page.screenshot({ path: file });
  console.log(`screenshot: ${file}`);
}

// The titles of the oom-lsp commands the palette lists for the active editor.
async function paletteCommands(page) {
  await page.keyboard.press("F1");
  await page.keyboard.type("oom-lsp: ");
  const rows = page.locator(".quick-input-widget .monaco-list-row");
  await rows.filter({ hasText: "Restart server" }).first().waitFor({ timeout: 10_000 });
  const titles = (await rows.allInnerTexts()).map((row) => row.split("\n")[0].trim());
  await page.keyboard.press("Escape");
  return titles;
}

function lenses(page) {
  return page.locator(".editor-group-container .codelens-decoration a", { hasText: LENS_TITLES });
}

const loopLine = lineOf(riskyLoopPy, "for x, y in loader:");

const browser = await launchBrowser();
let failed = false;
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
try {
  await page.goto(url);
  await page.locator(".monaco-workbench").waitFor({ timeout: 60_000 });
  const restricted = page.locator(".statusbar-item", { hasText: "Restricted Mode" }).first();
  await restricted.waitFor({ timeout: 30_000 });
  await shot(page, "workbench");

  // Diagnostics still come: the lint reads the text, it runs nothing.
  await openFile(page, "risky_loop.py", "class Classifier");
  await showProblems(page);
  // The panel draws the rows in view only (each with its "help: ..." line): filtered to the code.
  await page.locator(".part.panel .viewpane-filter input").first().fill("OOM304");
  const retained = page.locator(".markers-panel .monaco-tl-contents", { hasText: "OOM304" }).first();
  await retained.waitFor({ timeout: SLOW });
  console.log(`restricted problems: ${(await retained.innerText()).replace(/\s+/g, " ")}`);

  // No lens that runs the script. The loop's line in view (the editor draws only those), and
  // time for VS Code's codeLens request after the diagnostics.
  await goToLine(page, `${loopLine}:1`);
  await page.waitForTimeout(5_000);
  const offered = await lenses(page).allInnerTexts();
  if (offered.length > 0) {
    throw new Error(`Restricted Mode offers lenses that run the script: ${offered.join(", ")}`);
  }
  await shot(page, "no-lenses");

  // Nor do the palette's oom-lsp commands list the ones that run it (the others are there).
  const listed = await paletteCommands(page);
  const running = listed.filter((title) => RUNS_THE_SCRIPT.test(title));
  if (running.length > 0 || !listed.some((title) => title.includes("Explain OOM from a log file"))) {
    throw new Error(`Restricted Mode's palette: ${listed.join(", ")}`);
  }
  console.log(`restricted palette: ${listed.join(", ")}`);
  if (existsSync(path.join(workspace, ".oom_lsp"))) {
    throw new Error("something ran in Restricted Mode: the workspace has a .oom_lsp folder");
  }

  // Trusted now: the lenses come, without a restart.
  await runCommand(page, "Workspaces: Manage Workspace Trust");
  const trustButton = page.locator(".workspace-trust-editor .monaco-button", { hasText: /^Trust$/ }).first();
  await trustButton.waitFor({ timeout: 15_000 });
  await shot(page, "trust-editor");
  await trustButton.click();
  await restricted.waitFor({ state: "detached", timeout: 15_000 });
  // The trust editor opens as a modal over the editors: closed, back to the script.
  await runCommand(page, "View: Close Editor");
  await page.locator(".monaco-modal-editor-block").waitFor({ state: "detached", timeout: 10_000 });
  await openFile(page, "risky_loop.py");
  await goToLine(page, `${loopLine}:1`);
  const estimateLens = lenses(page).filter({ hasText: "Estimate peak memory" }).first();
  await estimateLens.waitFor({ timeout: 60_000 });
  console.log(`trusted lenses: ${(await lenses(page).allInnerTexts()).filter(Boolean).join(", ")}`);
  await shot(page, "trusted-lenses");
  const trustedPalette = await paletteCommands(page);
  if (!trustedPalette.some((title) => title.includes("Estimate peak memory"))) {
    throw new Error(`the trusted palette lacks "Estimate peak memory": ${trustedPalette.join(", ")}`);
  }
  console.log(`trusted palette: ${trustedPalette.join(", ")}`);
  console.log("PASS");
} catch (error) {
  failed = true;
  console.error(`FAIL: ${error.stack ?? error}`);
  await shot(page, "failure").catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
