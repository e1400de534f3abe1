/**
 * The few parts of the `vscode` API that src/common/ touches, for unit tests
 * under node's test runner (the test bundle aliases `vscode` to this file).
 * Tests set the user's configuration and installed extensions, as VS Code would
 * report them.
 */

type Values = Record<string, unknown>;

let configuration: Values = {};
const installedExtensions = new Map<string, { isActive: boolean; exports: unknown; activate(): Promise<unknown> }>();

/** The user's settings as flat keys, e.g. `{"oomLsp.maxBatchSize": 64}`. */
export function __setConfiguration(values: Values): void {
  configuration = { ...values };
}

export function __installExtension(id: string, exports: unknown): void {
  installedExtensions.set(id, { isActive: false, exports, activate: async () => exports });
}

export function __resetExtensions(): void {
  installedExtensions.clear();
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly fsPath: string,
  ) {}

  static file(fsPath: string): Uri {
    return new Uri("file", fsPath);
  }

  toString(): string {
    return `${this.scheme}://${this.fsPath}`;
  }
}

export const workspace = {
  getConfiguration(section?: string) {
    const prefix = section ? `${section}.` : "";
    return {
      get<T>(key: string, defaultValue?: T): T | undefined {
        const full = prefix + key;
        return full in configuration ? (configuration[full] as T) : defaultValue;
      },
    };
  },
};

export const extensions = {
  getExtension(id: string) {
    return installedExtensions.get(id);
  },
};
