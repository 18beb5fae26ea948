"""The Landlock sandbox (acp/landlock.py): the planner carves protected locations out of the
grants on a real tmp tree, and a real child under the real kernel is denied exactly those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from acp import landlock
from acp.confine import EXIT_CONFINE_FAILED, Confinement
from serve.isolation.sandbox import INLINE_SPEC_BYTES

needs_landlock = pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")


def _tree(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    state = home / ".local" / "state" / "acp-serve"
    (state / "journal").mkdir(parents=True)
    (state / "journal" / "s1.jsonl").write_text("secret journal\n")
    (home / ".qwen").mkdir()
    (home / ".qwen" / "settings.json").write_text("{}")
    (home / ".local" / "share").mkdir()
    (home / ".profile").write_text("x")
    ws = tmp_path / "ws"
    ws.mkdir()
    other = tmp_path / "other-ws"
    other.mkdir()
    (other / "code.py").write_text("other's code\n")
    return {"home": home, "state": state, "ws": ws, "other": other, "root": tmp_path}


def test_plan_carves_protected_paths_out_of_home(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    spec = landlock.plan([str(t["home"]), str(t["ws"])], [str(t["state"]), str(t["other"])])
    home = t["home"]
    write = set(spec["write"])
    # Every existing entry of a carved level has its own rule; the carved levels have none.
    assert {
        str(home / ".qwen"),
        str(home / ".profile"),
        str(home / ".local" / "share"),
        str(t["ws"]),
    } <= write
    for carved in (home, home / ".local", home / ".local" / "state"):
        assert str(carved) not in write
        assert str(carved) not in spec["read"]
    # Nothing granted covers a protected location.
    for rule in spec["read"] + spec["write"]:
        for prot in (t["state"], t["other"]):
            assert not (rule == str(prot) or str(prot).startswith(rule + "/")), rule
            assert not rule.startswith(str(prot) + "/"), rule
    # Reads still reach the rest of the system.
    assert "/etc" in spec["read"] or any(r.startswith("/etc") for r in spec["read"])


def test_a_symlink_into_the_state_dir_gets_no_rule(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    (t["home"] / "shortcut").symlink_to(t["state"])
    (t["home"] / "up").symlink_to(t["home"] / ".local")  # above it: carved at its target
    (t["home"] / "loop").symlink_to(t["home"])
    spec = landlock.plan([str(t["home"])], [str(t["state"])])
    rules = spec["read"] + spec["write"]
    assert str(t["state"]) not in rules
    assert str(t["home"] / ".local") not in rules
    assert str(t["home"] / ".local" / "share") in spec["write"]


def test_a_grant_inside_a_protected_location_is_granted(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    store = t["state"] / "scripted"
    store.mkdir()
    spec = landlock.plan([str(store)], [str(t["state"])])
    assert str(store) in spec["write"]
    assert str(t["state"] / "journal") not in spec["read"] + spec["write"]


def test_too_wide_a_carved_level_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = _tree(tmp_path)
    for i in range(20):
        (t["home"] / f"f{i}").write_text("")
    monkeypatch.setattr(landlock, "MAX_RULES", 10)
    with pytest.raises(landlock.PlanError, match="more than 10 rules"):
        landlock.plan([str(t["home"])], [str(t["state"])], read=())


def _run_confined(spec: dict[str, object], argv: list[str]) -> subprocess.CompletedProcess[str]:
    # As the daemon does (serve/isolation/sandbox.py): a plan too large for one argv string
    # travels in a file. The plan's size follows the entries beside each carved level, and
    # /tmp on a test machine holds thousands.
    with tempfile.TemporaryDirectory() as d:
        if len(json.dumps(spec)) > INLINE_SPEC_BYTES:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            spec = {"rules_file": path}
        wrapped = Confinement(landlock=spec).wrap(argv)
        return subprocess.run(wrapped, capture_output=True, text=True, timeout=60)


def _sandboxed(spec: dict[str, object], script: str) -> subprocess.CompletedProcess[str]:
    return _run_confined(spec, [sys.executable, "-I", "-S", "-c", script])


PROBE = """
import errno, json, os, sys
out = {}
def probe(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
a = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
"""


@needs_landlock
def test_a_sandboxed_child_is_denied_the_protected_locations(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    spec = landlock.plan(
        [str(t["home"]), str(t["ws"])],
        [str(t["state"]), str(t["other"])],
        extra_write=["/dev/null"],
    )
    state, other, home, ws = t["state"], t["other"], t["home"], t["ws"]
    script = (
        PROBE
        + f"""
probe("list_state", lambda: os.listdir({str(state)!r}))
probe("read_journal", lambda: open({str(state / "journal" / "s1.jsonl")!r}).read())
probe("write_state", lambda: open({str(state / "planted")!r}, "w").close())
probe("read_other", lambda: open({str(other / "code.py")!r}).read())
probe("write_other", lambda: open({str(other / "evil")!r}, "w").close())
probe("write_outside", lambda: open({str(t["root"] / "outside")!r}, "w").close())
probe("write_etc", lambda: open("/etc/acp-serve-sandbox-test", "w").close())
probe("new_in_home", lambda: open({str(home / "new")!r}, "w").close())
probe("write_ws", lambda: open({str(ws / "ok.txt")!r}, "w").write("x"))
probe("mkdir_ws", lambda: os.makedirs({str(ws / "a" / "b")!r}))
probe("write_home_dir", lambda: open({str(home / ".qwen" / "session.json")!r}, "w").close())
probe("read_etc", lambda: open("/etc/passwd").read())
probe("dev_null", lambda: open("/dev/null", "w").write("x"))
print(json.dumps(out))
"""
    )
    r = _sandboxed(spec, script)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    denied = [
        "list_state",
        "read_journal",
        "write_state",
        "read_other",
        "write_other",
        "write_outside",
        "write_etc",
        "new_in_home",
    ]
    assert {k: got[k] for k in denied} == dict.fromkeys(denied, "EACCES")
    allowed = ["write_ws", "mkdir_ws", "write_home_dir", "read_etc", "dev_null"]
    assert {k: got[k] for k in allowed} == dict.fromkeys(allowed, "ok")
    assert not (state / "planted").exists() and not (other / "evil").exists()


@needs_landlock
def test_the_sandbox_is_inherited_by_what_the_child_starts(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    spec = landlock.plan([str(t["ws"])], [str(t["state"])])
    journal = t["state"] / "journal" / "s1.jsonl"
    r = _run_confined(spec, ["sh", "-c", f"sh -c 'cat {journal}'"])
    assert r.returncode != 0
    assert "Permission denied" in r.stderr
    assert "secret" not in r.stdout


def test_a_sandbox_that_cannot_be_applied_refuses_to_start(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    bad = {"read": [], "write": [], "bogus": True}
    # A rule on a path the wrapper cannot open as itself is not skipped silently: a
    # non-ENOENT failure (here: the sandbox module's own error for a bad rule) is fatal.
    bad["write"] = ["/dev/null\x00"]
    argv = Confinement(landlock=bad).wrap(["sh", "-c", f"touch {marker}"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_CONFINE_FAILED
    assert "cannot apply the sandbox" in r.stderr
    assert not marker.exists()


@needs_landlock
def test_a_large_plan_travels_in_a_file(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    spec = landlock.plan([str(t["ws"])], [str(t["state"])])
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(spec))
    journal = t["state"] / "journal" / "s1.jsonl"
    argv = Confinement(landlock={"rules_file": str(rules)}).wrap(
        ["sh", "-c", f"cat {journal}; touch {t['ws']}/ok"]
    )
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert "Permission denied" in r.stderr and "secret" not in r.stdout
    assert (t["ws"] / "ok").exists()
