"""Start-up: the server answers `initialize` before loading the analysis stack (libcst, the
rules), which its analysis worker loads meanwhile (bench/lsp_latency.py reports the time to first
diagnostics). Each probe runs in a fresh interpreter: what is imported is the point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RISKY = sorted((Path(__file__).resolve().parents[2] / "fixtures").glob("*_risky.py"))[0]


def _probe(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_creating_the_server_leaves_libcst_and_the_rules_to_the_analysis_worker() -> None:
    loaded = _probe(
        "import sys\n"
        "from oom_lsp.server.features import create_server\n"
        "create_server()\n"
        "print(sorted(m for m in sys.modules if m == 'libcst' or m.startswith('oom_lsp.analysis.rules')))\n"
    )
    assert loaded == "[]"


def test_the_server_starts_without_the_features_heavy_modules() -> None:
    """What runs a user's script (the estimate, the what-if, the profile, their use cases), the
    AI fixes, the runtime, torch and the checker's process pool are imported when a command needs
    them, not before the first diagnostics (bench/startup.py measures the start)."""
    loaded = _probe(
        "import sys\n"
        "from oom_lsp.server.features import create_server\n"
        "create_server()\n"
        "heavy = ('oom_lsp.estimate', 'oom_lsp.usecases', 'oom_lsp.llm', 'oom_lsp.runtime', 'torch',\n"
        "         'concurrent.futures.process', 'multiprocessing')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    assert loaded == "[]"


def test_the_first_analysis_never_imports_torch() -> None:
    analysed = _probe(
        "import sys\n"
        "from oom_lsp.server.features import create_server\n"
        "from oom_lsp.server.server import warm_up_analysis\n"
        "from oom_lsp.checker import analyze_text\n"
        "from oom_lsp.analysis import default_settings\n"
        "create_server()\n"
        "warm_up_analysis()\n"
        f"source = open({str(RISKY)!r}, encoding='utf-8').read()\n"
        f"print(len(analyze_text(source, default_settings(), {str(RISKY)!r})) > 0, 'torch' in sys.modules)\n"
    )
    assert analysed == "True False"


def test_the_warm_up_loads_the_analysis_and_turns_the_collector_back_on() -> None:
    state = _probe(
        "import gc, sys\n"
        "gc.disable()\n"
        "from oom_lsp.server.server import warm_up_analysis\n"
        "warm_up_analysis()\n"
        "from oom_lsp.analysis.registry import all_rules\n"
        "print(gc.isenabled(), 'libcst' in sys.modules, 'oom_lsp.analysis.rules' in sys.modules, "
        "gc.get_threshold()[0])\n"
    )
    assert state == "True True True 100000"
