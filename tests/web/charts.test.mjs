// charts.test.mjs — the chart's data path in plain Node (web/charts.js):
// series that rewind when a resumed run replays steps, running y ranges,
// and the per-pixel-column aggregates that are extended frame by frame,
// which must always equal a fresh computation over all the points.
import test from 'node:test';
import assert from 'node:assert/strict';
import {Chart, Series, stepRange, fallen, NEAR_END, MIN_SMOOTH} from '../../web/charts.js';

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

test('a step axis spans the data; max_steps joins it, marked, only when near', () => {
  // 60 of 10,000 steps: steps 1..60, no marker (not squeezed to the left).
  assert.deepEqual(stepRange(1, 60, 10000), {x0: 1, x1: 60, marker: null});
  // The last 20 % before the end: the axis reaches max_steps, marked.
  assert.deepEqual(stepRange(1, 90, 100), {x0: 1, x1: 100, marker: 100});
  assert.equal(stepRange(1, 1 + 100 / (1 + NEAR_END), 101).marker, 101);
  assert.deepEqual(stepRange(1, 100, 100), {x0: 1, x1: 100, marker: 100});
  // A resumed job's data starts where it is: from its first step seen.
  assert.deepEqual(stepRange(500, 520, null), {x0: 500, x1: 520, marker: null});
  // Long spans: the right edge moves in tenths of the span's decade.
  const r = stepRange(1, 1234, 100000);
  assert.equal(r.x0, 1);
  assert.ok(r.x1 >= 1234 && r.x1 - 1234 < 100, `x1 ${r.x1}`);
  assert.equal(stepRange(1, 1235, 100000).x1, r.x1, 'the edge does not move with every point');
  // One point: a unit wide.
  assert.deepEqual(stepRange(7, 7, null), {x0: 7, x1: 8, marker: null});
});

test('a loss that fell 100x from its first value asks for a log axis', () => {
  const s = new Series('loss', '#000');
  // From the first value: e^((n-1)/10), 100x at step 48.
  for (let step = 1; step <= 47; step++) s.push(step, 4 * Math.exp(-step / 10));
  assert.equal(fallen(s, 100), false);
  s.push(48, 4 * Math.exp(-4.8));
  assert.equal(fallen(s, 100), true);
  const flat = new Series('loss', '#000');
  for (let step = 1; step <= 100; step++) flat.push(step, 0.5 + 3 * Math.exp(-step / 50));
  assert.equal(fallen(flat, 100), false);
});

test('dots only where asked (evals), never on a 60-point training curve; smoothing skips lr and short series', () => {
  const train = new Series('train', '#000'), evals = new Series('eval', '#000');
  for (let i = 1; i <= 60; i++) train.push(i, 1 / i);
  for (let i = 10; i <= 60; i += 10) evals.push(i, 1 / i);
  const chart = (opts) => ({opts, series: [train, evals], smoothing: 0.6});
  const dotted = (opts, s) => Chart.prototype.dotted.call(chart(opts), s);
  const weight = (opts, s) => Chart.prototype.weightFor.call(chart(opts), s);
  assert.equal(dotted({}, train), false);
  assert.equal(dotted({}, evals), false);
  assert.equal(dotted({dots: 'sparse'}, evals), true);
  assert.equal(dotted({dots: (s, i) => i === 1}, train), false);
  assert.equal(dotted({dots: (s, i) => i === 1}, evals), true);
  assert.equal(weight({}, train), 0.6);
  assert.equal(weight({}, evals), 0, `under ${MIN_SMOOTH} points: raw`);
  assert.equal(weight({smooth: false}, train), 0);
});
