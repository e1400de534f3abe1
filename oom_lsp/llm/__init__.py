"""LLM fixes: the seven-section prompt, an OpenAI-compatible client, typed proposals,
SEARCH/REPLACE edits checked before they reach the user, and the OOM fix log.

Nothing is imported here: `oom_lsp.cli.ai` is loaded by the CLI parser and must
stay light (no openai, no pydantic, no torch). The language server calls
`oom_lsp.llm.fixer.propose_fix` (see docs/ai-fixes.md, "For the language server").
"""
