"""The installed package: typed, documented, and its examples run."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import exec_server
import exec_server.blocking
import exec_server.errors

from .conftest import Server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_wheel_carries_its_types() -> None:
    here = Path(exec_server.__file__).parent
    assert (here / "py.typed").exists()
    assert (here / "_native.pyi").exists()
    assert exec_server.__version__


def test_every_public_name_is_documented() -> None:
    for module in (exec_server, exec_server.blocking, exec_server.errors):
        for name in module.__all__:
            obj = getattr(module, name)
            assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not callable(member) and not isinstance(member, property):
                        continue
                    assert inspect.getdoc(member), f"{name}.{attr} has no docstring"


@pytest.mark.parametrize(
    "example, expected",
    [
        ("run_command.py", "exit 3: stdout=b'hello\\n'"),
        ("stream.py", "step 3"),
        ("pty.py", "hello world"),
        ("transfer.py", "apple\nfig\npear"),
        ("blocking.py", "exit 0"),
        ("cancellation.py", "killedRunning 137"),
    ],
)
def test_examples_run(example: str, expected: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / example)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout, out.stdout


LEFT_RUNNING = """
import asyncio, sys
from exec_server import Environment

async def main():
    env = Environment.connect(sys.argv[1]) if len(sys.argv) > 1 else Environment.local()
    procs = [await env.start(["sh", "-c", "while :; do seq 1 500; done"]) for _ in range(6)]
    async def read(p):
        async for _ in p:
            pass
    for p in procs:
        asyncio.ensure_future(read(p))
    await asyncio.sleep(0.1)   # returns with the readers and their native reads running

asyncio.run(main())
"""


@pytest.mark.parametrize("where", ["embedded", "spawned"])
def test_exit_with_reads_in_flight_is_clean(where: str, server: "Server") -> None:
    args = [sys.executable, "-c", LEFT_RUNNING] + ([server.url] if where == "spawned" else [])
    for _ in range(3):
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr
