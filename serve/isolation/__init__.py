"""Isolation of agent children (resource limits, the file sandbox: ``sandbox.py``)."""
