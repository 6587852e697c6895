// The graphile-worker side of tests/benches/peers.rs: the 4-stage no-op pipeline (stage k's
// task adds stage k+1's job; stage4 appends `id registered_ms done_ms` to $DONE_FILE), and the
// bench's enqueuer. Installed by scripts/bench-peers; run as
//   node graphile.mjs worker    (run(): concurrency 2, every other option graphile's default)
//   node graphile.mjs enqueue   (migrates, then reads commands on stdin, answers "ok" to each)
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { makeWorkerUtils, run } from "graphile-worker";

const connectionString = process.env.DATABASE_URL;
const doneFile = process.env.DONE_FILE;

function stage(next) {
  return async (payload, helpers) => {
    if (next) {
      await helpers.addJob(next, payload);
    } else {
      // One write(2) with O_APPEND per line: lines from the 4 processes never interleave.
      appendFileSync(doneFile, `${payload.id} ${payload.t0} ${Date.now()}\n`);
    }
  };
}

const taskList = {
  stage1: stage("stage2"),
  stage2: stage("stage3"),
  stage3: stage("stage4"),
  stage4: stage(null),
};

async function worker() {
  const runner = await run({ connectionString, concurrency: 2, taskList });
  await runner.promise;
}

// Commands: `backlog FIRST COUNT` (ids FIRST.., all in bulk; registration time per job is
// when its chunk is added) and `one ID` (one job, registered now). Answers "ok" to each.
async function enqueue() {
  const utils = await makeWorkerUtils({ connectionString });
  await utils.migrate();
  process.stdout.write("ready\n");
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [command, a, b] = line.trim().split(" ");
    if (command === "backlog") {
      const first = Number(a);
      const count = Number(b);
      for (let start = 0; start < count; start += 500) {
        const t0 = Date.now();
        const specs = [];
        for (let i = start; i < Math.min(count, start + 500); i++) {
          specs.push({ identifier: "stage1", payload: { id: first + i, t0 } });
        }
        await utils.addJobs(specs);
      }
    } else if (command === "one") {
      await utils.addJob("stage1", { id: Number(a), t0: Date.now() });
    } else {
      throw new Error(`unknown command ${line}`);
    }
    process.stdout.write("ok\n");
  }
  await utils.release();
}

const mode = process.argv[2];
if (mode === "worker") {
  await worker();
} else if (mode === "enqueue") {
  await enqueue();
} else {
  console.error("usage: node graphile.mjs worker|enqueue");
  process.exit(2);
}
