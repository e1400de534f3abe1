"""Score `oom-lsp check` on the blind pairs: OOM301/302/303 bugs written by someone who never saw the analyzer.

A benchmark, not a test: it prints figures and asserts nothing.

bench/corpora/blind/ holds 40 cases (`c<NN>_<name>/before.py` with one real bug at the line its
manifest line gives, `after.py` with only that bug fixed) and 12 negatives (`neg_<N>/before.py`:
code that looks alike but keeps nothing). They were written on 2026-12-06 by a helper that was
given only the three rules' catalogue lines, and never read the analyzer, its tests or any corpus.
The split was fixed before any case was read: odd-numbered cases and negatives are the
development half (read, tuned on), even-numbered ones the held-out half (never read: keep it so).

A case is caught when a default finding of its code lies within 2 lines of the recorded line in
before.py, and its fix is silent when after.py has no finding of that code; a negative is wrong
when before.py has any default OOM30x finding. Usage:

    .venv/bin/python bench/blind_pairs.py [--oom-lsp PATH] [--strict] [--list]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "corpora" / "blind"


def findings(exe: list[str], path: Path, config: Path, strict: bool) -> list[dict]:
    command = [*exe, "check", "--no-cache", "--format", "json", "--config", str(config)]
    command += ["--strict"] if strict else []
    out = subprocess.run([*command, path.name], cwd=path.parent, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):
        sys.exit(f"oom-lsp failed on {path}: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout or "[]")


def half_of(case_id: str) -> str:
    number = int(re.search(r"\d+", case_id).group())  # type: ignore[union-attr]
    return "dev" if number % 2 == 1 else "heldout"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oom-lsp", default=str(Path(sys.executable).parent / "oom-lsp"))
    parser.add_argument("--strict", action="store_true", help="score the strict level, not the default")
    parser.add_argument("--list", action="store_true", help="list the development half's cases (never the held-out's)")
    args = parser.parse_args()
    exe = [args.oom_lsp]
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "empty.toml"
        config.write_text("")  # the default rules: no project configuration
        tally: dict[str, dict[str, int]] = {h: {"cases": 0, "caught": 0, "silent": 0, "negatives": 0, "wrong": 0}
                                            for h in ("dev", "heldout")}
        for line in (ROOT / "manifest.jsonl").read_text().splitlines():
            case = json.loads(line)
            folder_of = ROOT / case["id"]
            half = half_of(case["id"])
            found = findings(exe, folder_of / "before.py", config, args.strict)
            if case["code"] == "NONE":
                wrong = [f"{f['code']}:{f['line']}" for f in found if f["code"].startswith("OOM3")]
                tally[half]["negatives"] += 1
                tally[half]["wrong"] += bool(wrong)
                if args.list and half == "dev":
                    print(f"{'WRONG' if wrong else 'ok':7} {case['id']} {wrong}")
                continue
            caught = any(f["code"] == case["code"] and abs(f["line"] - case["line"]) <= 2 for f in found)
            after = findings(exe, folder_of / "after.py", config, args.strict)
            silent = not any(f["code"] == case["code"] for f in after)
            tally[half]["cases"] += 1
            tally[half]["caught"] += caught
            tally[half]["silent"] += silent
            if args.list and half == "dev":
                got = [f"{f['code']}:{f['line']}" for f in found]
                print(f"{'caught' if caught else 'MISSED':7} {case['id']} {case['code']}:{case['line']} got {got}")
    level = "strict" if args.strict else "default"
    for half, t in tally.items():
        print(f"{half:8} ({level}): caught {t['caught']}/{t['cases']}, fixed versions silent {t['silent']}/{t['cases']}, "
              f"negatives wrong {t['wrong']}/{t['negatives']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
