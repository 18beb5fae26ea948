"""The runtime: building the daemon's objects, the supervision tree and the process lifecycle."""
