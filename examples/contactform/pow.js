// Proof-of-work solver for the contact form, run as a Web Worker so that the
// page's main thread stays free for input while it hashes.
//
// It finds a counter n such that SHA-256(challenge + "." + n) starts with
// `difficulty` zero bits, as ratekit's signedwindow verifies. It hashes with
// a synchronous SHA-256 written here, not crypto.subtle: one promise per hash
// costs far more than the hash itself, and crypto.subtle is missing outside a
// secure context (a page served over plain HTTP from a non-loopback address).
//
// Counters are 16 digits, hi * 10^8 + lo with hi from 10^7 upwards (no
// leading zero; at most 2^53-1, as the server requires). With the 55-character
// challenge, challenge + "." + hi fills the first 64-byte block exactly, so its
// compression is done once per hi and each try costs one compression.
//
// Messages in: {challenge, difficulty, hi, stride} starts solving (hi is the
// first high half to try, stride the step between high halves, so that
// several workers split the space); {bench: "sync" | "subtle", ms} measures
// hashes per second for ms milliseconds. Messages out: {tries} every 2^16
// tries, then {solution, tries}; or {bench, rate} for a measurement.
"use strict";

const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const IV = new Int32Array([
  0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
]);
const W = new Int32Array(64);

// compress runs the SHA-256 compression function on the 16 big-endian words
// of m starting at off, from state st into out (which may be st).
function compress(st, m, off, out) {
  for (let i = 0; i < 16; i++) W[i] = m[off + i];
  for (let i = 16; i < 64; i++) {
    const x = W[i - 15], y = W[i - 2];
    const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
    const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
    W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
  }
  let a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
  for (let i = 0; i < 64; i++) {
    const s1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const t1 = (h + s1 + ((e & f) ^ (~e & g)) + K[i] + W[i]) | 0;
    const s0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const t2 = (s0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
    h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  out[0] = (st[0] + a) | 0; out[1] = (st[1] + b) | 0; out[2] = (st[2] + c) | 0; out[3] = (st[3] + d) | 0;
  out[4] = (st[4] + e) | 0; out[5] = (st[5] + f) | 0; out[6] = (st[6] + g) | 0; out[7] = (st[7] + h) | 0;
}

function ascii(s) {
  const b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i) & 0x7f;
  return b;
}

// A Hasher hashes prefix + 8 decimal digits, with the full blocks of prefix
// compressed once.
class Hasher {
  constructor(prefix) {
    const p = ascii(prefix);
    const full = p.length >> 6, tail = p.length & 63;
    this.mid = Int32Array.from(IV);
    const words = new Int32Array(16);
    for (let blk = 0; blk < full; blk++) {
      for (let i = 0; i < 16; i++) {
        const o = blk * 64 + i * 4;
        words[i] = (p[o] << 24) | (p[o + 1] << 16) | (p[o + 2] << 8) | p[o + 3];
      }
      compress(this.mid, words, 0, this.mid);
    }
    // The remaining bytes: the tail of prefix, 8 digits, 0x80, zero bytes
    // and the message length in bits (a 64-bit big-endian number).
    const blocks = (tail + 8 + 9 + 63) >> 6;
    this.bytes = new Uint8Array(blocks * 64);
    this.bytes.set(p.subarray(full * 64));
    this.at = tail;
    this.bytes[tail + 8] = 0x80;
    const bitLen = (p.length + 8) * 8;
    const end = this.bytes.length;
    this.bytes[end - 4] = bitLen >>> 24; this.bytes[end - 3] = bitLen >>> 16;
    this.bytes[end - 2] = bitLen >>> 8; this.bytes[end - 1] = bitLen;
    this.words = new Int32Array(blocks * 16);
    this.fill(0, this.words.length);
    // Only the words that hold the digits change from one try to the next.
    this.w0 = tail >> 2;
    this.w1 = (tail + 8 + 3) >> 2;
    this.st = new Int32Array(8);
  }

  fill(from, to) {
    const b = this.bytes, w = this.words;
    for (let i = from; i < to; i++) {
      const o = i * 4;
      w[i] = (b[o] << 24) | (b[o + 1] << 16) | (b[o + 2] << 8) | b[o + 3];
    }
  }

  // first returns the first 32 bits of SHA-256(prefix + the 8 digits of lo).
  first(lo) {
    const b = this.bytes, at = this.at;
    for (let i = 7; i >= 0; i--) { b[at + i] = 48 + (lo % 10); lo = (lo / 10) | 0; }
    this.fill(this.w0, this.w1);
    const w = this.words;
    compress(this.mid, w, 0, this.st);
    for (let off = 16; off < w.length; off += 16) compress(this.st, w, off, this.st);
    return this.st[0];
  }
}

const LO = 100000000; // 10^8: tries per high half
const HI_MAX = 90071992; // (2^53-1) / 10^8, rounded down
const REPORT = 1 << 16;

function solve(challenge, difficulty, hi, stride) {
  let tries = 0;
  for (; hi < HI_MAX; hi += stride) {
    const h = new Hasher(challenge + "." + hi);
    for (let lo = 0; lo < LO; lo++) {
      if (Math.clz32(h.first(lo)) >= difficulty) {
        postMessage({ solution: challenge + "." + hi + String(lo).padStart(8, "0"), tries: tries + 1 });
        return;
      }
      if (++tries % REPORT === 0) postMessage({ tries });
    }
  }
  postMessage({ error: "no solution" });
}

function benchSync(ms) {
  const h = new Hasher("x".repeat(55) + ".10000000");
  const t0 = performance.now();
  let n = 0, sink = 0;
  do {
    for (let i = 0; i < 4096; i++) sink ^= h.first(n + i);
    n += 4096;
  } while (performance.now() - t0 < ms);
  return { rate: n / ((performance.now() - t0) / 1000), sink };
}

// benchSubtle measures crypto.subtle.digest in batches of 1024 concurrent
// digests, the fastest way to use it for many small inputs.
async function benchSubtle(ms) {
  if (!self.crypto || !crypto.subtle) return { rate: 0, error: "crypto.subtle is not available" };
  const enc = new TextEncoder(), prefix = "x".repeat(55) + ".";
  const t0 = performance.now();
  let n = 0;
  do {
    const batch = [];
    for (let i = 0; i < 1024; i++) batch.push(crypto.subtle.digest("SHA-256", enc.encode(prefix + (1e15 + n + i))));
    await Promise.all(batch);
    n += 1024;
  } while (performance.now() - t0 < ms);
  return { rate: n / ((performance.now() - t0) / 1000) };
}

onmessage = async (ev) => {
  const m = ev.data;
  if (m.bench === "sync") postMessage({ bench: "sync", ...benchSync(m.ms) });
  else if (m.bench === "subtle") postMessage({ bench: "subtle", ...(await benchSubtle(m.ms)) });
  else solve(m.challenge, m.difficulty, m.hi, m.stride);
};
