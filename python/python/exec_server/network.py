"""Managed network: deciding, in Python, the destinations a process's proxy
asks about (``network/policyRequest``)."""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any, Awaitable, Callable, NamedTuple, Optional, Tuple, Union

_log = logging.getLogger("exec_server")

__all__ = ["NetworkRequest"]


class NetworkRequest(NamedTuple):
    """One destination the server's proxy asks about.

    ``host`` and ``port`` name it; ``protocol`` is how the process asked
    (``"http"``, ``"https_connect"``, ``"socks5_tcp"``...); ``method`` is the
    HTTP method when the server says it (it may not); ``process_id`` is the
    process that asked; ``raw`` is the whole request as the server sent it.

    The policy answers ``True`` (allow) or ``False`` (deny), or one of the
    words ``"allow"``, ``"deny"``, ``"ask"`` (treated as blocked), optionally
    as ``(word, reason)``. It may be an ``async def`` or a plain function.
    An exception or any other answer is a deny, logged as a warning on the
    ``exec_server`` logger. The server waits for the answer at most the
    command's ``ask_timeout`` plus a 5 s transport margin, then denies."""

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

    def __init__(self, decide: Callable[[NetworkRequest], Union[Answer, Awaitable[Answer]]]) -> None:
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
        try:
            answer = self._decide(request)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception:
            _log.warning("network policy failed for %s; denied", request.host, exc_info=True)
            return ("deny", "the client's network policy failed")
        if answer is True:
            return "allow"
        if answer is False:
            return ("deny", "denied by the client's policy")
        word = answer[0] if isinstance(answer, tuple) and answer else answer
        if word in ("allow", "deny", "ask"):
            return answer
        _log.warning("network policy answered %r for %s; denied", answer, request.host)
        return ("deny", "the client's network policy answered nonsense")
