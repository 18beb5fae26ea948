"""The steering-files rule at the files routes and the session shell, for both fronts.

:func:`check_write` is called by ``POST /file/write`` and ``/file/edit`` (and their
``/workspaces/<ws>/`` forms) and by ``/acp`` ``_qwen/file/write`` / ``_qwen/file/edit``
before they change anything; :func:`check_command` by ``POST /session/:id/shell``. Both
refuse a non-admin principal (multi-user auth only; the operator and admins pass) with
:class:`~serve.access.errors.Forbidden` ``need: admin`` when the path is, or lies in, a
file or folder of :mod:`serve.access.steering_files` (the list, and why).

A path counts as written (normalized: ``./QWEN.md``, ``sub/../QWEN.md``) and as resolved
by the workspace (every symlink followed, so ``link.md -> QWEN.md`` or ``cfg -> .qwen``
count), and a steering entry at the workspace root that is itself a symlink protects its
target (``QWEN.md -> docs/x.md``: ``docs/x.md`` is what agents read), one that is a file
with more than one hard link its other names. (Nested steering entries' links are not
looked for: the files routes make neither symlinks nor hard links.) The workspace's
memory file name (``--memory-file-name``, ``context.fileName`` of its settings) is one
more steering name. Resolution and the settings read run in a worker thread under the
file routes' limiter.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import trio

from serve.access.errors import Forbidden
from serve.access.principal import ADMIN, Principal
from serve.access.steering_files import DIRS, FILES, mentions, steering_part
from serve.threads import file_routes_limiter
from serve.workspaces.files import Workspace, WorkspaceFsError
from serve.workspaces.state.settings_file import SettingsFileError, read_settings

__all__ = ["check_command", "check_write", "memory_names", "steering_target"]


def _refused(path: str, what: str = "path") -> Forbidden:
    return Forbidden(ADMIN, reason="steering_file", **{what: path})


def memory_names(ws: Workspace, flag: str) -> tuple[str, ...]:
    """The workspace's configured memory file names (blocking: a worker thread's)."""
    names = [flag] if flag else []
    try:
        settings, _ = read_settings(ws)
    except (SettingsFileError, WorkspaceFsError):
        settings = {}
    context = settings.get("context")
    configured = context.get("fileName") if isinstance(context, dict) else None
    for name in configured if isinstance(configured, list) else [configured]:
        if isinstance(name, str) and name and "/" not in name:
            names.append(name)
    return tuple(names)


def _below(path: str, root: str) -> tuple[str, ...] | None:
    rel = os.path.relpath(path, root)
    if rel == ".":
        return ()
    if rel == ".." or rel.startswith("../"):
        return None
    return tuple(rel.split(os.sep))


def _linked_targets(root: str, extra: Iterable[str]) -> tuple[list[str], set[tuple[int, int]]]:
    """Real paths of the steering entries at ``root`` that are symlinks, and the
    ``(device, inode)`` of those that are files with more than one hard link."""
    wanted = FILES | DIRS | {n.lower() for n in extra}
    links: list[str] = []
    inodes: set[tuple[int, int]] = set()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return links, inodes
    for entry in entries:
        if entry.name.lower() not in wanted:
            continue
        try:
            if entry.is_symlink():
                links.append(os.path.realpath(entry.path))
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                if st.st_nlink > 1:
                    inodes.add((st.st_dev, st.st_ino))
        except OSError:
            continue
    return links, inodes


def steering_target(ws: Workspace, user_path: str, extra: Iterable[str]) -> str | None:
    """The steering path ``user_path`` names in ``ws`` (see the module docstring); None
    when it names none, or cannot be resolved (the file function answers that).
    Blocking: a worker thread's."""
    names = tuple(extra)
    root = ws.root
    if isinstance(user_path, str) and user_path:
        lexical = os.path.normpath(
            user_path if os.path.isabs(user_path) else os.path.join(root, user_path)
        )
        parts = _below(lexical, root)
        found = steering_part(parts, names) if parts else None
        if found is not None:
            return found
    try:
        resolved = ws.resolve(user_path, must_exist=False)
    except WorkspaceFsError:
        return None
    found = steering_part(resolved.parts, names)
    if found is not None:
        return found
    links, inodes = _linked_targets(root, names)
    for target in links:
        if resolved.absolute == target or resolved.absolute.startswith(target + os.sep):
            return resolved.relative
    if inodes and resolved.exists:
        try:
            st = os.stat(resolved.absolute)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) in inodes:
            return resolved.relative  # a hard link of a steering file at the root
    return None


async def check_write(
    ws: Workspace, user_path: object, who: Principal, *, multi_user: bool, memory_flag: str
) -> None:
    """Refuse ``who`` (not an admin, multi-user auth on) a change of a steering path."""
    if not multi_user or who.admin or not isinstance(user_path, str):
        return

    def find() -> str | None:
        return steering_target(ws, user_path, memory_names(ws, memory_flag))

    found = await trio.to_thread.run_sync(find, limiter=file_routes_limiter())
    if found is not None:
        raise _refused(found)


async def check_command(
    ws: Workspace, command: str, who: Principal, *, multi_user: bool, memory_flag: str
) -> None:
    """Refuse ``who`` (not an admin, multi-user auth on) a shell command that names a
    steering file or folder (a tripwire: docs/multi-user.md)."""
    if not multi_user or who.admin:
        return
    names = await trio.to_thread.run_sync(memory_names, ws, memory_flag)
    found = mentions(command, names)
    if found is not None:
        raise _refused(found, "mentions")
