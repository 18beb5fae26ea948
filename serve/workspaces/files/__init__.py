"""The workspace file system boundary shared by the HTTP file routes and ACP ``fs/*``.

Layering (no HTTP, no ACP, no trio here; callers run the file functions in worker threads
with ``trio.to_thread.run_sync``). :mod:`serve.workspaces.hub` (the WorkspaceHub actor that
fans workspace-wide events out to sessions) lives beside this package:

* :mod:`.errors`    ``WorkspaceFsError`` and its kinds (their wire status: ``serve.errors``);
* :mod:`.textio`    pure text decoding/encoding (BOM, encoding, line endings, binary);
* :mod:`.gitignore` the ignore matcher behind ``matchedIgnore`` and glob translation;
* :mod:`.locks`     per-path ``threading.Lock`` table for writers;
* :mod:`.paths`     ``Workspace``: canonical root, ``resolve``, safe opens beneath the root;
* :mod:`.results`   the wire response Structs, hashes and argument checks;
* :mod:`.listing`   stat, list_dir, glob;
* :mod:`.contents`  read_text, read_bytes, write_text, overwrite_text, edit_text;
* :mod:`.set`       ``WorkspaceSet``: the Host's one ``Workspace`` per root (imported as
                    ``serve.workspaces.files.set``).
"""

from serve.workspaces.files.contents import (
    edit_text,
    overwrite_text,
    read_bytes,
    read_text,
    write_text,
)
from serve.workspaces.files.errors import ErrorKind, WorkspaceFsError
from serve.workspaces.files.listing import glob, list_dir, stat
from serve.workspaces.files.paths import ResolvedPath, Workspace
from serve.workspaces.files.results import (
    EditResult,
    GlobResult,
    ListEntry,
    ListResult,
    ReadBytesResult,
    ReadTextResult,
    StatResult,
    WriteResult,
    hash_bytes,
    is_content_hash,
)

__all__ = [
    "EditResult",
    "ErrorKind",
    "GlobResult",
    "ListEntry",
    "ListResult",
    "ReadBytesResult",
    "ReadTextResult",
    "ResolvedPath",
    "StatResult",
    "Workspace",
    "WorkspaceFsError",
    "WriteResult",
    "edit_text",
    "glob",
    "hash_bytes",
    "is_content_hash",
    "list_dir",
    "overwrite_text",
    "read_bytes",
    "read_text",
    "stat",
    "write_text",
]
