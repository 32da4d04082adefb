// charts.test.mjs — the chart's data path in plain Node (web/charts.js):
// series that rewind when a resumed run replays steps, running y ranges,
// and the per-pixel-column aggregates that are extended frame by frame,
// which must always equal a fresh computation over all the points.
import test from 'node:test';
import assert from 'node:assert/strict';
import {Chart, Series} from '../../web/charts.js';

const decimate = (s, x0, sx, width) => Chart.prototype.decimate.call(null, s, x0, sx, width);

// The aggregates computed from scratch, for comparison.
function naive(s, x0, sx, width) {
  const cols = new Map();
  for (let i = 0; i < s.n; i++) {
    const c = Math.min(width, Math.max(0, Math.floor((s.xs[i] - x0) * sx)));
    const y = s.ys[i];
    const a = cols.get(c);
    if (!a) cols.set(c, {first: y, min: y, max: y, last: y});
    else { a.min = Math.min(a.min, y); a.max = Math.max(a.max, y); a.last = y; }
  }
  return cols;
}

function same(c, want) {
  let seen = 0;
  for (let col = 0; col < c.has.length; col++) {
    if (!c.has[col]) { assert.ok(!want.has(col), `column ${col} missing`); continue; }
    seen++;
    assert.deepEqual({first: c.first[col], min: c.min[col], max: c.max[col], last: c.last[col]}, want.get(col),
      `column ${col}`);
  }
  assert.equal(seen, want.size);
}

test('a replayed step truncates the tail; the y range follows', () => {
  const s = new Series('loss', '#000');
  for (let step = 1; step <= 30; step++) s.push(step, 10 - step / 10);
  assert.equal(s.n, 30);
  assert.equal(s.yMax, 9.9);
  s.push(21, 100); // resumed from the checkpoint at step 20
  assert.equal(s.n, 21);
  assert.deepEqual(Array.from(s.xs.slice(0, s.n)).slice(-2), [20, 21]);
  assert.equal(s.yMax, 100);
  assert.equal(s.yMin, 8);
  s.push(21, 5); // the same step again: the newer value wins
  assert.equal(s.n, 21);
  assert.equal(s.ys[20], 5);
  assert.equal(s.yMax, 9.9);
});

test('incremental column aggregates equal a fresh computation, across growth and rewinds', () => {
  const s = new Series('loss', '#000');
  const width = 317, x0 = 0, sx = width / 5000;
  let seed = 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  let step = 0;
  for (let round = 0; round < 40; round++) {
    const k = 1 + Math.floor(rnd() * 200);
    for (let i = 0; i < k; i++) s.push(++step, Math.sin(step / 50) + rnd());
    if (round % 9 === 8) { step = Math.max(1, step - 120); s.push(step, -3); } // a resume
    same(decimate(s, x0, sx, width), naive(s, x0, sx, width));
  }
  // A resume followed by more new points than it removed, between frames.
  const before = s.n;
  step -= 300;
  for (let i = 0; i < 700; i++) s.push(++step, -10 - rnd());
  assert.ok(s.n > before);
  same(decimate(s, x0, sx, width), naive(s, x0, sx, width));
  // A new width (a resize) starts over and still agrees.
  same(decimate(s, x0, 200 / 5000, 200), naive(s, x0, 200 / 5000, 200));
});

test('the series grows past its initial capacity', () => {
  const s = new Series('x', '#000');
  for (let i = 0; i < 100000; i++) s.push(i, i % 7);
  assert.equal(s.n, 100000);
  assert.equal(s.xs[99999], 99999);
  assert.equal(s.yMin, 0);
  assert.equal(s.yMax, 6);
});
