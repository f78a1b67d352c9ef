// rlf.js drives rate-limiter-flexible for benchmarks/compare, on Redis
// (RateLimiterRedis on one ioredis connection, which pipelines: it writes
// each command at once and matches replies in order) or on PostgreSQL
// (RateLimiterPostgres on a pg Pool of as many connections as callers):
//
//   node rlf.js redis HOST PORT PREFIX
//   node rlf.js postgres URL SCHEMA PREFIX
//
// It reads one JSON request per line on stdin and answers one JSON line on
// stdout:
//
//   {"op":"run","scenario":"hot","name":"hot-8","points":1e9,"duration":3600,
//    "keys":1,"uniform":false,"conc":8,"ms":50,"prime":false,"table":""}
//     -> {"n":..,"admitted":..,"elapsed_ns":..,"buckets":[[b,count],..]}
//
// A run makes decisions from conc concurrent loops for ms milliseconds;
// latencies go into the histogram buckets of benchmarks/internal/harness
// (64 per power of two). A limiter is made once per name and kept;
// "prime" exhausts its key first. Keys are drawn uniformly at random when
// "uniform" is set, and visited round robin otherwise. On PostgreSQL,
// "table" names the limiter's table in SCHEMA, which the caller has made
// with the library's columns (LOGGED or UNLOGGED as it measures), and the
// limiter's pool opens conc connections before its first run.
// {"op":"release","name":..} ends a limiter and its pool;
// {"op":"close"} deletes the Redis keys, ends every pool and exits.
'use strict';
const readline = require('readline');
const { RateLimiterRedis, RateLimiterPostgres } = require('rate-limiter-flexible');

const [store, ...args] = process.argv.slice(2);
let redis = null;
let pgURL = '', schema = '', prefix = '';
if (store === 'redis') {
  const Redis = require('ioredis');
  const [host, port] = args;
  prefix = args[2];
  redis = new Redis({ host, port: Number(port), enableOfflineQueue: true, lazyConnect: false });
} else if (store === 'postgres') {
  [pgURL, schema, prefix] = args;
} else {
  process.stderr.write('rlf.js: the first argument is redis or postgres\n');
  process.exit(2);
}
const limiters = new Map(); // name -> {limiter, pool}

function bucket(ns) {
  if (ns < 64) return Math.max(ns, 0);
  const len = 32 - Math.clz32(ns); // ns < 2^32 (4.3 s)
  const e = len - 7;
  return 64 + e * 64 + (ns >>> e) - 64;
}

function keyOf(req, w, i) {
  if (req.keys === 1) return req.scenario === 'denied' ? 'blocked' : 'hot';
  if (req.uniform) return 'client-' + Math.floor(Math.random() * req.keys);
  return 'client-' + ((w * 7919 + i) % req.keys);
}

async function openPool(conc) {
  const { Pool } = require('pg');
  const pool = new Pool({ connectionString: pgURL, max: conc });
  const conns = [];
  for (let i = 0; i < conc; i++) conns.push(await pool.connect());
  for (const c of conns) c.release();
  return pool;
}

async function limiterFor(req) {
  const known = limiters.get(req.name);
  if (known) return known.limiter;
  const opts = { keyPrefix: prefix + req.name, points: req.points, duration: req.duration };
  let l, pool = null;
  if (redis) {
    l = new RateLimiterRedis({ storeClient: redis, ...opts });
  } else {
    pool = await openPool(req.conc);
    l = new RateLimiterPostgres({ storeClient: pool, storeType: 'pool', schemaName: schema, tableName: req.table, tableCreated: true, ...opts });
  }
  limiters.set(req.name, { limiter: l, pool });
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

async function release(name) {
  const known = limiters.get(name);
  limiters.delete(name);
  if (known && known.pool) await known.pool.end();
}

async function closeAll() {
  for (const name of [...limiters.keys()]) await release(name);
  if (!redis) return;
  const stream = redis.scanStream({ match: prefix + '*', count: 1000 });
  for await (const keys of stream) {
    if (keys.length) await redis.del(...keys);
  }
  await redis.quit();
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
      if (req.op === 'release') {
        await release(req.name);
        process.stdout.write('{}\n');
        return;
      }
      process.stdout.write(JSON.stringify(await run(req)) + '\n');
    } catch (e) {
      process.stdout.write(JSON.stringify({ error: String(e && e.stack || e) }) + '\n');
    }
  });
});
