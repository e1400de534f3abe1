"""What the editor features add to each other, per server (`OomLanguageServer.hooks`).

A feature never imports the one that uses what it adds: at registration (server/features.py)
it puts its diagnostics source, code actions, title notes, watched files or the documents it
answers for here, and the feature that serves the request reads them from the server it runs
on. The server core (server.py) holds one `FeatureHooks` per server and knows no feature.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lsprotocol import types
    from pygls.workspace import TextDocument

    from oom_lsp.analysis import Finding
    from oom_lsp.server.server import OomLanguageServer

# Diagnostics from outside the analysis (an OOM report of the runtime guard, an estimate, a
# profile, an explained log): called with the server and a URI each time that document's
# diagnostics are sent.
ExtraDiagnostics = Callable[["OomLanguageServer", str], "list[types.Diagnostic]"]
# A feature's actions on every codeAction answer (honouring `context.only`); an action listed
# without its edit carries `data["resolver"]`, the name its resolver was added under.
ActionProvider = Callable[
    ["OomLanguageServer", "types.CodeActionParams", "TextDocument"], Awaitable["list[types.CodeAction]"]
]
ActionResolver = Callable[["OomLanguageServer", "types.CodeAction"], Awaitable["types.CodeAction"]]
# Words a feature adds to a fix's title (the what-if's measured saving), for the finding's
# quick fix or (None) the fix-all.
TitleNote = Callable[["OomLanguageServer", "TextDocument", "Finding | None"], "str | None"]
# Documents another feature answers for (notebook cells): whether it owns a URI.
Owns = Callable[["OomLanguageServer", str], bool]
CodeActionHandler = Callable[
    ["OomLanguageServer", "types.CodeActionParams"], Awaitable["list[types.CodeAction] | None"]
]
WatchListener = Callable[["OomLanguageServer", "list[types.FileEvent]"], None]


@dataclass
class CellOwner:
    """A feature that analyses and publishes some documents itself (the notebooks' cells)."""

    owns: Owns
    refresh: Callable[[OomLanguageServer], None]  # settings changed: check them all again
    code_actions: CodeActionHandler | None = None


@dataclass
class FeatureHooks:
    extra_diagnostics: list[ExtraDiagnostics] = field(default_factory=list)
    action_providers: list[ActionProvider] = field(default_factory=list)
    action_resolvers: dict[str, ActionResolver] = field(default_factory=dict)
    title_notes: list[TitleNote] = field(default_factory=list)
    cell_owners: list[CellOwner] = field(default_factory=list)
    watched_globs: list[str] = field(default_factory=list)
    watch_listeners: list[WatchListener] = field(default_factory=list)
    # Sends a document's diagnostics again (the diagnostics feature's; set when it registers).
    republish: Callable[[OomLanguageServer, str], None] | None = None

    def add_provider(
        self, provider: ActionProvider, resolvers: dict[str, ActionResolver] | None = None
    ) -> None:
        if provider not in self.action_providers:
            self.action_providers.append(provider)
        self.action_resolvers.update(resolvers or {})

    def watch_files(self, globs: list[str], listener: WatchListener) -> None:
        self.watched_globs.extend(glob for glob in globs if glob not in self.watched_globs)
        if listener not in self.watch_listeners:
            self.watch_listeners.append(listener)

    def cell_owner(self, ls: OomLanguageServer, uri: str) -> CellOwner | None:
        return next((owner for owner in self.cell_owners if owner.owns(ls, uri)), None)

    def extra(self, ls: OomLanguageServer, uri: str) -> list[Any]:
        return [diagnostic for source in self.extra_diagnostics for diagnostic in source(ls, uri)]
