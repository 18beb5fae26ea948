"""Workspace-level state: vendor extensions, the memory file, settings, reload, shell (no HTTP).

* :mod:`.agent_ext`     which vendor extension methods (``qwen/status/...``,
                        ``qwen/control/...``) an agent kind answers: a known-agent table
                        corrected by observed ``-32601`` answers (pure);
* :mod:`.memory_file`   the workspace memory file (``QWEN.md``): the append composition
                        (pure) and the read / write through the workspace boundary;
* :mod:`.settings_file` ``<workspace>/.qwen/settings.json``: the strict-JSON read and the
                        one read-modify-write (one lock table, one retry loop), used by
                        the tool toggle and the dotted-key edits (blocking);
* :mod:`.settings_edit` dotted-key edits of ``<workspace>/.qwen/settings.json``: key
                        syntax, type checks of known keys, secret redaction and restore,
                        key diffs (pure) and the update through :mod:`.settings_file`;
* :mod:`.reload`        the "last loaded" settings snapshot per workspace and the
                        re-read of the daemon config's grants (the ``workspace-state``
                        service);
* :mod:`.shell_run`     one ``/bin/sh -c`` command in its own process group, bounded
                        output, timeout, group kill and reap.

Blocking functions are documented as such; callers run them in worker threads.
"""
