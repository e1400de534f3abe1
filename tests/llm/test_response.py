from __future__ import annotations

import json

import pytest

from oom_lsp.llm.response import FixProposal, ParseError, parse_answer, parse_json, parse_text

TEXT = """Here is my analysis.

### 1. Diagnosis
1) **Graph kept alive** (High): `total += loss` on line 12.
2. Batch of 512 (medium): 7.02 GiB at batch 512.
3. Float32 activations (low): no autocast.
4. Too many causes (low): ignored.

### 2. Edits
```python
<<<<<<<< SEARCH
    total += loss
========
    total += loss.item()
>>>>>>>> REPLACE
```
<<<<<<< SEARCH
x = 1
=======
>>>>>>> REPLACE

### 3. Validation
Peak stays flat.

### 4. Changelog
- Accumulate the loss as a Python float
"""


def test_text_with_fences_numbered_headings_and_deletions() -> None:
    proposal = parse_text(TEXT)
    assert [cause.title for cause in proposal.causes] == [
        "Graph kept alive",
        "Batch of 512",
        "Float32 activations",
    ]
    assert proposal.causes[0].likelihood.value == "high"
    assert [(edit.search, edit.replace) for edit in proposal.edits] == [
        ("    total += loss\n", "    total += loss.item()\n"),
        ("x = 1\n", ""),
    ]
    assert proposal.validation.step == "Peak stays flat."
    assert proposal.changelog == "Accumulate the loss as a Python float"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("", "the answer is empty"),
        ("Buy a bigger GPU.", "no `## Diagnosis` section"),
        ("## Diagnosis\nIt is the batch.\n## Changelog\nx\n", "no cause found"),
        ("## Diagnosis\n1. a (high): b\n## Edits\n<<<<<<< SEARCH\nx\n## Changelog\ny\n", "not closed"),
        ("## Diagnosis\n1. a (high): b\n", "Changelog section is missing"),
    ],
)
def test_text_errors(answer: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_answer(answer, "text")


def test_diagnosis_only() -> None:
    proposal = parse_text("## Diagnosis\n1. a (low): b\n## Changelog\nNothing to change\n")
    assert proposal.edits == [] and proposal.changelog == "Nothing to change"


def test_json() -> None:
    data = {
        "causes": [{"title": "t", "evidence": "e", "likelihood": "medium"}],
        "edits": [{"search": "a\n", "replace": "b\n", "why": "w"}],
        "validation": {"step": "s", "expected": "x"},
        "changelog": "Do it\nsecond line dropped",
    }
    proposal = parse_json("```json\n" + json.dumps(data) + "\n```")
    assert proposal.changelog == "Do it" and proposal.blocks[0].search == "a\n"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{", "not valid JSON"),
        (json.dumps({"causes": []}), "edits"),
        (
            json.dumps(
                {"causes": [], "edits": [], "validation": {"step": "", "expected": ""}, "changelog": "x"}
            ),
            "between 1 and 3 causes",
        ),
        (
            json.dumps(
                {
                    "causes": [{"title": "t", "evidence": "e", "likelihood": "sure"}],
                    "edits": [],
                    "validation": {"step": "", "expected": ""},
                    "changelog": "x",
                }
            ),
            "likelihood",
        ),
    ],
)
def test_json_errors(data: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_answer(data, "json_schema")


def test_schema_is_strict_friendly() -> None:
    schema = FixProposal.model_json_schema()
    assert list(schema["properties"]) == ["causes", "edits", "validation", "changelog"]
    assert schema["additionalProperties"] is False
    assert "minItems" not in json.dumps(schema) and "maxLength" not in json.dumps(schema)


def test_bold_headings() -> None:
    answer = "**Diagnosis:**\n1. a (high): b\n**Edits**\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n**Changelog**\nDo it\n"
    proposal = parse_text(answer)
    assert (
        proposal.causes[0].title == "a"
        and proposal.edits[0].replace == "y\n"
        and proposal.changelog == "Do it"
    )
