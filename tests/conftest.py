"""Shared pytest configuration (pytest-trio in trio_mode; see pyproject)."""
