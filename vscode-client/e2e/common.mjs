// What the UI scripts (ui.mjs: a trusted workspace; restricted.mjs: Restricted Mode) do the
// same way: Debian's Chromium through playwright-core, the command palette, Quick Open, the
// Problems panel, Go to Line.
//
// Environment: OOM_E2E_PLAYWRIGHT (playwright-core's folder), OOM_E2E_CHROMIUM (default
// /usr/bin/chromium).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import * as path from "node:path";

const require = createRequire(import.meta.url);

export function launchBrowser() {
  const { chromium } = require(process.env.OOM_E2E_PLAYWRIGHT);
  return chromium.launch({
    executablePath: process.env.OOM_E2E_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

export async function runCommand(page, title) {
  await page.keyboard.press("F1");
  await page.keyboard.type(title);
  await page.locator(".quick-input-widget .monaco-list-row", { hasText: title.replace(/^.*?: /, "") }).first().waitFor({ timeout: 10_000 });
  await page.keyboard.press("Enter");
}

export async function openFile(page, relative, marker) {
  await page.keyboard.press("Control+P");
  await page.keyboard.type(relative);
  // Enter opens the selected row: wait until the list has caught up with what was typed.
  await page
    .locator(".quick-input-widget .monaco-list-row.focused", { hasText: path.basename(relative) })
    .first()
    .waitFor({ timeout: 15_000 });
  await page.keyboard.press("Enter");
  await page.locator(".tabs-container .tab.active", { hasText: path.basename(relative) }).waitFor({ timeout: 15_000 });
  if (marker) {
    await page.locator(".editor-group-container .view-line", { hasText: marker }).first().waitFor({ timeout: 15_000 });
  }
}

// The Problems panel, shown (Ctrl+Shift+M hides it when it is already there).
export async function showProblems(page) {
  const panel = page.locator(".part.panel .markers-panel").first();
  if (!(await panel.isVisible())) {
    await page.keyboard.press("Control+Shift+M");
  }
  await panel.waitFor({ state: "visible", timeout: 10_000 });
}

export function lineOf(file, text) {
  const index = readFileSync(file, "utf8").split("\n").findIndex((line) => line.trim() === text);
  if (index < 0) throw new Error(`no line ${text} in ${file}`);
  return index + 1;
}

export function editor(page) {
  // Scoped to the editor area: the panel and the chat input are Monaco editors too.
  return page.locator(".editor-group-container .monaco-editor .view-lines").first();
}

export async function goToLine(page, position) {
  await editor(page).click();
  await page.keyboard.press("Control+G");
  await page.keyboard.type(position);
  await page.keyboard.press("Enter");
}

// The light-bulb menu (Ctrl+.) on the cursor's line, once it lists a row with `rowText`. On a
// busy machine the menu sometimes never opens (the key press lands while the editor re-renders,
// or the request is superseded by the light bulb's own): it is asked for again, up to three times.
export async function openQuickFixes(page, rowText) {
  await page.waitForTimeout(1_000); // the light bulb's request for the new cursor position
  const row = page.locator(".action-widget .monaco-list-row", { hasText: rowText }).first();
  for (let attempt = 1; ; attempt += 1) {
    await page.keyboard.press("Control+.");
    try {
      await row.waitFor({ timeout: 7_000 });
      return row;
    } catch (error) {
      if (attempt === 3) {
        throw error;
      }
      await page.keyboard.press("Escape");
    }
  }
}
