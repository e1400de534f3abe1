"""The what-if's record: each change's prediction, kept for the next estimate of the script.

The record (`.oom_lsp_cache/what-if/<script>.json` in the project) keeps the what-if's table,
keyed by the script's text after each change: when a later estimate runs on exactly that text
(the user applied the fix, nothing else), it is compared with the prediction, and a difference
above AGREEMENT is reported as a bug in the prediction (the what-if and the estimate trace the
same way: they should agree). Written by the what-if of either face, read by the estimate of
either face."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from oom_lsp import safe_files
from oom_lsp.estimate.results import WhatIfCheck, WhatIfTable

RECORD_FOLDER = Path(".oom_lsp_cache") / "what-if"
# Above this difference between a change's prediction and the estimate after the change, the
# prediction is wrong.
AGREEMENT = 0.05


def source_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _record_path(root: Path, script: str) -> Path:
    name = hashlib.sha256(os.path.realpath(script).encode("utf-8")).hexdigest()[:16]
    return root / RECORD_FOLDER / f"{name}.json"


def save_record(root: Path, table: WhatIfTable) -> None:
    """Kept for the next estimate's comparison; a read-only project only loses that."""
    path = _record_path(root, table.script)
    try:  # nothing through a link out of the project (oom_lsp.safe_files)
        safe_files.make_folder(path.parent, root)
        safe_files.create_new(
            root / RECORD_FOLDER.parent / ".gitignore", "# Created by oom-lsp automatically.\n*\n", root=root
        )
        safe_files.write_file(path, json.dumps(table.to_json()), root=root)
    except OSError:
        return


def load_record(root: Path, script: str) -> WhatIfTable | None:
    try:
        record = json.loads(_record_path(root, script).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("changes"), list):
        return None
    try:
        return WhatIfTable.from_json(record)
    except (KeyError, TypeError, ValueError):
        return None  # a record of another release: as if there were none


def compare_with_record(
    record: WhatIfTable,
    digest: str,
    batch_size: int | None,
    autocast_dtype: str | None,
    world_size: int | None,
    needed: int,
) -> WhatIfCheck | None:
    """The change the script now is (its text after the fix, or the --dtype of a knob, on the
    what-if's own text), and how the estimate compares with its prediction; None when the
    script is none of the record's changes."""
    if world_size != record.world_size_option:
        return None
    for row in record.changes:
        if not row.measured or row.needed_bytes is None:
            continue
        if row.source_digest is not None:
            matches = (
                row.source_digest == digest
                and batch_size == record.batch_option
                and autocast_dtype == record.autocast_option
            )
        elif row.autocast_dtype and not row.batch_size:
            matches = (
                record.source_digest == digest
                and autocast_dtype == row.autocast_dtype
                and batch_size == record.batch_option
            )
        else:
            continue
        if not matches:
            continue
        predicted = row.needed_bytes
        difference = (needed - predicted) / predicted if predicted else 0.0
        return WhatIfCheck(
            change=row.title,
            predicted_bytes=predicted,
            estimated_bytes=needed,
            difference_percent=round(100 * difference, 1),
            agrees=abs(difference) <= AGREEMENT,
        )
    return None
