"""The session core: one MCP session as a synchronous state machine.

Events in (`visor.core.events`), actions out, no sockets, no futures, no
event loop: `SessionCore` (visor/core/session.py) owns the table of pending
requests and every routing rule; `PolicyChecks` (visor/core/checks.py) judges
what the core hands it and answers with effects. A transport (the stdio relay
in visor/relay/) performs the actions and feeds back what happened.
"""
