"""Inputs that kill parsers, through `oom-lsp --check` and the language server: crashes,
files that could not be analysed, time.

A benchmark, not a test: it prints figures and asserts nothing (tests/test_fuzz_inputs.py
checks a part of the corpus). The corpus (tests/fuzz_corpus.py, deterministic for --seed):
17 kinds of nesting (brackets, unary operators, attribute, subscript and call chains,
`**`, sums, lambdas, conditionals, f-strings, blocks, unclosed and unopened brackets) at
8 depths from 10 to 100,000 and after an ordinary syntax error; lines of 400 KB; each of
the 256 byte values, random bytes, odd encodings; notebooks of random JSON, of nbformat's
shape with random values, with cells nested 100,000 deep, and nested JSON. About 500 files,
30 MB. A pyproject.toml raises max-file-size to 16 MiB so that every file is analysed, not
skipped for its size.

1. `oom-lsp --check --no-cache` on the whole folder (the installed console script; a
   process pool, as for any large run): its exit status (a signal is a crash), the files
   it named as crashes of the analysis (`oom-lsp failed while checking this file`), the
   files it could not read (not notebooks, wrong nbformat), wall time and peak memory.
2. The server over stdio: each file opened as an editor would (a .py as a text document,
   an .ipynb an editor can open as a notebook with its code cells), its diagnostics and a
   hover asked for, then closed. Deaths (the server restarted to go on), requests left
   unanswered, the slowest file.

Goal: 0 crashes of either, 0 unanswered requests.

    .venv/bin/python bench/fuzz_inputs.py [--seed 28]
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz_corpus import open_each_in_server, write_corpus  # noqa: E402

OOM_LSP = str(Path(sys.executable).parent / "oom-lsp")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=28)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oom-lsp-fuzz-") as folder:
        root = Path(folder)
        files = write_corpus(root, args.seed)
        (root / "pyproject.toml").write_text('[tool.oom-lsp]\nmax-file-size = "16MiB"\n')
        size = sum(path.stat().st_size for path in files)
        kinds = {}
        for path in files:
            kind = path.name.split("_", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"corpus (seed {args.seed}): {len(files)} files, {size / 2**20:.1f} MiB: "
              + ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())))

        started = time.perf_counter()
        done = subprocess.run(
            [OOM_LSP, "--check", "--no-cache", "."], cwd=root, capture_output=True, text=True, check=False
        )
        elapsed = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        crashed = done.returncode < 0 or done.returncode > 128
        internal = re.findall(r"^error: (.*?): oom-lsp failed while checking this file", done.stderr, re.M)
        unreadable = len(re.findall(r"^error: ", done.stderr, re.M)) - len(internal)
        findings = re.search(r"Found (\d+) error", done.stdout)
        print("\noom-lsp --check")
        print(f"  exit status {done.returncode} ({'CRASHED' if crashed else 'no crash'}) in {elapsed:.1f} s, "
              f"peak memory of a process {peak:.0f} MiB")
        print(f"  findings: {findings.group(1) if findings else 0}; files the analysis failed on: {len(internal)}"
              + (f" ({', '.join(internal[:5])})" if internal else "")
              + f"; files that could not be read: {unreadable}")
        print(f"  OOM000 for nesting past what the analysis takes: "
              f"{len(re.findall(r'OOM000 SyntaxError: (too many nested|too deeply nested|nested too deeply)', done.stdout))}")

        started = time.perf_counter()
        served = open_each_in_server([path for path in files if path.suffix in (".py", ".ipynb")], root)
        elapsed = time.perf_counter() - started
        slowest_seconds, slowest_file = served["slowest"]
        print("\nlanguage server over stdio")
        print(f"  opened {served['opened']} files (skipped {served['skipped']} notebooks no editor opens) "
              f"in {elapsed:.1f} s; deaths: {len(served['deaths'])}"
              + (f" {served['deaths'][:5]}" if served["deaths"] else "")
              + f"; requests unanswered: {len(served['unanswered'])}"
              + (f" {served['unanswered'][:5]}" if served["unanswered"] else ""))
        print(f"  slowest file: {slowest_file} ({slowest_seconds:.1f} s from open to its answers); "
              f"shutdown answered: {served.get('shutdown')}, exit code {served.get('exit_code')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
