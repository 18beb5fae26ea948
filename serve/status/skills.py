"""Project skills: ``<workspace>/.qwen/skills/<name>/SKILL.md`` names and descriptions.

Synchronous (run in a worker thread), through the shared workspace boundary, so a skill
directory or file that links out of the workspace is reported as an error cell and never
read. Only the YAML front matter (``---`` … ``---``, at most
:data:`MAX_FRONT_MATTER_CHARS`) is parsed, with ``yaml.safe_load``; the body and the
file's path are never returned (the seed forbids both in status payloads). At most
:data:`MAX_SKILLS` directories are looked at. Per skill: ``name`` (front matter, else the
directory name), ``description``, ``level: "project"``, ``modelInvocable`` (false when
``disable-model-invocation`` is true) and ``argumentHint`` when given.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Final

from serve.workspaces.files import Workspace, WorkspaceFsError, list_dir, read_text

__all__ = ["MAX_FRONT_MATTER_CHARS", "MAX_SKILLS", "SKILLS_DIR", "project_skills"]

SKILLS_DIR: Final = ".qwen/skills"
MAX_SKILLS: Final = 256
MAX_FRONT_MATTER_CHARS: Final = 16 * 1024
_READ_BYTES: Final = 64 * 1024


def _front_matter(text: str) -> dict[str, Any] | None:
    if not text.startswith("---"):
        return {}
    lines = text.splitlines()
    for index in range(1, len(lines)):
        if lines[index].strip() == "---":
            block = "\n".join(lines[1:index])
            if len(block) > MAX_FRONT_MATTER_CHARS:
                return None
            try:
                data = _yaml().safe_load(block)
            except _yaml().YAMLError:
                return None
            return data if isinstance(data, dict) else ({} if data is None else None)
    return None


def _error(name: str, message: str, kind: str) -> dict[str, Any]:
    return {
        "kind": "skill",
        "status": "error",
        "name": name,
        "level": "project",
        "error": message,
        "errorKind": kind,
    }


def _skill(ws: Workspace, directory: str) -> dict[str, Any]:
    try:
        text = read_text(ws, f"{SKILLS_DIR}/{directory}/SKILL.md", max_bytes=_READ_BYTES).content
    except WorkspaceFsError as err:
        kind = "missing_file" if err.kind == "path_not_found" else "parse_error"
        return _error(directory, f"SKILL.md cannot be read ({err.kind})", kind)
    meta = _front_matter(text)
    if meta is None:
        return _error(directory, "SKILL.md front matter is not valid YAML", "parse_error")
    name = meta.get("name") if isinstance(meta.get("name"), str) else directory
    description = meta.get("description")
    cell: dict[str, Any] = {
        "kind": "skill",
        "status": "ok",
        "name": name,
        "description": description if isinstance(description, str) else "",
        "level": "project",
        "modelInvocable": meta.get("disable-model-invocation") is not True,
    }
    hint = meta.get("argument-hint", meta.get("argumentHint"))
    if isinstance(hint, str):
        cell["argumentHint"] = hint
    return cell


def project_skills(ws: Workspace) -> list[dict[str, Any]]:
    """Skill cells, sorted by directory name; ``[]`` when there is no skills directory."""
    try:
        listing = list_dir(ws, SKILLS_DIR, include_ignored=True, max_entries=MAX_SKILLS)
    except WorkspaceFsError:
        return []
    return [
        _skill(ws, entry.name)
        for entry in listing.entries
        if entry.kind in ("directory", "symlink")
    ]


def _yaml() -> ModuleType:
    """PyYAML, imported on first use (most daemons never parse a skill)."""
    return importlib.import_module("yaml")  # (untyped: no stubs installed)
