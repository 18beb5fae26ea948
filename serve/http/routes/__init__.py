"""HTTP routes grouped by domain; each module exposes ``blueprint``."""
