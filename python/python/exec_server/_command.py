"""``Command``: a process to start, built up step by step (immutable)."""

from __future__ import annotations

import copy
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Command", "managed_network"]


class Command:
    """A process to start on an environment.

    Defaults: working directory ``/`` on the server's host; an environment of
    only what :meth:`env` sets (plus a usual ``PATH``) unless
    :meth:`inherit_env` asks for the server's; pipes, not a PTY; stdin
    ``/dev/null`` unless :meth:`stdin` is called; the process left running
    when its ``Process`` object is collected unless :meth:`killed_on_drop`.

    Each builder method returns a new ``Command`` (a ``Command`` never
    changes, so one can be shared and reused)::

        cmd = Command(["make", "test"]).cwd("/src").env("CI", "1").timeout(600)

    Durations are seconds (``float``); sizes are bytes.
    """

    argv: Tuple[str, ...]
    working_dir: str
    environment: Mapping[str, str]
    inherits_env: bool
    pty_size: Optional[Tuple[int, int]]
    stdin_piped: bool
    process_id: Optional[str]
    wall_timeout: Optional[float]
    idle: Optional[float]
    output_cap: Optional[int]
    memory_bytes: Optional[int]
    tasks: Optional[int]
    cpu: Optional[int]
    kill_on_drop: bool
    proxy_config: Optional[Mapping[str, object]]

    def __init__(self, argv: Union[str, Sequence[str]]) -> None:
        """``argv``: the program and its arguments (a string is the program alone)."""
        args = (argv,) if isinstance(argv, str) else tuple(argv)
        if not args:
            raise ValueError("argv must not be empty")
        self.argv = args
        self.working_dir = "/"
        self.environment = {}
        self.inherits_env = False
        self.pty_size = None
        self.stdin_piped = False
        self.process_id = None
        self.wall_timeout = None
        self.idle = None
        self.output_cap = None
        self.memory_bytes = None
        self.tasks = None
        self.cpu = None
        self.kill_on_drop = False
        self.proxy_config = None

    def __repr__(self) -> str:
        return f"Command({list(self.argv)!r}, cwd={self.working_dir!r})"

    def _with(self, **changes: object) -> "Command":
        made = copy.copy(self)
        for name, value in changes.items():
            setattr(made, name, value)
        return made

    def arg(self, *args: str) -> "Command":
        """Appends arguments."""
        return self._with(argv=self.argv + tuple(args))

    def cwd(self, path: "Union[str, os.PathLike[str]]") -> "Command":
        """The working directory: an absolute path on the server's host."""
        return self._with(working_dir=os.fspath(path))

    def env(self, name: str, value: str) -> "Command":
        """Sets one variable of the child's environment."""
        merged: Dict[str, str] = dict(self.environment)
        merged[name] = value
        return self._with(environment=merged)

    def envs(self, variables: Mapping[str, str]) -> "Command":
        """Sets several variables."""
        merged: Dict[str, str] = dict(self.environment)
        merged.update(variables)
        return self._with(environment=merged)

    def inherit_env(self) -> "Command":
        """Starts from the server's environment minus secrets (names with KEY,
        SECRET or TOKEN); :meth:`env` values override it."""
        return self._with(inherits_env=True)

    def clean_env(self) -> "Command":
        """Only the variables :meth:`env` sets (the default)."""
        return self._with(inherits_env=False, environment={})

    def pty(self, rows: int = 24, cols: int = 80) -> "Command":
        """Runs on a pseudo-terminal of ``rows`` × ``cols`` (stderr merged into
        stdout; stdin writable)."""
        return self._with(pty_size=(rows, cols), stdin_piped=True)

    def stdin(self) -> "Command":
        """Makes stdin writable (``Process.write``, ``Process.close_stdin``)."""
        return self._with(stdin_piped=True)

    def id(self, process_id: str) -> "Command":
        """The process id (unique in the session); made up when not given."""
        return self._with(process_id=process_id)

    def timeout(self, seconds: float) -> "Command":
        """Ends the process (and its tree) after ``seconds`` of wall time."""
        return self._with(wall_timeout=seconds)

    def idle_timeout(self, seconds: float) -> "Command":
        """Ends the process after ``seconds`` without output."""
        return self._with(idle=seconds)

    def max_output(self, nbytes: int) -> "Command":
        """Ends the process once it wrote ``nbytes`` of output."""
        return self._with(output_cap=nbytes)

    def memory(self, nbytes: int) -> "Command":
        """Caps the tree's memory (the server must have the cgroup for it)."""
        return self._with(memory_bytes=nbytes)

    def max_tasks(self, tasks: int) -> "Command":
        """Caps the tree's number of processes and threads."""
        return self._with(tasks=tasks)

    def cpu_percent(self, percent: int) -> "Command":
        """Caps the tree's CPU time (100 = one CPU)."""
        return self._with(cpu=percent)

    def killed_on_drop(self, kill: bool = True) -> "Command":
        """Kills the process when its ``Process`` object is collected."""
        return self._with(kill_on_drop=kill)

    def network_proxy(self, config: Mapping[str, object]) -> "Command":
        """Runs the process behind a managed network proxy whose rules are
        ``config`` (the wire's ``networkProxy`` object: ``{"proxy": {...},
        "policyDecisionTimeoutMs": 5000}``, SANDBOX.md §3). Destinations
        its rules leave open are asked of the environment's
        ``network_policy``. See :func:`managed_network` for the usual case."""
        return self._with(proxy_config=dict(config))


def managed_network(
    *,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    ask_timeout: float = 30.0,
    limited: bool = False,
    allow_local: bool = False,
) -> Dict[str, object]:
    """A ``networkProxy`` config for :meth:`Command.network_proxy`: domain
    patterns allowed and denied outright, every other destination asked of
    the environment's ``network_policy`` (given ``ask_timeout`` seconds to
    answer; no answer is a deny). ``limited`` allows only GET, HEAD and
    OPTIONS; ``allow_local`` lets the process reach local addresses."""
    domains: Dict[str, str] = {d: "allow" for d in allow}
    domains.update({d: "deny" for d in deny})
    return {
        "proxy": {
            "enabled": True,
            "mode": "limited" if limited else "full",
            "enableSocks5": False,
            "enableSocks5Udp": False,
            "allowUpstreamProxy": False,
            "dangerouslyAllowAllUnixSockets": False,
            "allowLocalBinding": allow_local,
            "domains": domains,
        },
        "policyDecisionTimeoutMs": int(ask_timeout * 1000),
    }
