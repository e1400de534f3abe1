/**
 * The Python extension's interpreter for a workspace, when that extension is
 * installed. It is optional: no extensionDependencies (code-server and other
 * offline editors could not install it, and ours would then never activate).
 */
import * as vscode from "vscode";

const PYTHON_EXTENSION_ID = "ms-python.python";

interface EnvironmentPath {
  id: string;
  path: string;
}

/** The part of the Python extension's API used here (its `environments` API). */
interface PythonExtensionApi {
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): EnvironmentPath;
    resolveEnvironment(environment: EnvironmentPath): Promise<{ executable: { uri?: vscode.Uri } } | undefined>;
    onDidChangeActiveEnvironmentPath: vscode.Event<unknown>;
  };
  settings?: {
    getExecutionDetails(resource?: vscode.Uri): { execCommand: string[] | undefined };
    onDidChangeExecutionDetails?: vscode.Event<unknown>;
  };
}

async function pythonExtensionApi(): Promise<PythonExtensionApi | null> {
  const extension = vscode.extensions.getExtension<PythonExtensionApi>(PYTHON_EXTENSION_ID);
  if (extension === undefined) {
    return null;
  }
  return extension.isActive ? extension.exports : await extension.activate();
}

/** The interpreter command for the resource, or null when the Python extension
 * is absent or has none selected. */
export async function selectedInterpreter(resource?: vscode.Uri): Promise<string[] | null> {
  const api = await pythonExtensionApi();
  if (api === null) {
    return null;
  }
  if (api.environments) {
    const environment = await api.environments.resolveEnvironment(api.environments.getActiveEnvironmentPath(resource));
    const executable = environment?.executable.uri?.fsPath;
    if (executable) {
      return [executable];
    }
  }
  const command = api.settings?.getExecutionDetails(resource).execCommand;
  return command && command.length > 0 ? command : null;
}

/** Calls `listener` when the user picks another interpreter in the Python extension. */
export async function onDidChangeInterpreter(listener: () => void): Promise<vscode.Disposable | null> {
  const api = await pythonExtensionApi();
  const event = api?.environments?.onDidChangeActiveEnvironmentPath ?? api?.settings?.onDidChangeExecutionDetails;
  return event ? event(listener) : null;
}
