"""Every output format, on hand-made findings (independent of the rules)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from oom_lsp.analysis import registry
from oom_lsp.analysis.findings import Applicability, Finding, Fix, Severity
from oom_lsp.edits import Position, Range, TextEdit
from oom_lsp.output import FORMATS, RenderOptions, renderer, rule_url
from oom_lsp.output.github import escape_data, escape_property

SOURCE = 'import torch\nstate = torch.load("x.pt")\nbatch = 256\n'


@dataclass
class Checked:
    display: str
    findings: list[Finding] = field(default_factory=list)
    source: str | None = None


def _finding(
    code: str, name: str, line: int, start: int, end: int, severity: Severity, fix: Fix | None
) -> Finding:
    return Finding(
        code=code,
        name=name,
        message=f"{name} happened, 100% sure: a, b",
        range=Range(Position(line, start), Position(line, end)),
        severity=severity,
        fix=fix,
        statement_line=line,
    )


SAFE_FIX = Fix(
    'Pass `map_location="cpu"`',
    (TextEdit(Range(Position(2, 25), Position(2, 25)), ', map_location="cpu"'),),
    Applicability.SAFE,
)
UNSAFE_FIX = Fix(
    "Lower the batch size", (TextEdit(Range(Position(3, 8), Position(3, 11)), "32"),), Applicability.UNSAFE
)

LOAD = _finding("OOM501", "torch-load-without-map-location", 2, 8, 26, Severity.WARNING, SAFE_FIX)
BATCH = _finding("OOM101", "large-batch-size", 3, 8, 11, Severity.ERROR, UNSAFE_FIX)
NOTE = _finding("OOM000", "invalid-syntax", 1, 0, 1, Severity.INFO, None)

FILES = [Checked("src/train.py", [LOAD, BATCH], SOURCE), Checked("other.py", [NOTE], "x = (\n")]


def render(name: str, files: list[Checked] = FILES, **options: bool) -> str:
    return renderer(name)(files, RenderOptions(**options))


def test_text() -> None:
    lines = render("text").splitlines()
    assert lines == [
        "src/train.py:2:9: OOM501 [*] torch-load-without-map-location happened, 100% sure: a, b",
        "src/train.py:3:9: OOM101 large-batch-size happened, 100% sure: a, b",
        "other.py:1:1: OOM000 invalid-syntax happened, 100% sure: a, b",
    ]


def test_text_unsafe_fixes_count_as_fixable_and_show_fix_titles() -> None:
    lines = render("text", unsafe_fixes=True, show_fix_titles=True).splitlines()
    assert lines[0].startswith("src/train.py:2:9: OOM501 [*] ")
    assert lines[1] == '    help: Pass `map_location="cpu"` (safe fix)'
    assert lines[2].startswith("src/train.py:3:9: OOM101 [*] ")
    assert lines[3] == "    help: Lower the batch size (unsafe fix)"


def test_full_has_a_code_frame_and_help() -> None:
    out = render("full")
    block = out.split("\n\n")[0]
    assert block.splitlines() == [
        "OOM501 [*] torch-load-without-map-location happened, 100% sure: a, b",
        " --> src/train.py:2:9",
        "  |",
        "1 | import torch",
        '2 | state = torch.load("x.pt")',
        "  |         ^^^^^^^^^^^^^^^^^^ OOM501",
        "3 | batch = 256",
        "  |",
        'help: Pass `map_location="cpu"`',
    ]
    assert "help: Lower the batch size (unsafe: review it; applied only with --unsafe-fixes)" in out


def test_empty_output_for_no_findings() -> None:
    for name in ("text", "full", "github"):
        assert render(name, [Checked("a.py")]) == ""
    assert json.loads(render("json", [Checked("a.py")])) == []
    assert json.loads(render("sarif", [Checked("a.py")]))["runs"][0]["results"] == []


def test_json_fields() -> None:
    records = json.loads(render("json"))
    assert len(records) == 3
    first = records[0]
    required = {
        "path",
        "line",
        "column",
        "end_line",
        "end_column",
        "code",
        "name",
        "message",
        "severity",
        "fix",
        "url",
    }
    assert required <= set(first)
    assert first["path"] == "src/train.py"
    assert (first["line"], first["column"], first["end_line"], first["end_column"]) == (2, 9, 2, 27)
    assert first["code"] == "OOM501" and first["severity"] == "warning"
    assert first["fix"]["title"] == 'Pass `map_location="cpu"`'
    assert first["fix"]["applicability"] == "safe"
    assert first["fix"]["edits"] == [
        {
            "content": ', map_location="cpu"',
            "location": {"row": 2, "column": 26},
            "end_location": {"row": 2, "column": 26},
        }
    ]
    assert first["url"] == rule_url("OOM501", "torch-load-without-map-location")
    # Ruff's names too.
    assert first["filename"] == "src/train.py"
    assert first["location"] == {"row": 2, "column": 9} and first["end_location"] == {"row": 2, "column": 27}
    assert records[1]["fix"]["applicability"] == "unsafe"
    assert records[2]["fix"] is None and records[2]["severity"] == "info"


def test_github_annotations() -> None:
    lines = render("github").splitlines()
    assert lines[0] == (
        "::warning file=src/train.py,line=2,col=9,endLine=2,endColumn=27,title=OOM501::"
        "torch-load-without-map-location happened, 100%25 sure: a, b"
    )
    assert lines[1].startswith("::error file=src/train.py,line=3,col=9,")
    assert lines[2].startswith("::notice file=other.py,line=1,col=1,endLine=1,endColumn=2,title=OOM000::")


def test_github_escaping() -> None:
    assert escape_data("50%\nnext\r") == "50%25%0Anext%0D"
    assert escape_property("dir,with:odd.py") == "dir%2Cwith%3Aodd.py"
    out = render("github", [Checked("a,b.py", [LOAD], SOURCE)])
    assert out.startswith("::warning file=a%2Cb.py,line=2")


def test_sarif_structure() -> None:
    log = json.loads(render("sarif"))
    # Required properties of SARIF 2.1.0 (sarifLog, run, tool, toolComponent,
    # reportingDescriptor, result, message, physicalLocation, region).
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    assert isinstance(log["runs"], list) and len(log["runs"]) == 1
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "oom-lsp"
    assert driver["informationUri"].startswith("https://")
    rules = driver["rules"]
    ids = [rule["id"] for rule in rules]
    assert ids == sorted(registry.all_codes())
    for rule in rules:
        assert rule["name"] and rule["shortDescription"]["text"] and rule["helpUri"].startswith("https://")
        assert rule["defaultConfiguration"]["level"] in {"error", "warning", "note"}
        assert rule["help"]["markdown"].startswith(f"# {rule['name']} ({rule['id']})")
    assert run["columnKind"] == "unicodeCodePoints"
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].startswith("file://")
    results = run["results"]
    assert [result["ruleId"] for result in results] == ["OOM501", "OOM101", "OOM000"]
    assert [result["level"] for result in results] == ["warning", "error", "note"]
    for result in results:
        assert result["message"]["text"]
        assert ids[result["ruleIndex"]] == result["ruleId"]
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
        region = location["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert region["endColumn"] >= region["startColumn"]
    first = results[0]["locations"][0]["physicalLocation"]
    assert first["artifactLocation"]["uri"] == "src/train.py"
    assert first["region"] == {"startLine": 2, "startColumn": 9, "endLine": 2, "endColumn": 27}
    replacement = results[0]["fixes"][0]["artifactChanges"][0]["replacements"][0]
    assert replacement["deletedRegion"] == {"startLine": 2, "startColumn": 26, "endLine": 2, "endColumn": 26}
    assert replacement["insertedContent"]["text"] == ', map_location="cpu"'


def test_sarif_absolute_paths_become_file_uris(tmp_path: Path) -> None:
    absolute = str(tmp_path / "train.py")
    log = json.loads(render("sarif", [Checked(absolute, [LOAD], SOURCE)]))
    location = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": (tmp_path / "train.py").as_uri()}


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_renders_every_severity(name: str) -> None:
    files = [
        Checked("a.py", [_finding("OOM501", "x", 1, 0, 1, severity, None)], "import torch\n")
        for severity in Severity
    ]
    assert render(name, files)


def test_full_frames_the_line_python_numbers_below_a_form_feed_or_u2028() -> None:
    source = 'import torch\n# page \x0c break \u2028 here\nstate = torch.load("x.pt")\n'
    finding = _finding("OOM501", "torch-load-without-map-location", 3, 8, 26, Severity.WARNING, None)
    block = render("full", [Checked("train.py", [finding], source)])
    assert '3 | state = torch.load("x.pt")' in block.splitlines()


def test_the_human_formats_print_no_control_character_of_the_file() -> None:
    """A comment can hold the sequence that retitles a terminal (`ESC ] 0 ; ... BEL`) or
    reorders a line (RLO): drawn as Ruff draws them, one character each, so the carets stay."""
    source = 'import torch\nstate = torch.load("x.pt")  # \x1b]0;pwned\x07 \x1b[2J \u202e \x9b\n'
    finding = _finding("OOM501", "torch-load-without-map-location", 2, 8, 26, Severity.WARNING, SAFE_FIX)
    escaped = Checked("evil\x1b[31m.py", [finding], source)
    for name in ("text", "full"):
        out = render(name, [escaped])
        assert not [char for char in out if ord(char) < 0x20 and char != "\n"], (name, out)
        assert "\x7f" not in out and "\u202e" not in out and "\x9b" not in out
        assert "evil␛[31m.py" in out
    frame = render("full", [escaped]).splitlines()
    assert frame[4] == '2 | state = torch.load("x.pt")  # ␛]0;pwned␇ ␛[2J � �'
    assert frame[5] == "  |         ^^^^^^^^^^^^^^^^^^ OOM501"
