"""Decide in Python which destinations a process's managed network proxy lets through.

The server asks (``network/policyRequest``) for every destination its rules
leave open; the answer is this coroutine's: ``True`` allows, ``False``
denies. (Whether a process runs behind the proxy is part of its start;
this example only shows the policy's shape.)
"""

import asyncio

from exec_server import Environment, NetworkRequest

ALLOWED = {"pypi.org", "files.pythonhosted.org"}


async def decide(request: NetworkRequest) -> bool:
    return request.host in ALLOWED


async def main(url: str) -> None:
    async with Environment.connect(url, network_policy=decide) as env:
        print((await env.info())["capabilities"])


if __name__ == "__main__":
    import sys

    asyncio.run(main(sys.argv[1]))
