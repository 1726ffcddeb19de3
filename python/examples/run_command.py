"""Run a command and collect its output, like subprocess.run."""

import asyncio

from exec_server import Environment


async def main() -> None:
    async with Environment.local() as env:
        code, out, err = await env.run(["sh", "-c", "echo hello; echo oops >&2; exit 3"])
        print(f"exit {code}: stdout={out!r} stderr={err!r}")


if __name__ == "__main__":
    asyncio.run(main())
