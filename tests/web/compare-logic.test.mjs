// compare-logic.test.mjs — web.compare_logic: the pure parts of the compare
// view, the charts' smoothing and log axis, and the page clock, in plain
// Node: EMA smoothing (web/smooth.js), log-scale ticks (web/axes.js), the
// pixel-column downsampler (web/downsample.js), ids from the address, a
// job's events as points by step and by time, the spec differences
// (web/compare-data.js), ETAs that count down (web/clock.js), and the one
// format of metrics (web/util.js fmtMetric).
import test from 'node:test';
import assert from 'node:assert/strict';
import {ema, emaInto, clampWeight} from '../../web/smooth.js';
import {logTicks, niceTicks, fmtElapsed, fmtTick} from '../../web/axes.js';
import {columns, vertexCount} from '../../web/downsample.js';
import {parseIds, seriesOf, specDiff, flatten, METRICS, originOf, xOf} from '../../web/compare-data.js';
import {etaDeadline, etaText} from '../../web/clock.js';

const close = (a, b, tol = 1e-12) => Math.abs(a - b) <= tol * Math.max(1, Math.abs(b));

test('EMA: weight 0 is the raw series; the first value is kept (debiased)', () => {
  const ys = [4, 3, 5, 1, 2];
  assert.deepEqual(ema(ys, 0), ys);
  const s = ema(ys, 0.6);
  assert.equal(s[0], 4);
  // By hand: acc = 0.6·acc + 0.4·y, divided by 1 - 0.6^(i+1).
  let acc = 0;
  ys.forEach((y, i) => {
    acc = 0.6 * acc + 0.4 * y;
    assert.ok(close(s[i], acc / (1 - Math.pow(0.6, i + 1))), `point ${i}`);
  });
  // A constant stays constant at any weight (no pull toward zero).
  for (const w of [0.5, 0.9, 0.99]) for (const v of ema(Array(50).fill(2.5), w)) assert.ok(close(v, 2.5));
});

test('EMA: smoothed values stay in the raw range and damp noise', () => {
  let seed = 11;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const ys = Array.from({length: 2000}, (_, i) => 3 * Math.exp(-i / 500) + (rnd() - 0.5));
  const lo = Math.min(...ys), hi = Math.max(...ys);
  const sm = ema(ys, 0.95);
  for (const v of sm) assert.ok(v >= lo - 1e-12 && v <= hi + 1e-12);
  const rough = (a) => a.slice(1).reduce((s, v, i) => s + Math.abs(v - a[i]), 0);
  assert.ok(rough(sm) < rough(ys) / 5, 'smoothing did not smooth');
});

test('EMA: smoothing piece by piece equals smoothing at once, bit for bit', () => {
  const ys = Float64Array.from({length: 1000}, (_, i) => Math.sin(i / 7) + i / 100);
  const whole = ema(Array.from(ys), 0.9);
  const acc = new Float64Array(1000), out = new Float64Array(1000);
  let done = 0;
  for (const n of [1, 2, 17, 400, 401, 999, 1000]) done = emaInto(ys, n, 0.9, acc, out, done);
  assert.deepEqual(Array.from(out), whole);
  // A cut back (a replayed step) resumes from the cut.
  ys[500] = 42;
  emaInto(ys, 1000, 0.9, acc, out, 500);
  assert.deepEqual(Array.from(out), ema(Array.from(ys), 0.9));
});

test('the slider weight is clamped to [0, 0.99]', () => {
  assert.equal(clampWeight('0.6'), 0.6);
  assert.equal(clampWeight(1), 0.99);
  assert.equal(clampWeight(-1), 0);
  assert.equal(clampWeight('x'), 0);
  assert.equal(clampWeight(null), 0);
});

test('log ticks: decades, 2 and 5 between few decades, linear ticks inside one gap', () => {
  assert.deepEqual(logTicks(1e-6, 1e-2, 5), [1e-6, 1e-5, 1e-4, 1e-3, 1e-2]);
  assert.deepEqual(logTicks(0.3, 40, 5), [0.5, 1, 2, 5, 10, 20]);
  // Twelve decades, about four ticks: every third decade.
  assert.deepEqual(logTicks(1e-9, 1e3, 4), [1e-9, 1e-6, 1e-3, 1, 1e3]);
  // A loss between 2.1 and 2.6: no 1-2-5 value inside, linear ticks.
  const t = logTicks(2.1, 2.6, 5);
  assert.ok(t.length >= 2 && t.every((v) => v >= 2.1 && v <= 2.6), t.join(' '));
  // Every tick is inside the range, ascending, and positive.
  for (const [lo, hi] of [[3e-5, 2e-3], [0.9, 1.1], [1, 1], [7, 7000]]) {
    const ts = logTicks(lo, hi, 5);
    assert.ok(ts.length >= 1, `${lo}..${hi}`);
    ts.forEach((v, i) => { assert.ok(v > 0 && v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)); if (i) assert.ok(v > ts[i - 1]); });
  }
  assert.deepEqual(logTicks(0, 10), []);
  assert.deepEqual(logTicks(-1, 10), []);
  assert.equal(fmtTick(1e-5), '1e-5');
  assert.deepEqual(niceTicks(0, 10, 5), [0, 2, 4, 6, 8, 10]);
});

test('elapsed-time labels', () => {
  assert.deepEqual([0, 45e3, 120e3, 90e3, 3600e3, 8100e3].map(fmtElapsed), ['0', '45s', '2m', '1m30s', '1h', '2h15m']);
});

test('downsampler: 10 runs × 10,000 points draw O(width) vertices and keep every extreme', () => {
  const width = 600;
  let vertices = 0;
  for (let run = 0; run < 10; run++) {
    const n = 10000;
    const xs = Float64Array.from({length: n}, (_, i) => i + 1);
    const ys = Float64Array.from({length: n}, (_, i) => 4 * Math.exp(-i / (1000 + run * 100)) + Math.sin(i));
    ys[1234 + run] = 50 + run; // a spike must survive
    const c = columns(null, xs, ys, n, 0, 0, width / n, width);
    assert.ok(c.count <= width + 1);
    const v = vertexCount(c);
    assert.ok(v <= 4 * (width + 1), `${v} vertices`);
    vertices += v;
    let max = -Infinity, min = Infinity;
    for (let col = 0; col < c.has.length; col++) if (c.has[col]) { max = Math.max(max, c.max[col]); min = Math.min(min, c.min[col]); }
    assert.equal(max, Math.max(...ys));
    assert.equal(min, Math.min(...ys));
    // Extended in pieces it equals one pass.
    let inc = null;
    for (const k of [1, 10, 4999, 5000, 10000]) inc = columns(inc, xs, ys, k, 0, 0, width / n, width);
    assert.deepEqual([inc.first, inc.min, inc.max, inc.last, inc.has], [c.first, c.min, c.max, c.last, c.has]);
  }
  assert.ok(vertices <= 10 * 4 * (width + 1));
  // 100,000 points, at most ~24,000 vertices on screen.
  console.log(`# 100000 points -> ${vertices} vertices at width ${width}`);
});

test('ids from the address: integers once each, the rest reported', () => {
  const q = (s) => new URLSearchParams(s);
  assert.deepEqual(parseIds(q('ids=3,1,3')), {ids: [3, 1], bad: []});
  assert.deepEqual(parseIds(q('ids=4, x ,0,-2,5')), {ids: [4, 5], bad: ['x', '0', '-2']});
  assert.deepEqual(parseIds(q('')), {ids: [], bad: []});
  assert.deepEqual(parseIds(q('ids=')), {ids: [], bad: []});
  assert.deepEqual(parseIds(q('ids=7')), {ids: [7], bad: []});
});

const ev = (seq, type, ts, data) => ({seq, type, ts: new Date(ts).toISOString(), data});

test('series by step: a resumed run replays steps and the newer values win', () => {
  const t0 = Date.UTC(2026, 11, 3, 1, 0, 0);
  const evs = [
    ev(1, 'state', t0, {to: 'running'}),
    ev(2, 'metric', t0 + 1000, {step: 1, loss: 4, lr: 0.1, grad_norm: 2}),
    ev(3, 'metric', t0 + 2000, {step: 2, loss: 3, lr: 0.1}),
    ev(4, 'eval', t0 + 2500, {step: 2, loss: 3.5}),
    ev(5, 'metric', t0 + 3000, {step: 3, loss: 2.5, lr: 0.1}),
    // the engine restarted from the checkpoint at step 1
    ev(6, 'metric', t0 + 9000, {step: 2, loss: 2.9, lr: 0.1}),
    ev(7, 'metric', t0 + 10000, {step: 3, loss: 2.4, lr: 0.1, tokens_per_s: 100}),
  ];
  const loss = METRICS.find((m) => m.key === 'loss');
  assert.deepEqual(seriesOf(evs, loss, 'step', NaN), {xs: [1, 2, 3], ys: [4, 2.9, 2.4]});
  const evalM = METRICS.find((m) => m.key === 'eval');
  assert.deepEqual(seriesOf(evs, evalM, 'step', NaN), {xs: [2], ys: [3.5]});
  // Events that do not carry a value are left out, not drawn as zero.
  const gn = METRICS.find((m) => m.key === 'gn');
  assert.deepEqual(seriesOf(evs, gn, 'step', NaN), {xs: [1], ys: [2]});
  const tps = METRICS.find((m) => m.key === 'tps');
  assert.deepEqual(seriesOf(evs, tps, 'step', NaN), {xs: [3], ys: [100]});

  // By time: since the job started; the redone steps come later, kept.
  const origin = originOf({started_at: new Date(t0).toISOString()}, evs);
  assert.equal(origin, t0);
  assert.deepEqual(seriesOf(evs, loss, 'time', origin), {xs: [1000, 2000, 3000, 9000, 10000], ys: [4, 3, 2.5, 2.9, 2.4]});
  // Without started_at the first event's time is the origin.
  assert.equal(originOf({started_at: null}, evs.slice(1)), t0 + 1000);
  assert.ok(Number.isNaN(xOf(ev(1, 'metric', t0, {step: 1}), 'time', NaN)));
});

test('series of two jobs align on the same step and time axes', () => {
  const t0 = Date.UTC(2026, 11, 3, 1, 0, 0), t1 = t0 + 3600e3; // started an hour apart
  const a = [1, 2, 3].map((s) => ev(s, 'metric', t0 + s * 1000, {step: s * 10, loss: 5 - s}));
  const b = [1, 2, 3].map((s) => ev(s, 'metric', t1 + s * 2000, {step: s * 10, loss: 6 - s}));
  const loss = METRICS[0];
  assert.deepEqual(seriesOf(a, loss, 'step', t0).xs, seriesOf(b, loss, 'step', t1).xs);
  assert.deepEqual(seriesOf(a, loss, 'time', t0).xs, [1000, 2000, 3000]);
  assert.deepEqual(seriesOf(b, loss, 'time', t1).xs, [2000, 4000, 6000]);
  // Two metrics in the same millisecond are two points by time, not a replay.
  const same = [ev(1, 'metric', t0 + 5, {step: 1, loss: 3}), ev(2, 'metric', t0 + 5, {step: 2, loss: 2})];
  assert.deepEqual(seriesOf(same, loss, 'time', t0), {xs: [5, 5], ys: [3, 2]});
  assert.deepEqual(seriesOf(same, loss, 'step', t0), {xs: [1, 2], ys: [3, 2]});
});

test('spec differences: flattened keys, only those that differ, missing keys said', () => {
  assert.deepEqual([...flatten({a: {b: 1, c: [1, 2]}, d: 'x', e: {}})], [['a.b', 1], ['a.c', [1, 2]], ['d', 'x'], ['e', {}]]);
  const base = {name: 'a', model: {path: '/m'}, hyperparameters: {lr: 0.001, max_steps: 100, batch_size: 8},
    lora: {r: 8, targets: ['q', 'v']}, tags: ['x']};
  const b = structuredClone(base); b.name = 'b'; b.hyperparameters.lr = 0.0003; b.lora.targets = ['q', 'k', 'v'];
  const c = structuredClone(base); c.name = 'c'; delete c.tags; c.hyperparameters.warmup_steps = 10;
  const rows = specDiff([base, b, c]);
  assert.deepEqual(rows.map((r) => r.key), ['hyperparameters.lr', 'hyperparameters.warmup_steps', 'lora.targets', 'name', 'tags']);
  const row = (k) => rows.find((r) => r.key === k).values.map((v) => v.text);
  assert.deepEqual(row('hyperparameters.lr'), ['0.001', '0.0003', '0.001']);
  assert.deepEqual(row('lora.targets'), ['["q","v"]', '["q","k","v"]', '["q","v"]']);
  assert.deepEqual(row('name'), ['a', 'b', 'c']);
  assert.deepEqual(row('tags'), ['["x"]', '["x"]', '(not set)']);
  assert.deepEqual(rows.find((r) => r.key === 'tags').values.map((v) => v.present), [true, true, false]);
  assert.deepEqual(row('hyperparameters.warmup_steps'), ['(not set)', '(not set)', '10']);
  // Identical specs: nothing differs. A string "1" differs from a number 1.
  assert.deepEqual(specDiff([base, structuredClone(base)]), []);
  assert.deepEqual(specDiff([{v: 1}, {v: '1'}]).map((r) => r.key), ['v']);
});

test('ETAs count down from the read, and only a running job has one', () => {
  const read = 1_000_000;
  const running = {state: 'running', progress: {eta_s: 90}};
  const d = etaDeadline(running, read);
  assert.equal(d, read + 90000);
  assert.equal(etaText(d, read), '1m 30s');
  assert.equal(etaText(d, read + 31000), '59s');
  assert.equal(etaText(d, read + 200000), '0s'); // overdue: never negative
  for (const state of ['paused', 'stopping', 'queued', 'starting', 'succeeded', 'failed', 'cancelled']) {
    assert.equal(etaDeadline({state, progress: {eta_s: 90}}, read), null, state);
  }
  assert.equal(etaDeadline({state: 'running', progress: {eta_s: null}}, read), null);
  // A stalled job's pace says nothing about its end: no ETA.
  assert.equal(etaDeadline({state: 'running', stalled_at: '2026-12-02T10:00:00Z', progress: {eta_s: 90}}, read), null);
  assert.equal(etaDeadline({state: 'running'}, read), null);
  assert.equal(etaText(null, read), '–');
});

test('a chart series keeps its smoothed copy current across appends and replayed steps', async () => {
  const {Series} = await import('../../web/charts.js');
  const s = new Series('loss', '#000');
  const cur = () => Array.from(s.ys.subarray(0, s.n));
  for (let i = 1; i <= 300; i++) s.push(i, 3 + Math.sin(i));
  assert.deepEqual(Array.from(s.smoothed(0.8).subarray(0, s.n)), ema(cur(), 0.8));
  for (let i = 301; i <= 700; i++) s.push(i, 2 + Math.cos(i)); // grows past its capacity
  assert.deepEqual(Array.from(s.smoothed(0.8).subarray(0, s.n)), ema(cur(), 0.8));
  s.push(250, 9); // a resume from step 249: the tail is replaced
  s.push(251, 8);
  assert.equal(s.n, 251);
  assert.deepEqual(Array.from(s.smoothed(0.8).subarray(0, s.n)), ema(cur(), 0.8));
  assert.deepEqual(Array.from(s.smoothed(0.3).subarray(0, s.n)), ema(cur(), 0.3)); // a new weight
  s.clear();
  s.push(1, 5);
  assert.deepEqual(Array.from(s.smoothed(0.3).subarray(0, s.n)), [5]);
});

test('metrics read in four significant digits, scientific below 1e-3, never 0.0000', async () => {
  const {fmtMetric, fmtLoss} = await import('../../web/util.js');
  const want = [[0, '0'], [2.11723, '2.117'], [0.1, '0.1000'], [0.001733, '0.001733'],
    [0.00099996, '1.000e-3'], [7.59e-4, '7.590e-4'], [1e-9, '1.000e-9'], [3.5e-12, '3.500e-12'],
    [0.99996, '1.000'], [999.94, '999.9'], [999.96, '1000'], [12345.6, '12346'], [-0.5, '-0.5000'],
    [NaN, '–'], [undefined, '–']];
  // The same table as the CLI's clifmt_metric (tests/cli/test_cli_fmt.c).
  for (const [v, s] of want) assert.equal(fmtMetric(v), s, `fmtMetric(${v})`);
  assert.equal(fmtLoss, fmtMetric);
});
