// The AI fix in VS Code (issue 30): the model is tests/llm's loopback OpenAI-compatible server
// (fake_model.py), enabled in the workspace's settings. As a user does it: the light-bulb menu
// on OOM301's line, "Ask AI to fix (OOM301) via 127.0.0.1:PORT", Enter. The change must be in the
// editor at once, on the first "Apply" (an annotated edit that needed confirmation opened the
// refactor preview with the change unticked, so Apply applied nothing), then saved, and the fix
// log written (the action's command runs after the edit). Screenshots go to
// $OOM_E2E_SCREENSHOTS (names starting with "ai-"); any failed check exits 1.
//
// Environment: OOM_E2E_URL (code-server with ?folder=...), OOM_E2E_WORKSPACE,
// OOM_E2E_SCREENSHOTS, OOM_E2E_PLAYWRIGHT, OOM_E2E_CHROMIUM (default /usr/bin/chromium).
import { existsSync, readFileSync } from "node:fs";
import * as path from "node:path";

import { goToLine, launchBrowser, lineOf, openFile, openQuickFixes } from "./common.mjs";

const url = process.env.OOM_E2E_URL;
const workspace = process.env.OOM_E2E_WORKSPACE;
const screenshots = process.env.OOM_E2E_SCREENSHOTS;
const trainPy = path.join(workspace, "train_ai.py");
const SLOW = 120_000;
const ACCUMULATED = "total_loss += loss";
const FIXED = "total_loss += loss.item()";

async function shot(page, name) {
  const file = path.join(screenshots, `ai-${name}.png`);
  await page.screenshot({ path: file });
  console.log(`screenshot: ${file}`);
}

const browser = await launchBrowser();
let failed = false;
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
try {
  await page.goto(url);
  await page.locator(".monaco-workbench").waitFor({ timeout: 60_000 });
  await openFile(page, "train_ai.py", ACCUMULATED);
  // OOM301's squiggle on the accumulation: the server is up and has checked the file.
  await page.locator(".editor-group-container :is(.squiggly-info, .squiggly-warning, .squiggly-error)").first().waitFor({ timeout: SLOW });
  const line = lineOf(trainPy, ACCUMULATED);
  await goToLine(page, `${line}:9`);
  const ask = await openQuickFixes(page, "Ask AI to fix (OOM301)");
  console.log(`ai action: ${(await ask.innerText()).replace(/\s+/g, " ").trim()}`);
  await shot(page, "light-bulb-menu");
  await ask.click();
  // Applied on this one choice: the fixed line is in the editor, no preview in between.
  await page.locator(".editor-group-container .view-line", { hasText: FIXED }).first().waitFor({ timeout: SLOW });
  if (await page.locator(".refactor-preview, .bulk-edit-panel").count()) {
    throw new Error("the refactor preview opened: the change was not applied on the first Apply");
  }
  await shot(page, "applied");
  await page.keyboard.press("Control+S");
  const deadline = Date.now() + 15_000;
  while (!readFileSync(trainPy, "utf8").includes(`        ${FIXED}\n`)) {
    if (Date.now() > deadline) throw new Error("the AI fix was not saved to disk");
    await page.waitForTimeout(250);
  }
  const log = path.join(workspace, "OOM_FIXES.md");
  const logDeadline = Date.now() + 15_000;
  while (!existsSync(log) || !readFileSync(log, "utf8").includes("OOM301")) {
    if (Date.now() > logDeadline) throw new Error("the applied AI fix was not logged in OOM_FIXES.md");
    await page.waitForTimeout(250);
  }
  console.log(`ai fix: applied on the first choice, saved: ${FIXED}; logged in OOM_FIXES.md`);
} catch (error) {
  failed = true;
  console.error(`FAIL: ${error.stack ?? error}`);
  await shot(page, "failure").catch(() => {});
} finally {
  await browser.close();
}
if (!failed) console.log("PASS");
process.exit(failed ? 1 : 0);
