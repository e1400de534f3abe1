"""The AI run's model (vscode-client/e2e/run.sh): tests/llm's loopback OpenAI-compatible server,
scripted with the answer that fixes OOM301 in tests/llm's training script, serving until killed.

    python vscode-client/e2e/fake_model.py URL_FILE
writes its base URL (http://127.0.0.1:PORT/v1) to URL_FILE once it listens."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.llm.conftest import GOOD_ANSWER  # noqa: E402
from tests.llm.fake_server import FakeModelServer  # noqa: E402

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
with FakeModelServer() as server:
    server.script(*({"content": GOOD_ANSWER} for _ in range(3)))
    Path(sys.argv[1]).write_text(server.base_url, encoding="utf-8")
    stop.wait()
