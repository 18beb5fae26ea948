"""The scripted reference agent (``python -m acp.agents.scripted [--state-dir DIR]``).

See :mod:`acp.agents.scripted.agent` for its behaviour, :mod:`.script` for the prompt
language and :mod:`.store` for its on-disk sessions.
"""
