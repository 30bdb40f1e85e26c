"""One client's servers as a group: what one server's output showed, the taints
one raised and the destinations a human approved, shared with the others.

Every wrapped server is its own ``visor run`` process. Those started by the
same client process form a group (``identity.py``), which keeps a small SQLite
store under ``$VISOR_HOME/groups`` (``store.py``); the session reaches it
through ``index.py``, whose answers are three-valued: ``None`` means the group
could not answer, and the caller asks a human. See docs/groups.md.
"""
