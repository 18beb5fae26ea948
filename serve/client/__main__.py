"""``python -m serve.client``: the same as ``acp-serve-client``."""

from serve.client.cli import main

raise SystemExit(main())
