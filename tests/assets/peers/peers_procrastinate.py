"""The Procrastinate side of tests/benches/peers.rs: the 4-stage no-op pipeline (stage k's task
defers stage k+1's job; stage4 appends `id registered_ms done_ms` to $DONE_FILE) and the bench's
enqueuer. Installed by scripts/bench-peers; the workers are the `procrastinate` CLI:
    procrastinate --app=peers_procrastinate.app worker --concurrency=2
    python peers_procrastinate.py enqueue   (applies the schema, then reads commands on stdin)
"""

import asyncio
import os
import sys
import time

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["DATABASE_URL"]))


def finish(id, t0):
    # One write(2) on an O_APPEND descriptor per line: the 4 processes' lines never interleave.
    fd = os.open(os.environ["DONE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{id} {t0} {int(time.time() * 1000)}\n".encode())
    finally:
        os.close(fd)


@app.task(name="stage1")
async def stage1(id, t0):
    await stage2.defer_async(id=id, t0=t0)


@app.task(name="stage2")
async def stage2(id, t0):
    await stage3.defer_async(id=id, t0=t0)


@app.task(name="stage3")
async def stage3(id, t0):
    await stage4.defer_async(id=id, t0=t0)


@app.task(name="stage4")
async def stage4(id, t0):
    finish(id, t0)


async def enqueue():
    """Commands on stdin: `backlog FIRST COUNT` (bulk, in chunks of 500) and `one ID`; answers
    "ok" to each."""
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command, *args = line.split()
            if command == "backlog":
                first, count = int(args[0]), int(args[1])
                for start in range(0, count, 500):
                    t0 = int(time.time() * 1000)
                    kwargs = [{"id": first + i, "t0": t0} for i in range(start, min(count, start + 500))]
                    await stage1.batch_defer_async(*kwargs)
            elif command == "one":
                await stage1.defer_async(id=int(args[0]), t0=int(time.time() * 1000))
            else:
                raise SystemExit(f"unknown command {line!r}")
            print("ok", flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["enqueue"]:
    asyncio.run(enqueue())
