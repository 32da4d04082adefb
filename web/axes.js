// axes.js — tick positions and labels for the charts: 1-2-5 steps on a
// linear axis, decades (with 2 and 5 between them when few decades show)
// on a log axis, whole seconds/minutes/hours on clock and elapsed-time
// axes. Pure functions of the range, so Node tests them directly.

// Ticks at 1, 2, 5 × 10^k covering [lo, hi] with about `count` of them.
export function niceTicks(lo, hi, count) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  const step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * mag;
  const out = [];
  // k·step, not a running sum: 2.1, 2.2, 2.3 rather than 2.3000000000000003.
  for (let k = Math.ceil(lo / step); k * step <= hi + step * 1e-9; k++) {
    const v = Number((k * step).toPrecision(12));
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

// Ticks for a log axis over the data range [lo, hi] (both > 0), about
// `count` of them: powers of ten, every k-th decade when many show; with
// under three decade ticks in range, 2× and 5× each decade join; a range
// inside one such gap (a loss between 2.1 and 2.6) gets linear 1-2-5 ticks,
// which the log axis then places unevenly, as it should.
export function logTicks(lo, hi, count = 5) {
  if (!(lo > 0) || !(hi >= lo)) return [];
  const eps = 1e-9;
  const inRange = (v) => v >= lo * (1 - eps) && v <= hi * (1 + eps);
  const d0 = Math.floor(Math.log10(lo)), d1 = Math.ceil(Math.log10(hi));
  const every = Math.max(1, Math.ceil((d1 - d0) / Math.max(1, count)));
  const pow10 = (d) => Number(Math.pow(10, d).toPrecision(12)); // 1e-5, not 0.000009999
  let out = [];
  for (let d = Math.ceil(d0 / every) * every; d <= d1; d += every) if (inRange(pow10(d))) out.push(pow10(d));
  if (out.length < 3) {
    out = [];
    for (let d = d0; d <= d1; d++) {
      for (const m of [1, 2, 5]) {
        const v = Number((m * Math.pow(10, d)).toPrecision(12));
        if (inRange(v)) out.push(v);
      }
    }
  }
  if (out.length < 2) out = niceTicks(lo, hi, Math.max(2, Math.min(count, 4))).filter((v) => v > 0 && inRange(v));
  return out;
}

// Time ticks at whole seconds/minutes/hours: x in ms (since the epoch on a
// clock axis, since the run started on an elapsed one).
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
  7200, 10800, 21600, 43200, 86400].map((s) => s * 1000);
export function timeTicks(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count);
  const step = TIME_STEPS.find((s) => s >= raw) || TIME_STEPS[TIME_STEPS.length - 1];
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(v);
  return out;
}

export function fmtTick(v) {
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) return v.toExponential(a < 1e-3 && Number(v.toExponential(0)) === v ? 0 : 1);
  if (a >= 1000) return (v / 1000).toFixed(a >= 1e4 ? 0 : 1) + 'k';
  return String(Number(v.toPrecision(3)));
}

export function fmtClock(ms) {
  return new Date(ms).toTimeString().slice(0, 8);
}

// Elapsed time on an axis: "0", "45s", "2m", "1m30s", "1h", "2h15m".
export function fmtElapsed(ms) {
  let s = Math.round(ms / 1000);
  if (s === 0) return '0';
  const neg = s < 0 ? '-' : '';
  s = Math.abs(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (h) return `${neg}${h}h${m ? m + 'm' : ''}`;
  if (m) return `${neg}${m}m${sec ? sec + 's' : ''}`;
  return `${neg}${sec}s`;
}
