"""An environment behind a registry, reached through its end-to-end encrypted relay.

    CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN=... python remote.py http://127.0.0.1:PORT devbox

The harness token comes from the environment (or ``token_file=``), never
from an argument, so it stays out of shell history and logs.
"""

import asyncio
import sys

from exec_server import Environment, errors


async def main(registry: str, environment_id: str) -> int:
    try:
        async with Environment.remote(registry, environment_id) as env:
            code, out, _ = await env.run(["uname", "-a"])
            print(out.decode(), end="")
            return code
    except errors.Unauthorized:
        print("the registry refused the token", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
