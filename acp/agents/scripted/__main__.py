"""Entry point: ``python -m acp.agents.scripted [--state-dir DIR] [--legacy]``."""

import sys

from acp.agents.scripted.agent import main

sys.exit(main())
