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
