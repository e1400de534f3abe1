"""The model's answer as a typed proposal, from either wire format.

`text` (the default, understood by every server):

    ## Diagnosis
    1. <title> (high|medium|low): <evidence>
    ## Edits
    <<<<<<< SEARCH
    <lines copied exactly>
    =======
    <replacement lines>
    >>>>>>> REPLACE
    ## Validation
    <the step to run and what should change>
    ## Changelog
    <one line>

`json_schema` (opt-in): the same fields as JSON, validated by the `FixProposal` model.
Counts and lengths are checked in a validator, not in the schema, so the schema stays
inside what strict mode and grammar backends all accept.

A malformed answer raises `ParseError`, whose message is sent back to the model once.
"""

from __future__ import annotations

import json
import re
from enum import Enum

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from oom_lsp.edits import split_lines
from oom_lsp.llm.edits import MAX_BLOCKS, SearchReplace

MAX_CAUSES = 3
MAX_CHANGELOG = 200


class ParseError(ValueError):
    """The answer does not follow the contract; the message says what is wrong."""


class Likelihood(str, Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Cause(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    evidence: str
    likelihood: Likelihood


class Edit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    search: str
    replace: str
    why: str


class Validation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: str
    expected: str


class FixProposal(BaseModel):
    """Fields in generation order: the diagnosis comes first and acts as the chain of thought."""

    model_config = ConfigDict(extra="forbid")
    causes: list[Cause]
    edits: list[Edit]
    validation: Validation
    changelog: str

    @model_validator(mode="after")
    def _check_counts(self) -> FixProposal:
        if not 1 <= len(self.causes) <= MAX_CAUSES:
            raise ValueError(f"give between 1 and {MAX_CAUSES} causes, not {len(self.causes)}")
        if len(self.edits) > MAX_BLOCKS:
            raise ValueError(f"give at most {MAX_BLOCKS} edits, not {len(self.edits)}")
        if not self.changelog.strip():
            raise ValueError("the changelog line is empty")
        self.changelog = self.changelog.strip().splitlines()[0][:MAX_CHANGELOG]
        return self

    @property
    def blocks(self) -> list[SearchReplace]:
        return [SearchReplace(edit.search, edit.replace, edit.why) for edit in self.edits]


# --- text ------------------------------------------------------------------------------------

# "## Diagnosis", "### 1. Diagnosis", and the bold "**Diagnosis:**" that small models write.
_SECTION = re.compile(
    r"^(?:#{2,3}\s*(?:\d+[.)]\s*)?(?P<heading>Diagnosis|Edits|Validation|Changelog)\s*:?"
    r"|\*\*\s*(?:\d+[.)]\s*)?(?P<bold>Diagnosis|Edits|Validation|Changelog)\s*:?\s*\*\*:?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_CAUSE = re.compile(r"^\s*\d+[.)]\s*(.+?)\s*\(\s*(high|medium|low)\s*\)\s*:\s*(.+)$", re.I)
_BLOCK = re.compile(
    r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*\r?\n(?P<search>.*?)^[ \t]*={5,9}[ \t]*\r?\n(?P<replace>.*?)^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$",
    re.S | re.M,
)
_FENCE = re.compile(r"^\s*```[\w-]*\s*$")


def parse_text(answer: str) -> FixProposal:
    sections = _sections(answer)
    diagnosis = sections.get("diagnosis", "")
    causes = []
    for line in diagnosis.splitlines():
        match = _CAUSE.match(line.replace("**", ""))
        if match:
            title, likelihood, evidence = match.groups()
            causes.append(
                Cause(title=title.strip(), evidence=evidence.strip(), likelihood=likelihood.lower())
            )
    if not causes:
        raise ParseError(
            "no cause found: the ## Diagnosis section must list causes as "
            "`1. <title> (high|medium|low): <evidence>`"
        )
    edits_text = sections.get("edits", "")
    blocks = [
        Edit(search=_unfence(match["search"]), replace=_unfence(match["replace"]), why="")
        for match in _BLOCK.finditer(edits_text)
    ]
    if not blocks and re.search(r"^[ \t]*<{5,9}[ \t]*SEARCH", edits_text, re.M):
        raise ParseError(
            "a SEARCH/REPLACE block is not closed: each needs `=======` and `>>>>>>> REPLACE` lines"
        )
    validation = _unfence(sections.get("validation", "")).strip()
    changelog = next(
        (line.strip(" -*`") for line in sections.get("changelog", "").splitlines() if line.strip()), ""
    )
    if not changelog:
        raise ParseError("the ## Changelog section is missing or empty: end with one changelog line")
    try:
        return FixProposal(
            causes=causes[:MAX_CAUSES],
            edits=blocks,
            validation=Validation(step=validation, expected=""),
            changelog=changelog,
        )
    except ValidationError as error:
        raise ParseError(_first_error(error)) from None


def _sections(answer: str) -> dict[str, str]:
    headings = list(_SECTION.finditer(answer))
    found: dict[str, str] = {}
    for heading, following in zip(headings, [*headings[1:], None]):
        end = following.start() if following else len(answer)
        name = heading["heading"] or heading["bold"]
        found.setdefault(name.lower(), answer[heading.end() : end])
    if "diagnosis" not in found:
        raise ParseError("the answer has no `## Diagnosis` section: use the four headings of the format")
    return found


def _unfence(text: str) -> str:
    lines = [line for line in split_lines(text, keepends=True) if not _FENCE.match(line)]
    return "".join(lines)


# --- json ------------------------------------------------------------------------------------


def parse_json(answer: str) -> FixProposal:
    text = answer.strip()
    if text.startswith("```"):
        text = _unfence(text)
    try:
        return FixProposal.model_validate(json.loads(text))
    except json.JSONDecodeError as error:
        raise ParseError(f"the answer is not valid JSON: {error.msg} at line {error.lineno}") from None
    except ValidationError as error:
        raise ParseError(_first_error(error)) from None


def from_validation_error(error: ValidationError) -> ParseError:
    return ParseError(_first_error(error))


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    return f"the answer does not match the schema: {where + ': ' if where else ''}{message}"


def parse_answer(answer: str, response_format: str) -> FixProposal:
    if not answer.strip():
        raise ParseError("the answer is empty")
    return parse_json(answer) if response_format == "json_schema" else parse_text(answer)
