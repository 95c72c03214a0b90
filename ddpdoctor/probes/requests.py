"""The table of requests a rank's heartbeat thread answers (``{"type": T, ...}`` lines from the monitor): probes
register a handler per type here, and the heartbeat probe looks them up, so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# (the heartbeat probe, the request as the monitor sent it: raw JSON) -> the reply to send, or None
RequestHandler = Callable[[Any, dict[str, Any]], "Mapping[str, object] | None"]
REQUEST_HANDLERS: dict[str, RequestHandler] = {}


def register_request(kind: str, handler: RequestHandler) -> None:
    """Answer the monitor's requests of type ``kind`` with ``handler(probe, request)`` (a dict to send, or None)."""
    REQUEST_HANDLERS[kind] = handler
