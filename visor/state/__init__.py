"""Session state on Redis/Valkey, for `visor serve --state URL` (issue 17).

- ``redis_store.RedisGroupStore``: the group store's contract (visor/groups/store.py)
  on a Redis database, so every replica of a gateway shares a session's untrusted
  output, taints and approvals.
- ``ledger.SessionLedger``: what else must follow an MCP session from replica to
  replica (its ``initialize``, pins, counted calls, owner).
- ``connection.connect``: the client both use, with short timeouts and no retries.

Nothing here is imported by ``visor run``: the ``redis`` client is the optional
``state`` extra, imported only when a store is made. docs/state.md says what is
stored and how a Redis outage fails closed.
"""
