"""The settings file's one read-modify-write (serve/workspaces/state/settings_file.py), on
real files in a temporary workspace: the tool toggle and the dotted-key edits share one
lock and one conflict loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from serve.workspaces.files import Workspace
from serve.workspaces.state import settings_edit, settings_file
from serve.workspaces.state.settings_file import (
    MAX_UPDATE_ATTEMPTS,
    SettingsFileError,
    read_settings,
    set_tool_enabled,
)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / ".qwen").mkdir()
    (tmp_path / ".qwen" / "settings.json").write_text('{"ui": {"theme": "dark"}}\n')
    return Workspace(str(tmp_path), trusted=True)


def saved(ws: Workspace) -> Any:
    return json.loads((Path(ws.root) / ".qwen" / "settings.json").read_text())


def test_a_tool_toggle_waits_for_a_dotted_edit_in_progress(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One lock per workspace for every writer of the file: a toggle that arrives while an
    edit is between its read and its write waits for it (before, each had its own lock
    table and the toggle wrote in between, forcing the edit into a conflict retry)."""
    real_validate = settings_edit.validate_known
    toggle_done = threading.Event()
    seen_during_edit: list[bool] = []

    def toggle() -> None:
        set_tool_enabled(ws, "grep", False)
        toggle_done.set()

    def validate_and_race(doc: Any, path: tuple[str, ...]) -> None:
        real_validate(doc, path)
        if not seen_during_edit:
            thread = threading.Thread(target=toggle)
            thread.start()
            # The toggle cannot finish while this edit holds the lock: it never sets the
            # event here however long we wait; 0.5 s is only how long we look.
            seen_during_edit.append(toggle_done.wait(0.5))
            threads.append(thread)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(settings_edit, "validate_known", validate_and_race)
    result = settings_edit.update_setting(ws, ("ui", "theme"), "light")
    threads[0].join(10)
    assert seen_during_edit == [False]
    assert result.changed
    assert saved(ws) == {"ui": {"theme": "light"}, "tools": {"disabled": ["grep"]}}


def test_a_toggle_whose_file_vanished_before_its_write_is_redone(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file removed between the read and the write is a conflict like any other: the
    update is redone from a fresh read (it creates the file), as the dotted edits did."""
    real_read = settings_file.read_settings
    calls = 0

    def read_then_remove(w: Workspace) -> tuple[dict[str, Any], str | None]:
        nonlocal calls
        calls += 1
        out = real_read(w)
        if calls == 1:
            (Path(w.root) / ".qwen" / "settings.json").unlink()
        return out

    monkeypatch.setattr(settings_file, "read_settings", read_then_remove)
    assert set_tool_enabled(ws, "grep", False)
    assert calls == 2
    assert saved(ws) == {"tools": {"disabled": ["grep"]}}


def test_a_file_that_keeps_changing_gives_up_with_settings_busy(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = settings_file.read_settings
    calls = 0

    def read_then_touch(w: Workspace) -> tuple[dict[str, Any], str | None]:
        nonlocal calls
        calls += 1
        out = real_read(w)
        (Path(w.root) / ".qwen" / "settings.json").write_text(json.dumps({"n": calls}))
        return out

    monkeypatch.setattr(settings_file, "read_settings", read_then_touch)
    with pytest.raises(SettingsFileError) as err:
        settings_edit.update_setting(ws, ("ui", "theme"), "light")
    assert err.value.code == "settings_busy"
    assert calls == MAX_UPDATE_ATTEMPTS
    assert read_settings(ws)[0] == {"n": MAX_UPDATE_ATTEMPTS}
