// rlf.js drives rate-limiter-flexible's RateLimiterRedis (on one ioredis
// connection, which pipelines: it writes each command at once and matches
// replies in order) for benchmarks/compare. It reads one JSON request per
// line on stdin and answers one JSON line on stdout:
//
//   {"op":"run","scenario":"hot","name":"hot-8","points":1e9,"duration":3600,
//    "keys":1,"conc":8,"ms":50,"prime":false}
//     -> {"n":..,"admitted":..,"elapsed_ns":..,"buckets":[[b,count],..]}
//
// A run makes decisions from conc concurrent loops for ms milliseconds;
// latencies go into the histogram buckets of benchmarks/internal/harness
// (64 per power of two). A limiter is made once per name and kept;
// "prime" exhausts its key first. {"op":"close"} deletes the keys and exits.
'use strict';
const readline = require('readline');
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [host, port, prefix] = process.argv.slice(2);
const client = new Redis({ host, port: Number(port), enableOfflineQueue: true, lazyConnect: false });
const limiters = new Map();

function bucket(ns) {
  if (ns < 64) return Math.max(ns, 0);
  const len = 32 - Math.clz32(ns); // ns < 2^32 (4.3 s)
  const e = len - 7;
  return 64 + e * 64 + (ns >>> e) - 64;
}

function keyOf(req, w, i) {
  if (req.keys === 1) return req.scenario === 'denied' ? 'blocked' : 'hot';
  return 'client-' + ((w * 7919 + i) % req.keys);
}

async function limiterFor(req) {
  let l = limiters.get(req.name);
  if (l) return l;
  l = new RateLimiterRedis({ storeClient: client, keyPrefix: prefix + req.name, points: req.points, duration: req.duration });
  limiters.set(req.name, l);
  if (req.prime) {
    for (let i = 0; i < 2; i++) await decide(l, keyOf(req, 0, 0));
  }
  return l;
}

async function decide(l, key) {
  try {
    await l.consume(key, 1);
    return true;
  } catch (e) {
    if (e instanceof Error) throw e;
    return false; // a RateLimiterRes: denied
  }
}

async function run(req) {
  const l = await limiterFor(req);
  const hist = new Map();
  let n = 0, admitted = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(req.ms) * 1000000n;
  async function loop(w) {
    let t0 = process.hrtime.bigint();
    for (let i = 0; t0 < end; i++) {
      const ok = await decide(l, keyOf(req, w, i));
      const t1 = process.hrtime.bigint();
      const b = bucket(Math.min(Number(t1 - t0), 0xffffffff));
      hist.set(b, (hist.get(b) || 0) + 1);
      n++;
      if (ok) admitted++;
      t0 = t1;
    }
  }
  const loops = [];
  for (let w = 0; w < req.conc; w++) loops.push(loop(w));
  await Promise.all(loops);
  const elapsed = process.hrtime.bigint() - start;
  return { n, admitted, elapsed_ns: Number(elapsed), buckets: [...hist.entries()] };
}

async function closeAll() {
  const stream = client.scanStream({ match: prefix + '*', count: 1000 });
  for await (const keys of stream) {
    if (keys.length) await client.del(...keys);
  }
  await client.quit();
}

const rl = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
rl.on('line', (line) => {
  queue = queue.then(async () => {
    const req = JSON.parse(line);
    try {
      if (req.op === 'close') {
        await closeAll();
        process.stdout.write('{}\n');
        process.exit(0);
      }
      process.stdout.write(JSON.stringify(await run(req)) + '\n');
    } catch (e) {
      process.stdout.write(JSON.stringify({ error: String(e && e.stack || e) }) + '\n');
    }
  });
});
