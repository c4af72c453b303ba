// Runs CPU-bound JavaScript under @pyroscope/nodejs (which posts pprof to /ingest), for Kiln's
// e2e tests. Usage: node app.js SERVER_URL APP_NAME SECONDS
// With KILN_AUTH_TOKEN set, the SDK sends it as `Authorization: Bearer`.
'use strict';
const Pyroscope = require('@pyroscope/nodejs');

const [server, appName, seconds] = process.argv.slice(2);

function kilnNodeFib(n) {
  return n < 2 ? n : kilnNodeFib(n - 1) + kilnNodeFib(n - 2);
}

async function main() {
  Pyroscope.init({
    appName,
    serverAddress: server,
    tags: { e2e: 'nodejs' },
    flushIntervalMs: 1000,
    wall: { samplingDurationMs: 1000, samplingIntervalMicros: 10000 },
    ...(process.env.KILN_AUTH_TOKEN ? { authToken: process.env.KILN_AUTH_TOKEN } : {}),
  });
  Pyroscope.start();
  const end = Date.now() + Number(seconds) * 1000;
  while (Date.now() < end) {
    kilnNodeFib(22);
    // Let the profiler's timers run between bursts of work.
    await new Promise((resolve) => setImmediate(resolve));
  }
  await Pyroscope.stop();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
