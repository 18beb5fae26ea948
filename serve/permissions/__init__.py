"""Permissions: multi-client permission voting, Host capability grants, approval policy.

Layering (each module pure, no I/O, no clock):

* ``config``   frozen msgspec Structs for the ``policy:``/``capabilities:``/``approval:``
               config sections and the YAML loader (``ConfigError`` names the bad key);
* ``grants``   capability grant resolution (exact keys, prefix wildcards, exact-only
               secrets, workspace scope);
* ``approval`` effect classification (fs read/write, terminal guard) and ``decide``
               (monotonic ``auto < prompt < deny``), policy fingerprints;
* ``cache``    ``always_allow_for_session`` cache and in-flight decision sharing;
* ``voting``   the multi-client mediation state machine (4 policies, timeouts, cancels).

The PermissionMediator actor (timers, I/O, event publishing) wraps these elsewhere.
"""
