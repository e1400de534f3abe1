/**
 * Which language server to start. In order:
 *   1. `oomLsp.path`: a full command line, used as given;
 *   2. `python -m oom_lsp` under `oomLsp.interpreter`;
 *   3. `python -m oom_lsp` under the Python extension's interpreter for the
 *      workspace, when that extension is installed and the package imports there;
 *   4. `oom-lsp` on PATH.
 * When none works the user gets one message that says how to fix it. The probes
 * (does this file exist, does `oom_lsp` import under that Python, where is a
 * program on PATH) are passed in, so this logic runs without VS Code or processes.
 */

export type ServerSource = "oomLsp.path" | "oomLsp.interpreter" | "Python extension" | "PATH";

export interface ServerCommand {
  command: string;
  args: string[];
  source: ServerSource;
  /** The Python that runs the user's code for profiles and estimates, when known. */
  python: string | null;
}

export interface ServerProblem {
  /** One sentence that says what is wrong and how to fix it. */
  message: string;
}

export type Resolution = { ok: true; server: ServerCommand } | { ok: false; problem: ServerProblem };

export interface ResolutionInputs {
  path: string[];
  interpreter: string[];
  /** The Python extension's interpreter for the workspace, if it is installed and has one. */
  pythonExtensionInterpreter: string[] | null;
}

export interface Probes {
  /** Whether the program exists and may be run (absolute path, or found on PATH). */
  isRunnable(program: string): Promise<boolean>;
  /** Whether `python -c "import oom_lsp"` succeeds under that interpreter command. */
  importsOomLsp(interpreter: string[]): Promise<boolean>;
  /** The absolute path of a program on PATH, or null. */
  which(program: string): Promise<string | null>;
}

const MODULE_ARGS = ["-m", "oom_lsp"];

function pythonCommand(interpreter: string[], source: ServerSource): ServerCommand {
  const [command, ...prefix] = interpreter;
  return { command, args: [...prefix, ...MODULE_ARGS], source, python: command };
}

function shellWords(words: string[]): string {
  return words.map((word) => (/^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`)).join(" ");
}

export async function resolveServerCommand(inputs: ResolutionInputs, probes: Probes): Promise<Resolution> {
  const interpreter = inputs.interpreter.length > 0 ? inputs.interpreter : null;
  // The Python that profiles run under is the project's, whichever server runs.
  const projectPython = (interpreter ?? inputs.pythonExtensionInterpreter ?? [])[0] ?? null;

  if (inputs.path.length > 0) {
    const [command, ...args] = inputs.path;
    if (!(await probes.isRunnable(command))) {
      return {
        ok: false,
        problem: { message: `oomLsp.path names "${command}", which cannot be run. Fix the path or remove the setting.` },
      };
    }
    return { ok: true, server: { command, args, source: "oomLsp.path", python: projectPython } };
  }

  if (interpreter !== null) {
    if (!(await probes.isRunnable(interpreter[0]))) {
      return {
        ok: false,
        problem: {
          message: `oomLsp.interpreter names "${interpreter[0]}", which cannot be run. Fix the path or remove the setting.`,
        },
      };
    }
    if (!(await probes.importsOomLsp(interpreter))) {
      return {
        ok: false,
        problem: {
          message: `oom-lsp is not installed in the Python of oomLsp.interpreter. Install it with: ${shellWords([...interpreter, "-m", "pip", "install", "oom-lsp"])}`,
        },
      };
    }
    return { ok: true, server: pythonCommand(interpreter, "oomLsp.interpreter") };
  }

  const selected = inputs.pythonExtensionInterpreter;
  if (selected !== null && selected.length > 0 && (await probes.importsOomLsp(selected))) {
    return { ok: true, server: pythonCommand(selected, "Python extension") };
  }

  const onPath = await probes.which("oom-lsp");
  if (onPath !== null) {
    return { ok: true, server: { command: onPath, args: [], source: "PATH", python: projectPython } };
  }

  const install =
    selected !== null && selected.length > 0
      ? `Install it into the selected interpreter (${shellWords([...selected, "-m", "pip", "install", "oom-lsp"])})`
      : "Install it (pip install oom-lsp, or pipx install oom-lsp)";
  return {
    ok: false,
    problem: {
      message: `oom-lsp could not find its language server. ${install}, or set oomLsp.interpreter to a Python that has it, or oomLsp.path to the oom-lsp program.`,
    },
  };
}

/** `${workspaceFolder}`, `${userHome}` and a leading `~` in a path setting, as
 * other Python tool extensions allow them. */
export function expandPathSetting(words: string[], variables: { workspaceFolder: string | null; home: string }): string[] {
  return words.map((word) => {
    let expanded = word.replace(/^~(?=$|[\\/])/, variables.home).replace(/\$\{userHome\}/g, variables.home);
    if (variables.workspaceFolder !== null) {
      expanded = expanded.replace(/\$\{workspaceFolder\}/g, variables.workspaceFolder);
    }
    return expanded;
  });
}

/** Whether `file` lies in one of `folders` (or is one): in Restricted Mode an interpreter inside
 * the workspace (its `.venv`) is a program the workspace brought, and is not started. */
export function insideFolders(file: string, folders: readonly string[]): boolean {
  const normal = (name: string) => name.replace(/\\/g, "/").replace(/\/+$/, "");
  const target = normal(file);
  return folders.map(normal).some((folder) => target === folder || target.startsWith(`${folder}/`));
}

/** The Python extension's interpreter, unless the workspace is untrusted and brought it. */
export function usableExtensionInterpreter(
  interpreter: string[] | null,
  trusted: boolean,
  workspaceFolders: readonly string[],
): string[] | null {
  if (trusted || interpreter === null || interpreter.length === 0) {
    return interpreter;
  }
  return insideFolders(interpreter[0], workspaceFolders) ? null : interpreter;
}
