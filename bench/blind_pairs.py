"""Score `oom-lsp check` on the blind pairs: bugs written by someone who never saw the analyzer.

A benchmark, not a test: it prints figures and asserts nothing.

bench/corpora/blind/ holds 40 cases (`c<NN>_<name>/before.py` with one real bug at the line its
manifest line gives, `after.py` with only that bug fixed) and 12 negatives (`neg_<N>/before.py`:
code that looks alike but keeps nothing). They were written on 2026-12-06 by a helper that was
given only the three rules' catalogue lines, and never read the analyzer, its tests or any corpus.
The split was fixed before any case was read: odd-numbered cases and negatives are the
development half (read, tuned on), even-numbered ones the held-out half (never read: keep it so).

A case is caught when a default finding of its code lies within 2 lines of the recorded line in
before.py, and its fix is silent when after.py has no finding of that code; a negative is wrong
when before.py has any default finding of a code the set's cases name.

bench/corpora/blind2/ (`--set blind2`) was written the same way on 2026-12-06 (session 12) for
other causes: recurrent state carried across batches (OOM305), detached outputs kept on the GPU
over a loader (OOM306), metrics never reset (OOM308), a tensor grown by `torch.cat` in a loop
(OOM401), hand-written attention in its many spellings (OOM402) and `torch.load` onto the GPU
(OOM501); its writer was given a description of each cause and never the analyzer. The same
odd/even split, fixed before any case was read. Usage:

    .venv/bin/python bench/blind_pairs.py [--set blind|blind2] [--oom-lsp PATH] [--strict] [--list]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CORPORA = Path(__file__).resolve().parent / "corpora"


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
    parser.add_argument("--set", default="blind", choices=("blind", "blind2"), help="which blind set (default: blind)")
    args = parser.parse_args()
    root = CORPORA / args.set
    cases = [json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines() if line.strip()]
    codes = {case["code"] for case in cases} - {"NONE"}
    exe = [args.oom_lsp]
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "empty.toml"
        config.write_text("")  # the default rules: no project configuration
        tally: dict[str, dict[str, int]] = {h: {"cases": 0, "caught": 0, "silent": 0, "negatives": 0, "wrong": 0}
                                            for h in ("dev", "heldout")}
        by_code: dict[str, dict[str, list[int]]] = {}
        for case in cases:
            folder_of = root / case["id"]
            half = half_of(case["id"])
            found = findings(exe, folder_of / "before.py", config, args.strict)
            if case["code"] == "NONE":
                wrong = [f"{f['code']}:{f['line']}" for f in found if f["code"] in codes]
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
            per_code = by_code.setdefault(half, {}).setdefault(case["code"], [0, 0])
            per_code[0] += caught
            per_code[1] += 1
            tally[half]["silent"] += silent
            if args.list and half == "dev":
                got = [f"{f['code']}:{f['line']}" for f in found]
                print(f"{'caught' if caught else 'MISSED':7} {case['id']} {case['code']}:{case['line']} got {got}")
    level = "strict" if args.strict else "default"
    for half, t in tally.items():
        print(f"{args.set} {half:8} ({level}): caught {t['caught']}/{t['cases']}, fixed versions silent {t['silent']}/{t['cases']}, "
              f"negatives wrong {t['wrong']}/{t['negatives']}")
        print("    by code: " + ", ".join(f"{code} {n}/{m}" for code, (n, m) in sorted(by_code.get(half, {}).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
