/** The probes of server resolution, with real processes and files. */
import { execFile } from "node:child_process";
import { constants, promises as fs } from "node:fs";
import * as path from "node:path";
import type { Probes } from "./server";

const IMPORT_TIMEOUT_MS = 20_000;

async function isExecutableFile(file: string): Promise<boolean> {
  try {
    const stat = await fs.stat(file);
    await fs.access(file, process.platform === "win32" ? constants.F_OK : constants.X_OK);
    return stat.isFile();
  } catch {
    return false;
  }
}

async function which(program: string): Promise<string | null> {
  const extensions = process.platform === "win32" ? (process.env.PATHEXT ?? ".EXE;.CMD;.BAT").split(";") : [""];
  for (const folder of (process.env.PATH ?? "").split(path.delimiter)) {
    if (folder === "") {
      continue;
    }
    for (const extension of extensions) {
      const candidate = path.join(folder, program + extension);
      if (await isExecutableFile(candidate)) {
        return candidate;
      }
    }
  }
  return null;
}

export const nodeProbes: Probes = {
  async isRunnable(program: string): Promise<boolean> {
    return program.includes("/") || program.includes("\\") ? isExecutableFile(program) : (await which(program)) !== null;
  },
  importsOomLsp(interpreter: string[]): Promise<boolean> {
    const [command, ...prefix] = interpreter;
    return new Promise((resolve) => {
      execFile(command, [...prefix, "-c", "import oom_lsp"], { timeout: IMPORT_TIMEOUT_MS }, (error) => resolve(error === null));
    });
  },
  which,
};
