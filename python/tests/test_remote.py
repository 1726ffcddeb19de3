"""An environment behind a registry, reached through its relay (Noise)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Tuple

import pytest

from exec_server import Environment, errors


async def _ready(env: Environment) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            await env.run("true")
            return
        except errors.ExecServerError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_run_through_registry_and_relay(
    registry: Tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, token = registry
    monkeypatch.setenv("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", token)
    async with Environment.remote(url, "pybox") as env:
        await _ready(env)
        done = await env.run(["sh", "-c", "seq 1 50000; echo err >&2; exit 6"])
        assert done.exit_code == 6
        assert done.stdout == b"".join(b"%d\n" % i for i in range(1, 50001))
        assert done.stderr == b"err\n"
    # The token may come from a file instead.
    (tmp_path / "token").write_text(token + "\n")
    monkeypatch.delenv("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN")
    async with Environment.remote(url, "pybox", token_file=tmp_path / "token") as env:
        assert (await env.run("true")).exit_code == 0
    # A wrong token is refused, and never shown.
    (tmp_path / "token").write_text("wrong-token")
    env = Environment.remote(url, "pybox", token_file=tmp_path / "token")
    with pytest.raises(errors.ExecServerError) as caught:
        await env.run("true")
    assert "wrong-token" not in str(caught.value)
