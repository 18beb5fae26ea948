"""Many daemons, one shared journal: who serves a request for a session.

Theory of operation
-------------------
With ``--journal-url`` every daemon of a cluster journals into one PostgreSQL database
(:mod:`serve.journal.pg`); each session has one owner at a time, the holder of its fenced
lease, and each live daemon holds a liveness lock there. Any daemon answers any request:
behind a plain Service a request for a session lands on a random daemon, which asks the
journal who owns it (:meth:`serve.journal.SharedJournal.owner_of`) when the session is not
live on it, and :func:`route` decides:

* **local**: the session is live here, nothing is journaled of it, or it ended (a closed
  session is loaded only on purpose, ``POST /session/:id/load``, as on one daemon);
* **forward**: another live daemon owns it: the request is proxied to the owner's
  ``--advertise-url`` (``serve.http.forward``; an event stream is streamed through);
* **take over**: its owner is gone (the lease expired: a frozen or partitioned daemon; or
  its liveness lock went with its process: a killed one): this daemon restores the session
  from the journal as ``POST /session/:id/load`` does (as the caller, who must have a role
  on it), which takes the lease with a larger epoch (the old owner's writes are refused by
  the database from then on), then serves the request;
* **unreachable**: a request already forwarded once found the session owned by a third
  daemon (ownership moved meanwhile) or its owner did not answer: ``503`` with
  ``Retry-After``; the client retries and the next try finds the new owner.

A request is forwarded at most once (``X-Acp-Serve-Forwarded-By``), so two daemons with
different views of the lease never bounce one between them. Nothing here knows HTTP:
``serve.http.forward`` applies the decision.
"""

from serve.cluster.decide import Route, route

__all__ = ["Route", "route"]
