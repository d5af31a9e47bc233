# expect: ExceptionGroup: unhandled errors in a TaskGroup
# expect: ConnectionError: price server eu-2 refused the connection
"""Nested asyncio TaskGroups: the failure arrives as an ExceptionGroup inside an ExceptionGroup."""

import asyncio

REGIONS = {"us": ["us-1", "us-2"], "eu": ["eu-1", "eu-2", "eu-3"]}


async def fetch_prices(server: str) -> list[float]:
    await asyncio.sleep(0)
    if server == "eu-2":
        raise ConnectionError(f"price server {server} refused the connection")
    return [1.0, 2.0, 3.0]


async def fetch_region(servers: list[str]) -> None:
    async with asyncio.TaskGroup() as group:
        for server in servers:
            group.create_task(fetch_prices(server))


async def main() -> None:
    async with asyncio.TaskGroup() as group:
        for servers in REGIONS.values():
            group.create_task(fetch_region(servers))


if __name__ == "__main__":
    asyncio.run(main())
