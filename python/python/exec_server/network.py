"""Managed network: deciding, in Python, the destinations a process's proxy
asks about (``network/policyRequest``)."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, NamedTuple, Optional, Tuple, Union

__all__ = ["NetworkRequest"]


class NetworkRequest(NamedTuple):
    """One destination the server's proxy asks about.

    ``host`` and ``port`` name it; ``protocol`` is ``"http"``, ``"https"``
    (a CONNECT), ``"socks5Tcp"``...; ``method`` is the HTTP method when
    known; ``process_id`` is the process that asked; ``raw`` is the whole
    request as the server sent it."""

    host: str
    port: Optional[int]
    protocol: Optional[str]
    method: Optional[str]
    process_id: Optional[str]
    raw: Any


Answer = Union[bool, str, Tuple[str, Optional[str]]]


class _Policy:
    """What the native client calls: ``decide(json_text)`` resolving to
    ``"allow"``, ``"deny"``, ``"ask"`` or ``(word, reason)``."""

    def __init__(self, decide: Callable[[NetworkRequest], Awaitable[Answer]]) -> None:
        self._decide = decide

    async def decide(self, text: str) -> Union[str, Tuple[str, Optional[str]]]:
        raw = json.loads(text)
        req = raw.get("request", {}) if isinstance(raw, dict) else {}
        request = NetworkRequest(
            host=str(req.get("host", "")),
            port=req.get("port"),
            protocol=req.get("protocol"),
            method=req.get("method"),
            process_id=raw.get("processId") if isinstance(raw, dict) else None,
            raw=raw,
        )
        answer = await self._decide(request)
        if answer is True:
            return "allow"
        if answer is False:
            return ("deny", "denied by the client's policy")
        return answer
