"""The Celery side of tests/benches/peers.rs: the 4-stage no-op pipeline on a Redis broker (stage
k's task sends stage k+1's with `.delay`; stage4 appends `id registered_ms done_ms` to
$DONE_FILE; no result backend) and the bench's enqueuer. Installed by scripts/bench-peers; run as
    celery -A peers_celery worker --concurrency=2 -n wN@%h   (prefork pool, Celery's defaults)
    python peers_celery.py enqueue   (reads commands on stdin)
"""

import os
import sys
import time

from celery import Celery

app = Celery("peers", broker=os.environ["REDIS_URL"])
app.conf.task_ignore_result = True
# Silences the start-up warning; Celery 6 makes this the default.
app.conf.broker_connection_retry_on_startup = True


def finish(id, t0):
    # One write(2) on an O_APPEND descriptor per line: the workers' lines never interleave.
    fd = os.open(os.environ["DONE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{id} {t0} {int(time.time() * 1000)}\n".encode())
    finally:
        os.close(fd)


@app.task(name="stage1")
def stage1(id, t0):
    stage2.delay(id, t0)


@app.task(name="stage2")
def stage2(id, t0):
    stage3.delay(id, t0)


@app.task(name="stage3")
def stage3(id, t0):
    stage4.delay(id, t0)


@app.task(name="stage4")
def stage4(id, t0):
    finish(id, t0)


def enqueue():
    """Commands on stdin: `backlog FIRST COUNT` and `one ID`; answers "ok" to each."""
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "backlog":
            first, count = int(args[0]), int(args[1])
            t0 = int(time.time() * 1000)
            with app.producer_or_acquire() as producer:
                for i in range(count):
                    stage1.apply_async((first + i, t0), producer=producer)
        elif command == "one":
            stage1.delay(int(args[0]), int(time.time() * 1000))
        else:
            raise SystemExit(f"unknown command {line!r}")
        print("ok", flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["enqueue"]:
    enqueue()
