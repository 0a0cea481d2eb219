"""The peer: DBOS doing the same job on the same Postgres. N workflows each wait in
recv() for one message; send() delivers them; timed until every workflow completed.

    python -m bench.dbos_peer DATABASE_URL N     (prints the elapsed seconds as JSON)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from dbos import DBOS, DBOSConfig


@DBOS.workflow()
async def waiter() -> str:
    message = await DBOS.recv_async("completion", timeout_seconds=600)
    return str(message)


async def main(url: str, count: int) -> None:
    config: DBOSConfig = {
        "name": f"bench-{uuid.uuid4().hex[:6]}",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        handles = [await DBOS.start_workflow_async(waiter) for _ in range(count)]
        started = time.perf_counter()
        await asyncio.gather(
            *(DBOS.send_async(h.workflow_id, {"ok": True}, "completion") for h in handles)
        )
        results = await asyncio.gather(*(h.get_result() for h in handles))
        elapsed = time.perf_counter() - started
        assert len(results) == count
    finally:
        DBOS.destroy()
    print(json.dumps({"count": count, "seconds": elapsed}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
