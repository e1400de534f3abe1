"""bench/oracle.py, the dynamic oracle: its split rule, its verdicts, its manifest, and one case of our
own run through the whole of it (the real run, the estimate, check, the what-if, the join)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("oracle", ROOT / "bench" / "oracle.py")
assert _spec is not None and _spec.loader is not None
oracle = importlib.util.module_from_spec(_spec)
sys.modules["oracle"] = oracle  # its dataclasses look their module up there
_spec.loader.exec_module(oracle)

# The repositories of ../shared/realcode/, which the runnable set must not draw from.
REALCODE = {
    "karpathy/nanogpt", "pytorch/examples", "huggingface/diffusers", "huggingface/peft", "ultralytics/yolov5",
    "facebookresearch/detectron2", "facebookresearch/dino", "facebookresearch/mae", "lucidrains/vit-pytorch",
    "yunjey/pytorch-tutorial",
}


def test_the_split_is_balanced_deterministic_and_moves_the_smallest_tiebreak_hash() -> None:
    names = [f"case{i}" for i in range(31)]
    split = oracle.split_of(names)
    assert split == oracle.split_of(list(reversed(names)))
    dev = sum(1 for value in split.values() if value == "dev")
    assert abs(dev - (len(names) - dev)) <= 1
    # Every case whose parity already put it in the smaller half stays there.
    import hashlib

    parity = {n: "dev" if int(hashlib.sha256(n.encode()).hexdigest(), 16) % 2 == 0 else "heldout" for n in names}
    smaller = min(("dev", "heldout"), key=lambda s: sum(1 for v in parity.values() if v == s))
    assert all(split[n] == smaller for n in names if parity[n] == smaller)


def test_the_manifest_follows_its_split_rule_and_holds_what_the_issue_asks() -> None:
    cases = oracle.load_cases()
    assert len(cases) >= 45
    assert sum(1 for case in cases.values() if case.kind == "notebook") >= 10
    expected = oracle.split_of(sorted(cases))
    assert {name: case.split for name, case in cases.items()} == expected
    for case in cases.values():
        assert case.repo.lower() not in REALCODE, case.name
        assert len(case.commit) == 40 and case.adaptation and case.path, case.name
        assert case.kind in {"script", "notebook"}
        assert case.script.endswith(".py"), case.name


@pytest.mark.parametrize(
    ("saving", "stops", "verdict"),
    [
        (None, False, oracle.UNMEASURABLE),
        (0, True, oracle.CONFIRMED),
        (10, False, oracle.CONFIRMED),
        (9, False, oracle.NOT_CONFIRMED),
        (-50, False, oracle.NOT_CONFIRMED),
    ],
)
def test_a_fix_confirms_a_finding_at_one_percent_of_the_peak_or_when_it_stops_the_growth(
    saving: int | None, stops: bool, verdict: str
) -> None:
    assert oracle.verdict_of(saving, stops, baseline=1000) == verdict


TOY = '''import torch
from torch import nn

model = nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))
loader = torch.utils.data.DataLoader(data, batch_size=256)
total_loss = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    optimizer.step()
    total_loss += loss
'''


def oracle_on_one_script(tmp_path: Path, name: str, source: str) -> dict:
    """bench/oracle.py, as a user runs it, on a one-case set of our own: the case's split's report."""
    corpus = tmp_path / "corpus"
    (corpus / name).mkdir(parents=True)
    (corpus / name / "train.py").write_text(source, encoding="utf-8")
    split = oracle.split_of([name])[name]
    manifest = tmp_path / "runnable.toml"
    manifest.write_text(
        f'[[case]]\nname = "{name}"\nrepo = "oom-lsp/tests"\ncommit = "{"0" * 40}"\npath = "train.py"\n'
        f'kind = "script"\nscript = "train.py"\nargs = []\nsplit = "{split}"\nadaptation = "ours"\n',
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "oracle.py"), "--manifest", str(manifest), "--corpus", str(corpus),
         "--oom-lsp", str(Path(sys.executable).parent / "oom-lsp"), "--no-cache", "--format", "json",
         "--list-heldout", "--timeout", "120", "--cache", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["splits"][split]


def test_one_case_of_our_own_through_the_whole_oracle(tmp_path: Path) -> None:
    """`total_loss += loss` keeps every step's graph, and `backward(retain_graph=True)` keeps the
    4 MiB its nodes saved: dropping retain_graph (OOM304's quick fix) stops the growth and lowers the
    peak by about a fifth: confirmed. (Without `total_loss`, nothing holds the graph and the same fix
    saves 0.6 %: not confirmed, rightly.)"""
    part = oracle_on_one_script(tmp_path, "toy", TOY)
    assert not part["failures"], part["failures"]
    (result,) = part["results"]
    assert abs(result["estimate_error"]) <= oracle.ESTIMATE_TOLERANCE
    kept = next(f for f in result["findings"] if f["code"] == "OOM304")
    assert kept["verdict"] == oracle.CONFIRMED and kept["how"] == "quick fix", result["findings"]
    assert kept["stops_growth"] and kept["saving_share"] > 0.1
    assert part["tally"]["OOM304"][oracle.CONFIRMED] == 1
    assert part["tally"]["total"]["findings"] == len(result["findings"])


def test_the_stage_cache_keeps_values_and_failures_by_their_extra_key(tmp_path: Path) -> None:
    calls: list[str] = []

    def measure(value):
        def compute():
            calls.append(value)
            if value == "broken":
                raise oracle.CaseError("the real run failed")
            return {"peak": value}
        return compute

    cache = oracle.StageCache(tmp_path, "case-abc-123")
    assert cache.get("whatif", measure("a"), "findings-1") == {"peak": "a"}
    assert cache.get("whatif", measure("b"), "findings-1") == {"peak": "a"}  # same findings: kept
    assert cache.get("whatif", measure("c"), "findings-2") == {"peak": "c"}  # other findings: measured
    with pytest.raises(oracle.CaseError):
        cache.get("real", measure("broken"))
    with pytest.raises(oracle.CaseError, match="the real run failed"):
        cache.get("real", measure("never"))  # the failure is kept, not run again
    assert calls == ["a", "c", "broken"]
    assert oracle.StageCache(None, "k").get("real", measure("d")) == {"peak": "d"}  # --no-cache


def test_a_finding_whose_code_never_ran_is_unmeasurable_not_unconfirmed() -> None:
    ran = {"train.py:10", "train.py:11", "pkg/model.py:40"}
    assert oracle.reached({"file": "train.py", "line": 9, "end_line": 10}, ran)
    assert oracle.reached({"file": "./pkg/model.py", "line": 40}, ran)
    assert not oracle.reached({"file": "train.py", "line": 30, "end_line": 31}, ran)  # the evaluation


def test_a_quick_fix_s_edits_are_applied_last_first_at_their_one_based_positions() -> None:
    text = "a = 1\nloss_sum += loss\nprint(a)\n"
    edits = [
        {"content": ".detach()", "location": {"row": 2, "column": 17}, "end_location": {"row": 2, "column": 17}},
        {"content": "b", "location": {"row": 1, "column": 1}, "end_location": {"row": 1, "column": 2}},
    ]
    assert oracle.apply_edits(text, edits) == "b = 1\nloss_sum += loss.detach()\nprint(a)\n"


EVALUATED_AFTER_TRAINING = '''import torch
from torch import nn

model = nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train = torch.utils.data.TensorDataset(torch.randn(256, 256), torch.randint(0, 10, (256,)))
valid = torch.utils.data.TensorDataset(torch.randn(2048, 256), torch.randint(0, 10, (2048,)))
for x, y in torch.utils.data.DataLoader(train, batch_size=64):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
model.eval()
total = 0.0
for x, y in torch.utils.data.DataLoader(valid, batch_size=1024):
    output = model(x)
    loss = nn.functional.cross_entropy(output, y)
    total += loss.item()
print(total)
'''


def test_a_finding_that_runs_after_the_traced_steps_is_measured_by_whole_real_runs(tmp_path: Path) -> None:
    """The evaluation after training runs with autograd on, and `output` keeps one batch's graph
    (16 MiB of activations at batch 1024) while the next batch runs: OOM303. Its code never runs in
    the two steps the trace covers; the script's whole run, for real, with and without the quick
    fix (`torch.inference_mode()` around the loop) measures the saving: confirmed."""
    part = oracle_on_one_script(tmp_path, "late", EVALUATED_AFTER_TRAINING)
    assert not part["failures"], part["failures"]
    (result,) = part["results"]
    evaluation = next(f for f in result["findings"] if f["code"] == "OOM303")
    assert evaluation["reached"] is False
    assert evaluation["verdict"] == oracle.CONFIRMED, evaluation
    assert evaluation["how"] == "quick fix, whole real runs"
    assert evaluation["whole_run_bytes"] - evaluation["whole_run_fixed_bytes"] > 16 * 2**20


def test_check_reads_the_published_code_not_the_data_writer(tmp_path: Path) -> None:
    """A case's top-level prepare.py writes its random data (it is ours, not the published code):
    `check` is not given it; a published module of the same name deeper down is."""
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "prepare.py").write_text("import numpy\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "prepare.py").write_text("y = 2\n")
    (tmp_path / "PREPARED").write_text("data/*\n")
    assert sorted(oracle.python_files(tmp_path)) == ["pkg/prepare.py", "train.py"]


def test_the_gpu_proxy_counts_an_attention_fix_by_its_cuda_prediction_apart_from_the_cpu_verdict() -> None:
    finding = {"code": "OOM402", "verdict": oracle.NOT_CONFIRMED, "cuda_saving_bytes": 48, "cuda_peak_bytes": 1000}
    result = {"case": "c", "baseline_bytes": 10_000, "findings": [finding], "knobs": {}}
    assert oracle.gpu_proxy(result, finding) == (48, 1000)
    total = oracle.tally([result])["total"]
    assert total[oracle.CONFIRMED] == 0  # the CPU verdict stands
    assert total["confirmed with the GPU proxy"] == 1  # 4.8 % of the CUDA peak
    finding["cuda_saving_bytes"] = 5  # 0.5 %: under the 1 % bar
    assert oracle.tally([result])["total"]["confirmed with the GPU proxy"] == 0
    bf16 = {"code": "OOM201", "verdict": oracle.NOT_CONFIRMED}
    assert oracle.gpu_proxy({"baseline_bytes": 10_000, "knobs": {"knob:bf16": 300}}, bf16) == (300, 10_000)
