"""Decide in Python which destinations a process may reach.

The process runs behind a managed network proxy (its HTTP_PROXY and friends
point there). Destinations the proxy's rules leave open are asked of this
coroutine: ``True`` allows, ``False`` denies (the proxy answers 403).

    python network_policy.py ws://127.0.0.1:8765
"""

import asyncio
import sys

from exec_server import Command, Environment, NetworkRequest, managed_network

ALLOWED = {"pypi.org", "files.pythonhosted.org"}


async def decide(request: NetworkRequest) -> bool:
    print(f"asked about {request.host}:{request.port} ({request.protocol})")
    return request.host in ALLOWED


async def main(url: str) -> None:
    async with Environment.connect(url, network_policy=decide) as env:
        cmd = Command(["sh", "-c", "curl -s -o /dev/null -w '%{http_code}\\n' https://example.com/"])
        done = await env.run(cmd.network_proxy(managed_network(deny=["*.internal"])))
        print("curl said", done.stdout.decode().strip())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
