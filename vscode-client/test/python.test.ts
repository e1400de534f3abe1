import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { selectedInterpreter } from "../src/common/python";
import { Uri, __installExtension, __resetExtensions } from "./stub/vscode";

beforeEach(() => __resetExtensions());

test("no Python extension: no interpreter, and no error", async () => {
  assert.equal(await selectedInterpreter(), null);
});

test("the environments API gives the workspace's interpreter", async () => {
  const asked: unknown[] = [];
  __installExtension("ms-python.python", {
    environments: {
      getActiveEnvironmentPath: (resource: unknown) => {
        asked.push(resource);
        return { id: "venv", path: "/project/.venv" };
      },
      resolveEnvironment: async (environment: { path: string }) => ({
        executable: { uri: Uri.file(`${environment.path}/bin/python`) },
      }),
      onDidChangeActiveEnvironmentPath: () => ({ dispose() {} }),
    },
  });
  const resource = Uri.file("/project/train.py");
  assert.deepEqual(await selectedInterpreter(resource as never), ["/project/.venv/bin/python"]);
  assert.deepEqual(asked, [resource]);
});

test("an older Python extension: its execution details", async () => {
  __installExtension("ms-python.python", {
    settings: { getExecutionDetails: () => ({ execCommand: ["conda", "run", "-n", "ml", "python"] }) },
  });
  assert.deepEqual(await selectedInterpreter(), ["conda", "run", "-n", "ml", "python"]);
});

test("an environment that cannot be resolved: none", async () => {
  __installExtension("ms-python.python", {
    environments: {
      getActiveEnvironmentPath: () => ({ id: "gone", path: "/gone" }),
      resolveEnvironment: async () => undefined,
      onDidChangeActiveEnvironmentPath: () => ({ dispose() {} }),
    },
  });
  assert.equal(await selectedInterpreter(), null);
});
