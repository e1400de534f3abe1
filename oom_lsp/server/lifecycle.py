"""initialize / initialized / shutdown, settings changes and config-file changes."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

from lsprotocol import types
from pygls.uris import to_fs_path

from oom_lsp.server import diagnostics
from oom_lsp.server import settings as editor_settings
from oom_lsp.server.server import WATCHED_CONFIG_GLOBS, OomLanguageServer

logger = logging.getLogger(__name__)

# Other files features watch (the runtime guard's OOM reports, `server.hooks.watch_files`):
# their globs join the config files' registration, and each listener gets every
# didChangeWatchedFiles batch.


def register(server: OomLanguageServer) -> None:
    server.feature(types.INITIALIZE)(on_initialize)
    server.feature(types.INITIALIZED)(on_initialized)
    server.feature(types.SHUTDOWN)(on_shutdown)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(on_did_change_configuration)
    server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)(on_did_change_watched_files)


def on_initialize(ls: OomLanguageServer, params: types.InitializeParams) -> None:
    ls.logs.client_handler.attach(asyncio.get_running_loop())
    root = to_fs_path(ls.workspace.root_uri) if ls.workspace.root_uri else None
    ls.lint_settings = editor_settings.LintSettingsSource(Path(root) if root else None, ls.show_error)
    ls.apply_editor_settings(editor_settings.unwrap(params.initialization_options) or {})
    # Capabilities are computed after this handler: registering the pull
    # handler here advertises it only to clients that can pull.
    if ls.client_supports("text_document.diagnostic"):
        ls.pull_diagnostics = True
        diagnostics.register_pull(ls)
    client = params.client_info.name if params.client_info else "an unnamed client"
    logger.info(
        "oom-lsp %s for %s: %s diagnostics, %s positions",
        ls.version,
        client,
        "pull" if ls.pull_diagnostics else "push",
        ls.position_encoding,
    )


async def on_initialized(ls: OomLanguageServer, params: types.InitializedParams) -> None:
    try:
        configured = await ls.fetch_configuration()
        if configured is not None:
            ls.apply_editor_settings(configured)
        if ls.client_supports("workspace.did_change_watched_files.dynamic_registration"):
            await _watch_config_files(ls)
    finally:
        ls.settings_ready.set()


def on_shutdown(ls: OomLanguageServer, params: None) -> None:
    """Stop every running profile, estimate or validation (their process groups are
    killed) before answering: the client may end the process right after."""
    ls.stop_jobs()


async def _watch_config_files(ls: OomLanguageServer) -> None:
    globs = WATCHED_CONFIG_GLOBS + ls.hooks.watched_globs
    watchers = [types.FileSystemWatcher(glob_pattern=glob) for glob in globs]
    registration = types.Registration(
        id=str(uuid.uuid4()),
        method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
        register_options=types.DidChangeWatchedFilesRegistrationOptions(watchers=watchers),
    )
    try:
        await asyncio.wait_for(
            ls.client_register_capability_async(types.RegistrationParams(registrations=[registration])),
            timeout=5,
        )
    except asyncio.TimeoutError:
        logger.warning(
            "The client did not answer the file-watcher registration; config changes are found on edit"
        )


async def on_did_change_configuration(
    ls: OomLanguageServer, params: types.DidChangeConfigurationParams
) -> None:
    # Clients that answer workspace/configuration often send no settings
    # here (VS Code sends null): ask again; the others send the new values.
    configured = await ls.fetch_configuration()
    if configured is None:
        configured = editor_settings.unwrap(params.settings)
    if configured is None:
        return
    trusted_before = ls.editor.workspace_trusted
    ls.apply_editor_settings(configured)
    logger.info("Settings changed; checking the open documents again")
    diagnostics.refresh_all(ls)
    if ls.editor.workspace_trusted != trusted_before and ls.client_supports("workspace.code_lens.refresh_support"):
        ls.workspace_code_lens_refresh(None)  # the lenses that run the workspace's code come or go


def on_did_change_watched_files(ls: OomLanguageServer, params: types.DidChangeWatchedFilesParams) -> None:
    for listener in ls.hooks.watch_listeners:
        listener(ls, params.changes)
    names = editor_settings.CONFIG_FILE_NAMES
    if not any(change.uri.rsplit("/", 1)[-1] in names for change in params.changes):
        return
    logger.info("A configuration file changed; checking the open documents again")
    ls.lint_settings.invalidate()
    ls.forget_analyses()
    diagnostics.refresh_all(ls)
