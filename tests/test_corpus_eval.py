"""bench/corpus_eval.py (issue 27's judged corpora) on a small corpus built here, driving the real
console script, and the committed manifests and dev verdicts it reads."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "bench" / "corpora"
_spec = importlib.util.spec_from_file_location("corpus_eval", ROOT / "bench" / "corpus_eval.py")
assert _spec is not None and _spec.loader is not None
corpus_eval = importlib.util.module_from_spec(_spec)
sys.modules["corpus_eval"] = corpus_eval
_spec.loader.exec_module(corpus_eval)

OOM_LSP = str(Path(sys.executable).parent / "oom-lsp")

TRAIN = """\
import torch

def train(model, loader, optimizer):
    optimizer.zero_grad(set_to_none=False)
    total_loss = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        total_loss += loss
        loss.backward()
        optimizer.step()
    return total_loss.item()
"""
FIXED = TRAIN.replace("total_loss += loss\n", "total_loss += loss.item()\n").replace("total_loss.item()", "total_loss")


def _notebook(cells: list[str]) -> str:
    return json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}},
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": src.splitlines(keepends=True)} for src in cells],
    })


def _build(tmp_path: Path, train_text: str = TRAIN) -> tuple[Path, Path]:
    """A corpus root and a manifests folder: one static repository, one notebook, one bug."""
    root, manifests = tmp_path / "corpus", tmp_path / "manifests"
    repo = root / "static" / "acme+trainer"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(train_text)
    lines = train_text.count("\n")
    nb_dir = root / "notebooks" / "acme+course"
    nb_dir.mkdir(parents=True)
    nb_cells = ["import torch\n", "optimizer.zero_grad(set_to_none=False)\n"]
    (nb_dir / "lesson.ipynb").write_text(_notebook(nb_cells))
    (root / "bugs").mkdir()
    (root / "bugs" / "before.py").write_text(TRAIN)
    (root / "bugs" / "after.py").write_text(FIXED)
    manifests.mkdir()
    (manifests / "static.toml").write_text(
        f'[[repo]]\nname = "acme/trainer"\ncommit = "{"0" * 40}"\nsplit = "dev"\nlines = {lines}\nfiles = 1\nonly = []\n')
    (manifests / "notebooks.toml").write_text(
        f'[[repo]]\nname = "acme/course"\ncommit = "{"0" * 40}"\nsplit = "dev"\n'
        'notebooks = [{ path = "lesson.ipynb", code_lines = 2 }]\n')
    (manifests / "bugs.json").write_text(json.dumps([{
        "id": "acme-1", "repo": "acme/trainer", "issue_url": "https://example.invalid/1", "fix_commit": "0" * 40,
        "path": "train.py", "before": "bugs/before.py", "after": "bugs/after.py",
        "expected_codes": ["OOM301"], "lines": [8], "split": "dev", "why": "loss kept with its graph"}]))
    return root, manifests


def _run(capsys: pytest.CaptureFixture[str], root: Path, manifests: Path, *extra: str) -> dict:
    assert corpus_eval.main(["--oom-lsp", OOM_LSP, "--corpus-root", str(root), "--corpora-dir", str(manifests),
                             "--split", "dev", "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _verdict(row: dict, verdict: str) -> dict:
    return {**row, "verdict": verdict, "reason": "judged in the test"}


def test_findings_are_keyed_judged_and_scored_and_the_verdicts_survive_a_line_shift(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, manifests = _build(tmp_path)
    template = tmp_path / "template.json"
    first = _run(capsys, root, manifests, "--template", str(template), "--verdicts", str(tmp_path / "none.json"))
    codes = sorted((f["corpus"], f["code"]) for f in first["findings"])
    assert ("static", "OOM301") in codes and ("static", "OOM503") in codes and ("notebooks", "OOM503") in codes
    assert first["corpora"]["static"]["total"]["unjudged"] == len([c for c in codes if c[0] == "static"])
    rows = json.loads(template.read_text())["verdicts"]
    row301 = next(r for r in rows if r["code"] == "OOM301")
    assert row301["source"] == "total_loss += loss"
    assert row301["line_sha1"] == hashlib.sha1(b"total_loss += loss").hexdigest()
    verdicts = tmp_path / "verdicts.json"
    verdicts.write_text(json.dumps({"verdicts": [_verdict(r, "worth" if r["code"] == "OOM301" else "wrong")
                                                 for r in rows], "missed": []}))

    # The file moves by three lines: the verdicts still apply, keyed by the source line.
    shifted = "# a\n# b\n# c\n" + TRAIN
    (root / "static" / "acme+trainer" / "train.py").write_text(shifted)
    manifest = (manifests / "static.toml").read_text().replace(f"lines = {TRAIN.count(chr(10))}",
                                                               f"lines = {shifted.count(chr(10))}")
    (manifests / "static.toml").write_text(manifest)
    result = _run(capsys, root, manifests, "--verdicts", str(verdicts))
    static = result["corpora"]["static"]
    assert static["total"]["unjudged"] == 0
    assert static["per_code"]["OOM301"]["worth"] == 1
    judged = static["total"]["worth"] + static["total"]["harmless"] + static["total"]["wrong"]
    assert static["total"]["precision"] == round(static["total"]["worth"] / judged, 3)
    assert static["total"]["wrong_per_10k_lines"] == round(10000 * static["total"]["wrong"] / static["lines"], 3)
    assert result["corpora"]["notebooks"]["lines"] == 2
    assert result["lines_per_cpu_s"] > 0
    assert result["bugs"]["caught"] == 1 and result["bugs"]["fixed_silent"] == 1
    assert result["warnings"] == []


def test_a_repository_config_cannot_change_the_measurement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, manifests = _build(tmp_path)
    plain = _run(capsys, root, manifests)
    (root / "static" / "acme+trainer" / "pyproject.toml").write_text('[tool.oom-lsp]\nignore = ["OOM301", "OOM503"]\n')
    (root / "pyproject.toml").write_text('[tool.oom-lsp]\nselect = ["OOM000"]\n')
    configured = _run(capsys, root, manifests)
    assert [(f["path"], f["code"], f["line"]) for f in configured["findings"]] == \
        [(f["path"], f["code"], f["line"]) for f in plain["findings"]]


def test_text_output_lists_unjudged_findings_and_ends_with_the_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, manifests = _build(tmp_path)
    (root / "static" / "acme+trainer" / "extra.py").write_text("x = 1\n")
    assert corpus_eval.main(["--oom-lsp", OOM_LSP, "--corpus-root", str(root), "--corpora-dir", str(manifests),
                             "--verdicts", str(tmp_path / "none.json")]) == 0
    captured = capsys.readouterr()
    out = captured.out.rstrip().splitlines()
    assert out[-1].startswith("split=dev | static: worth=0") and "bugs=1/1 fixed_silent=1/1" in out[-1]
    assert any(line.startswith("  acme/trainer/train.py:8 OOM301 ") for line in out)
    assert any(line.startswith("  acme/course/lesson.ipynb[cell 2]:1 OOM503 ") for line in out)
    assert "the manifest says 1 files" in captured.err  # the tree on disk is not what the manifest says


def test_the_committed_manifests_keep_the_split_rule_and_the_sizes_issue_27_asks_for() -> None:
    static = tomllib.loads((CORPORA / "static.toml").read_text())["repo"]
    notebooks = tomllib.loads((CORPORA / "notebooks.toml").read_text())["repo"]
    header = (CORPORA / "static.toml").read_text().split("\n[[repo]]")[0]
    moved = header.split("Moved by the tiebreak this time: ")[1].split(".\n")[0].split(", ")
    splits: dict[str, str] = {}
    for entry in [*static, *notebooks]:
        if entry["split"] in corpus_eval.FRESH_SPLITS:
            continue  # the fresh splits have their own tests below
        parity = "dev" if int(hashlib.sha256(entry["name"].encode()).hexdigest(), 16) % 2 == 0 else "heldout"
        assert entry["split"] == parity or entry["name"] in moved, entry["name"]
        assert splits.setdefault(entry["name"], entry["split"]) == entry["split"], entry["name"]
        assert len(entry["commit"]) == 40
    excluded = {"karpathy/nanoGPT", "pytorch/examples", "huggingface/diffusers", "huggingface/peft",
                "ultralytics/yolov5", "facebookresearch/detectron2", "facebookresearch/dino", "facebookresearch/mae",
                "lucidrains/vit-pytorch", "yunjey/pytorch-tutorial", "huggingface/transformers",
                "huggingface/pytorch-image-models", "Lightning-AI/pytorch-lightning", "huggingface/accelerate"}
    assert not excluded & set(splits)
    assert len(static) >= 20 and sum(e["lines"] for e in static) >= 300_000
    for half in ("dev", "heldout"):
        assert sum(e["lines"] for e in static if e["split"] == half) >= 150_000
    assert sum(len(e["notebooks"]) for e in notebooks) >= 100


def test_the_committed_dev_verdicts_judge_only_dev_repositories_with_a_reason() -> None:
    dev = {e["name"] for name in ("static.toml", "notebooks.toml")
           for e in tomllib.loads((CORPORA / name).read_text())["repo"] if e["split"] == "dev"}
    data = json.loads((CORPORA / "verdicts-dev.json").read_text())
    assert data["verdicts"]
    for row in data["verdicts"]:
        assert row["repo"] in dev, row["repo"]
        assert row["verdict"] in ("worth", "harmless", "wrong") and row["reason"].strip()
    for missed in data["missed"]:
        assert missed["repo"] in dev and missed["rule"].startswith("OOM") and missed["reason"].strip()


def assert_verdicts_judge_only(path: Path, repos: set[str]) -> None:
    """A split's verdict file judges only that split's repositories, each verdict with its reason."""
    data = json.loads(path.read_text())
    assert data["verdicts"]
    for row in data["verdicts"]:
        assert row["repo"] in repos, row["repo"]
        assert row["verdict"] in ("worth", "harmless", "wrong") and row["reason"].strip()
    for missed in data["missed"]:
        assert missed["repo"] in repos and missed["rule"].startswith("OOM") and missed["reason"].strip()


def test_the_fresh_split_shares_no_repository_with_the_tuned_corpora_and_its_verdicts_are_its_own() -> None:
    entries = [e for name in ("static.toml", "notebooks.toml") for e in tomllib.loads((CORPORA / name).read_text())["repo"]]
    fresh = {e["name"] for e in entries if e["split"] == "fresh"}
    tuned = {e["name"] for e in entries if e["split"] != "fresh"}
    runnable = {e["repo"] for e in tomllib.loads((CORPORA / "runnable.toml").read_text())["case"]}
    bugs = {b["repo"] for b in json.loads((CORPORA / "bugs.json").read_text())}
    assert fresh and not fresh & (tuned | runnable | bugs)
    for e in entries:
        if e["split"] == "fresh":
            assert len(e["commit"]) == 40 and e["reason"].strip(), e["name"]
    assert_verdicts_judge_only(CORPORA / "verdicts-fresh.json", fresh)


def test_the_fresh_split_is_read_from_its_own_folder_and_verdict_file(tmp_path: Path) -> None:
    entry = {"name": "acme/trainer", "split": "fresh"}
    assert corpus_eval.corpus_folder(tmp_path, "static", entry) == tmp_path / "fresh" / "static" / "acme+trainer"
    assert corpus_eval.corpus_folder(tmp_path, "static", {**entry, "split": "dev"}) == tmp_path / "static" / "acme+trainer"
    assert corpus_eval.default_verdict_files("fresh", tmp_path) == [CORPORA / "verdicts-fresh.json"]
    assert not corpus_eval.in_split("fresh", "all") and corpus_eval.in_split("fresh", "fresh")


def test_the_second_fresh_split_is_new_code_of_the_size_issue_27_asks_for_with_its_own_verdicts() -> None:
    static = tomllib.loads((CORPORA / "static.toml").read_text())["repo"]
    notebooks = tomllib.loads((CORPORA / "notebooks.toml").read_text())["repo"]
    fresh2 = {e["name"] for e in [*static, *notebooks] if e["split"] == "fresh2"}
    earlier = {e["name"] for e in [*static, *notebooks] if e["split"] != "fresh2"}
    runnable = {e["repo"] for e in tomllib.loads((CORPORA / "runnable.toml").read_text())["case"]}
    bugs = {b["repo"] for b in json.loads((CORPORA / "bugs.json").read_text())}
    realcode = {"karpathy/nanoGPT", "pytorch/examples", "huggingface/diffusers", "huggingface/peft",
                "ultralytics/yolov5", "facebookresearch/detectron2", "facebookresearch/dino", "facebookresearch/mae",
                "lucidrains/vit-pytorch", "yunjey/pytorch-tutorial", "huggingface/transformers",
                "huggingface/pytorch-image-models", "Lightning-AI/pytorch-lightning", "huggingface/accelerate"}
    assert fresh2 and not fresh2 & (earlier | runnable | bugs | realcode)
    assert sum(e["lines"] for e in static if e["split"] == "fresh2") >= 150_000
    assert sum(len(e["notebooks"]) for e in notebooks if e["split"] == "fresh2") >= 40
    for e in [*static, *notebooks]:
        if e["split"] == "fresh2":
            assert len(e["commit"]) == 40 and e["reason"].strip(), e["name"]
    assert_verdicts_judge_only(CORPORA / "verdicts-fresh2.json", fresh2)


def test_the_second_fresh_split_is_read_from_its_own_folder_and_verdict_file(tmp_path: Path) -> None:
    entry = {"name": "acme/trainer", "split": "fresh2"}
    assert corpus_eval.corpus_folder(tmp_path, "notebooks", entry) == tmp_path / "fresh2" / "notebooks" / "acme+trainer"
    assert corpus_eval.default_verdict_files("fresh2", tmp_path) == [CORPORA / "verdicts-fresh2.json"]
    assert not corpus_eval.in_split("fresh2", "all") and not corpus_eval.in_split("fresh2", "fresh")
    assert corpus_eval.in_split("fresh2", "fresh2")


def test_a_bug_named_before_its_rule_existed_expects_the_rule_now_named_so() -> None:
    codes_by_name = corpus_eval.rule_codes_by_name(OOM_LSP)
    assert codes_by_name["backward-create-graph"] == "OOM307"
    bug = {"expected_codes": ["OOM302", "NEW:backward-create-graph", "NEW:no-such-rule-yet"]}
    assert corpus_eval.expected_codes(bug, codes_by_name) == {"OOM302", "OOM307", "NEW:no-such-rule-yet"}
    # the rule built for a cause under another name
    assert corpus_eval.expected_codes({"expected_codes": ["NEW:detached-gpu-accumulation"]}, codes_by_name) == {"OOM306"}
    assert corpus_eval.expected_codes({"expected_codes": ["NEW:checkpoint-loaded-onto-gpu"]}, codes_by_name) == {"OOM501"}


def test_a_risk_the_judges_noted_as_missed_is_found_by_a_finding_of_its_code_a_few_lines_on() -> None:
    def finding(line: int, code: str = "OOM402", path: str = "m.py") -> corpus_eval.Finding:
        return corpus_eval.Finding(corpus="static", repo="o/r", path=path, line=line, column=1, cell=None, code=code,
                                   message="", source="")

    risk = {"repo": "o/r", "path": "m.py", "line": 100, "rule": "OOM402"}
    assert corpus_eval.noted_risk_found(risk, [finding(100 + corpus_eval.NOTED_RISK_TOLERANCE)])
    assert not corpus_eval.noted_risk_found(risk, [finding(100 + corpus_eval.NOTED_RISK_TOLERANCE + 1)])
    assert not corpus_eval.noted_risk_found(risk, [finding(100, code="OOM303"), finding(100, path="n.py")])
    assert not corpus_eval.noted_risk_found({**risk, "line": None}, [finding(100)])


def test_the_third_bug_set_keeps_its_split_rule_and_shares_no_fix_with_the_first() -> None:
    first = {(b["repo"], b["fix_commit"]) for b in json.loads((CORPORA / "bugs.json").read_text())}
    third = json.loads((CORPORA / "bugs3.json").read_text())
    assert len(third) >= 20 and len({b["id"] for b in third}) == len(third)
    for bug in third:
        digest = hashlib.sha256(bug["repo"].encode()).hexdigest()
        assert bug["split_digest"] == digest
        assert bug["split"] == ("dev" if int(digest[0], 16) % 2 == 0 else "heldout"), bug["id"]
        assert (bug["repo"], bug["fix_commit"]) not in first
        assert bug["before"] == f"bugs3/{bug['id']}/before.py" and len(bug["fix_commit"]) == 40


def test_the_third_bug_set_is_scored_under_its_own_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, manifests = _build(tmp_path)
    (manifests / "bugs3.json").write_text((manifests / "bugs.json").read_text())
    result = _run(capsys, root, manifests, "--corpora", "bugs3")
    assert "bugs" not in result
    assert result["bugs3"]["caught"] == 1 and result["bugs3"]["fixed_silent"] == 1
