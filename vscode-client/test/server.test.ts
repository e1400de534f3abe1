import assert from "node:assert/strict";
import { test } from "node:test";
import {
  Probes,
  ResolutionInputs,
  expandPathSetting,
  insideFolders,
  resolveServerCommand,
  usableExtensionInterpreter,
} from "../src/common/server";

/** A machine: which programs exist, which interpreters have oom_lsp, what PATH has. */
function machine(options: { runnable?: string[]; withOomLsp?: string[]; onPath?: Record<string, string> }): Probes & {
  imported: string[][];
} {
  const imported: string[][] = [];
  return {
    imported,
    isRunnable: async (program) => (options.runnable ?? []).includes(program),
    importsOomLsp: async (interpreter) => {
      imported.push(interpreter);
      return (options.withOomLsp ?? []).includes(interpreter[0]);
    },
    which: async (program) => options.onPath?.[program] ?? null,
  };
}

const NOTHING: ResolutionInputs = { path: [], interpreter: [], pythonExtensionInterpreter: null };

test("oomLsp.path wins and is used as given", async () => {
  const probes = machine({ runnable: ["/opt/oom/bin/oom-lsp"], onPath: { "oom-lsp": "/usr/bin/oom-lsp" } });
  const resolution = await resolveServerCommand(
    { path: ["/opt/oom/bin/oom-lsp", "server"], interpreter: ["/venv/bin/python"], pythonExtensionInterpreter: ["/ext/python"] },
    probes,
  );
  assert.deepEqual(resolution, {
    ok: true,
    server: { command: "/opt/oom/bin/oom-lsp", args: ["server"], source: "oomLsp.path", python: "/venv/bin/python" },
  });
  assert.deepEqual(probes.imported, []);
});

test("an oomLsp.path that cannot run is one clear problem, not a fallback", async () => {
  const resolution = await resolveServerCommand(
    { ...NOTHING, path: ["/missing/oom-lsp"] },
    machine({ onPath: { "oom-lsp": "/usr/bin/oom-lsp" } }),
  );
  assert.equal(resolution.ok, false);
  assert.match(!resolution.ok ? resolution.problem.message : "", /oomLsp\.path names "\/missing\/oom-lsp"/);
});

test("oomLsp.interpreter runs python -m oom_lsp, its extra words kept", async () => {
  const resolution = await resolveServerCommand(
    { ...NOTHING, interpreter: ["/venv/bin/python", "-X", "utf8"], pythonExtensionInterpreter: ["/ext/python"] },
    machine({ runnable: ["/venv/bin/python"], withOomLsp: ["/venv/bin/python", "/ext/python"] }),
  );
  assert.deepEqual(resolution, {
    ok: true,
    server: {
      command: "/venv/bin/python",
      args: ["-X", "utf8", "-m", "oom_lsp"],
      source: "oomLsp.interpreter",
      python: "/venv/bin/python",
    },
  });
});

test("an oomLsp.interpreter without oom-lsp says how to install it there", async () => {
  const resolution = await resolveServerCommand(
    { ...NOTHING, interpreter: ["/my venv/bin/python"] },
    machine({ runnable: ["/my venv/bin/python"], onPath: { "oom-lsp": "/usr/bin/oom-lsp" } }),
  );
  assert.deepEqual(resolution, {
    ok: false,
    problem: {
      message:
        "oom-lsp is not installed in the Python of oomLsp.interpreter. Install it with: '/my venv/bin/python' -m pip install oom-lsp",
    },
  });
});

test("the Python extension's interpreter is used when oom_lsp imports there", async () => {
  const resolution = await resolveServerCommand(
    { ...NOTHING, pythonExtensionInterpreter: ["/project/.venv/bin/python"] },
    machine({ withOomLsp: ["/project/.venv/bin/python"], onPath: { "oom-lsp": "/usr/bin/oom-lsp" } }),
  );
  assert.deepEqual(resolution, {
    ok: true,
    server: {
      command: "/project/.venv/bin/python",
      args: ["-m", "oom_lsp"],
      source: "Python extension",
      python: "/project/.venv/bin/python",
    },
  });
});

test("oom-lsp on PATH serves when the selected interpreter lacks it; profiles still use the project's Python", async () => {
  const resolution = await resolveServerCommand(
    { ...NOTHING, pythonExtensionInterpreter: ["/project/.venv/bin/python"] },
    machine({ onPath: { "oom-lsp": "/home/me/.local/bin/oom-lsp" } }),
  );
  assert.deepEqual(resolution, {
    ok: true,
    server: { command: "/home/me/.local/bin/oom-lsp", args: [], source: "PATH", python: "/project/.venv/bin/python" },
  });
});

test("without the Python extension, oom-lsp on PATH", async () => {
  const resolution = await resolveServerCommand(NOTHING, machine({ onPath: { "oom-lsp": "/usr/bin/oom-lsp" } }));
  assert.deepEqual(resolution, {
    ok: true,
    server: { command: "/usr/bin/oom-lsp", args: [], source: "PATH", python: null },
  });
});

test("nothing found: one message with the fixes, naming the selected interpreter", async () => {
  const withExtension = await resolveServerCommand(
    { ...NOTHING, pythonExtensionInterpreter: ["/project/.venv/bin/python"] },
    machine({}),
  );
  assert.deepEqual(withExtension, {
    ok: false,
    problem: {
      message:
        "oom-lsp could not find its language server. Install it into the selected interpreter (/project/.venv/bin/python -m pip install oom-lsp), or set oomLsp.interpreter to a Python that has it, or oomLsp.path to the oom-lsp program.",
    },
  });
  const bare = await resolveServerCommand(NOTHING, machine({}));
  assert.match(!bare.ok ? bare.problem.message : "", /Install it \(pip install oom-lsp, or pipx install oom-lsp\)/);
});

test("path settings expand ${workspaceFolder}, ${userHome} and ~", () => {
  assert.deepEqual(
    expandPathSetting(["${workspaceFolder}/.venv/bin/python", "~/bin/x", "${userHome}/y", "a~b"], {
      workspaceFolder: "/w",
      home: "/home/me",
    }),
    ["/w/.venv/bin/python", "/home/me/bin/x", "/home/me/y", "a~b"],
  );
  assert.deepEqual(expandPathSetting(["${workspaceFolder}/p"], { workspaceFolder: null, home: "/h" }), ["${workspaceFolder}/p"]);
});

test("in Restricted Mode the workspace's own interpreter is not started; any other is", () => {
  const folders = ["/home/me/clone", "C:\\work\\other\\"];
  const venv = ["/home/me/clone/.venv/bin/python"];
  assert.equal(usableExtensionInterpreter(venv, false, folders), null);
  assert.equal(usableExtensionInterpreter(["C:\\work\\other\\.venv\\Scripts\\python.exe"], false, folders), null);
  assert.deepEqual(usableExtensionInterpreter(["/usr/bin/python3"], false, folders), ["/usr/bin/python3"]);
  assert.deepEqual(usableExtensionInterpreter(["/home/me/clone-2/bin/python"], false, folders), ["/home/me/clone-2/bin/python"]);
  assert.deepEqual(usableExtensionInterpreter(venv, true, folders), venv);
  assert.equal(usableExtensionInterpreter(null, false, folders), null);
  assert.equal(insideFolders("/home/me/clone", folders), true);
});
