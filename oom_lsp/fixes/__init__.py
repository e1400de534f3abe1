"""Deterministic fixes: libcst codemods that build a rule's FixSpec, and the
text-edit application shared by the CLI (`--fix`) and the language server."""
