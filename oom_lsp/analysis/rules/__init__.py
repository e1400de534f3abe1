"""The rules of the catalogue (/RULES.md), one module per family.

A rule is declared once: its class (a `Rule` subclass with a `code`) in a
module of this package. `oom_lsp.analysis.registry` finds every module here
(those whose names start with `_` hold shared helpers) and every rule class
in it; `oom_lsp.analysis.catalogue`, the table of codes that the CLI reads
without importing the rules, is generated from them
(`python -m oom_lsp.analysis.registry --write-catalogue`) and a test keeps
it current.
"""
