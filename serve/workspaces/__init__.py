"""Everything that is per workspace, in three packages and one actor (no HTTP here).

* :mod:`.files`     the file system boundary: a ``Workspace`` (canonical root, safe opens
                    beneath it, per-path writer locks), the file functions behind the HTTP
                    file routes and ACP ``fs/*``, and the Host's ``WorkspaceSet``;
* :mod:`.state`     workspace-level state beside the files: which vendor extensions an
                    agent kind answers, the memory file (``QWEN.md``), ``.qwen/settings.json``
                    edits and reload, one shell command;
* :mod:`.runtimes`  one agent pool and one session registry per workspace, behind one
                    facade (it composes ``serve.sessions`` and ``serve.agents``);
* :mod:`.hub`       the WorkspaceHub actor: workspace-wide events fanned out to every live
                    session of the workspace.

The four are separate layers: ``files`` and ``state`` sit below the sessions (a session
reads files through ``files``), ``runtimes`` sits above them. The dependency rules
(``tests/test_architecture.py``) therefore count each as its own package.
"""
