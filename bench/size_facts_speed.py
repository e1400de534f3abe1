"""What the size facts cost on real files, next to the parse they run after.

For each file: libcst's parse; the size facts' statement index (built on a file's first query);
then, as rules would ask, `model_size` of the value of every assignment, `tensor_size` of every call,
and `int_value` of every argument of every call (far more queries than the rules make: an upper bound).
Each figure is the median of --repeat runs, on a fresh FileContext each time.

    .venv/bin/python bench/size_facts_speed.py /root/.cache/oom-realcode/transformers-wheel/transformers/trainer.py
    .venv/bin/python bench/size_facts_speed.py FILE... --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import libcst as cst

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oom_lsp.analysis.context import FileContext  # noqa: E402
from oom_lsp.analysis.facts.sizes import SizeFacts  # noqa: E402
from oom_lsp.analysis.settings import default_settings  # noqa: E402


def _queries(facts: SizeFacts) -> tuple[list[tuple[cst.BaseExpression, object]], list, list]:
    """(expression, scope) pairs: assignment values, calls, call arguments."""
    values, calls, arguments = [], [], []
    index = facts.index
    for statement, scope in index.scope_of.items():
        if type(statement) is not cst.SimpleStatementLine:
            continue
        for small in statement.body:
            if type(small) in (cst.Assign, cst.AnnAssign) and small.value is not None:
                values.append((small.value, scope))
            stack: list[cst.CSTNode] = [small]
            while stack:
                node = stack.pop()
                if type(node) is cst.Call:
                    calls.append((node, scope))
                    arguments.extend((arg.value, scope) for arg in node.args)
                stack.extend(node.children)
    return values, calls, arguments


def measure(path: Path, repeat: int) -> dict[str, float]:
    source = path.read_text(encoding="utf-8")
    parse, index, queries = [], [], []
    counts = (0, 0, 0)
    for _ in range(repeat):
        started = time.perf_counter()
        module = cst.parse_module(source)
        parse.append(time.perf_counter() - started)
        context = FileContext(source=source, module=module, settings=default_settings(), path=str(path))
        facts = SizeFacts(context)
        started = time.perf_counter()
        facts.index  # noqa: B018 - built here to be timed apart
        index.append(time.perf_counter() - started)
        values, calls, arguments = _queries(facts)
        counts = (len(values), len(calls), len(arguments))
        started = time.perf_counter()
        for expr, scope in values:
            facts.model_size(expr, scope)
        for expr, scope in calls:
            facts.tensor_size(expr, scope)
        for expr, scope in arguments:
            facts.int_value(expr, scope)
        queries.append(time.perf_counter() - started)
    lines = source.count("\n") + 1
    return {
        "lines": lines,
        "parse_ms": statistics.median(parse) * 1e3,
        "index_ms": statistics.median(index) * 1e3,
        "queries": sum(counts),
        "query_ms": statistics.median(queries) * 1e3,
        "counts": counts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'file':60} {'lines':>6} {'parse ms':>9} {'index ms':>9} {'queries':>8} {'query ms':>9} {'µs/query':>9} {'index+queries / parse':>22}")
    for path in args.files:
        row = measure(path, args.repeat)
        per_query = row["query_ms"] * 1e3 / max(row["queries"], 1)
        ratio = (row["index_ms"] + row["query_ms"]) / row["parse_ms"]
        print(
            f"{str(path)[-60:]:60} {row['lines']:>6} {row['parse_ms']:>9.1f} {row['index_ms']:>9.1f} {row['queries']:>8}"
            f" {row['query_ms']:>9.1f} {per_query:>9.1f} {ratio:>21.1%}"
        )
        print(f"{'':60} (model_size {row['counts'][0]}, tensor_size {row['counts'][1]}, int_value {row['counts'][2]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
