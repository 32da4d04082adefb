// compare-data.js — the compare view's pure logic: which ids the address
// names, a job's events as chart points against step or elapsed time, and
// the differences between the jobs' specs. No DOM: Node tests it.

import {Series} from './charts.js';

export const MAX_COMPARE = 10;

// One colour per job, distinct in light and dark palettes.
export const COLORS = ['#2f7ed8', '#e4572e', '#17a589', '#a66cc1', '#f0a202', '#5c6b73', '#c44d8a',
  '#3aa35c', '#8c564b', '#1fb5c9'];

// "?ids=3,1,3,x" -> {ids: [3, 1], bad: ['x']}: positive integers in the
// order given, each once; anything else is reported, not guessed at.
export function parseIds(query) {
  const raw = (query && query.get('ids')) || '';
  const ids = [], bad = [];
  for (const part of raw.split(',').map((p) => p.trim()).filter(Boolean)) {
    if (/^\d+$/.test(part) && Number(part) > 0 && Number.isSafeInteger(Number(part))) {
      if (!ids.includes(Number(part))) ids.push(Number(part));
    } else bad.push(part);
  }
  return {ids, bad};
}

// The metrics the view overlays: the chart, and the value of a metric or
// eval event for it (undefined when the event does not carry it).
// sparse: a series of a few points by nature (a dot per point); smooth:
// false for a schedule that is not noise.
export const METRICS = [
  {key: 'loss', title: 'Loss', from: 'metric', value: (d) => d.loss},
  {key: 'eval', title: 'Eval loss', from: 'eval', value: (d) => d.loss, sparse: true},
  {key: 'lr', title: 'Learning rate', from: 'metric', value: (d) => d.lr, smooth: false},
  {key: 'tps', title: 'Tokens/s', from: 'metric', value: (d) => d.tokens_per_s},
  {key: 'gn', title: 'Grad norm', from: 'metric', value: (d) => d.grad_norm},
];

// Where an event sits on the x axis: its step, or the milliseconds since
// the job's origin (its first start) by the event's timestamp.
export function xOf(ev, mode, origin) {
  if (mode === 'time') {
    const t = Date.parse(ev.ts);
    return Number.isFinite(t) && Number.isFinite(origin) ? t - origin : NaN;
  }
  return ev.data ? ev.data.step : NaN;
}

// The time origin of a job: when it first started (started_at), else its
// first event's time.
export function originOf(job, events) {
  const t = job && Date.parse(job.started_at);
  if (Number.isFinite(t)) return t;
  for (const ev of events || []) {
    const e = Date.parse(ev.ts);
    if (Number.isFinite(e)) return e;
  }
  return NaN;
}

// A job's events (in seq order) as one chart series: the points the chart
// would hold, by the same rules (series.push): against step, a step that
// does not advance (a run resumed from an older checkpoint replays steps)
// cuts the series back and the newer values win, as GET /jobs/{id}/metrics
// reports; against time nothing is replaced, the redone steps come later.
export function seriesOf(events, metric, mode, origin) {
  const s = new Series(metric.key, '#000', mode !== 'time');
  for (const ev of events) {
    if (ev.type !== metric.from || !ev.data) continue;
    const y = metric.value(ev.data), x = xOf(ev, mode, origin);
    if (Number.isFinite(x) && Number.isFinite(y)) s.push(x, y);
  }
  return {xs: Array.from(s.xs.subarray(0, s.n)), ys: Array.from(s.ys.subarray(0, s.n))};
}

// {"a": {"b": 1, "c": [1, 2]}} -> Map {"a.b" => 1, "a.c" => [1, 2]}:
// objects open into dotted keys; arrays and scalars are values.
export function flatten(obj, prefix = '', out = new Map()) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
    if (prefix) out.set(prefix, obj);
    return out;
  }
  const keys = Object.keys(obj);
  if (!keys.length && prefix) out.set(prefix, {});
  for (const k of keys) flatten(obj[k], prefix ? `${prefix}.${k}` : k, out);
  return out;
}

// A flattened value as the table shows it.
export function showValue(v) {
  return typeof v === 'string' ? v : JSON.stringify(v);
}

// The keys whose values differ between the specs (a key missing from some
// spec differs from any value), sorted, each with one cell per spec:
// [{key, values: [{present, text}]}].
export function specDiff(specs) {
  const flat = specs.map((s) => flatten(s || {}));
  const keys = new Set();
  for (const f of flat) for (const k of f.keys()) keys.add(k);
  const rows = [];
  for (const key of [...keys].sort()) {
    // Compared as JSON (the number 1 and the string "1" differ), shown as text.
    const cells = flat.map((f) => (f.has(key) ? {present: true, text: JSON.stringify(f.get(key))} : {present: false, text: null}));
    const first = cells[0];
    if (cells.every((c) => c.present === first.present && c.text === first.text)) continue;
    rows.push({key, values: flat.map((f) => (f.has(key) ? {present: true, text: showValue(f.get(key))}
      : {present: false, text: '(not set)'}))});
  }
  return rows;
}
