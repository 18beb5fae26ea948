"""serve package."""
