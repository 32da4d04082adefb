// smooth.js — exponential moving average for the charts' smoothing slider.
//
// TensorBoard's smoothing, debiased: acc_i = w·acc_{i-1} + (1-w)·y_i from
// acc_{-1} = 0, and the plotted value is acc_i / (1 - w^(i+1)). Dividing by
// the weight of the terms so far keeps the first points at the data instead
// of dragging them toward zero, and every smoothed value is a weighted mean
// of the raw ones, so it never leaves the raw y range (the chart's bounds
// need no second pass). The state is the accumulator alone, kept per point,
// so a series that grows is smoothed only over its new points and one cut
// back by a replayed step resumes from the cut.

// Smooths ys[from..n) into out[] with weight w (0 = raw, up to 0.99),
// reading acc[from-1] and writing acc[]. The chart stores finite values
// only. The debiasing weight is w^(i+1) computed from i each time, so a
// series smoothed piece by piece equals one smoothed at once, bit for bit.
export function emaInto(ys, n, w, acc, out, from = 0) {
  let a = from > 0 ? acc[from - 1] : 0;
  for (let i = from; i < n; i++) {
    a = w * a + (1 - w) * ys[i];
    acc[i] = a;
    const d = 1 - Math.pow(w, i + 1);
    out[i] = d > 0 ? a / d : ys[i];
  }
  return n;
}

// The whole smoothed series of an array (tests, and small series).
export function ema(ys, w) {
  const n = ys.length;
  const out = new Float64Array(n);
  emaInto(ys, n, w, new Float64Array(n), out, 0);
  return Array.from(out);
}

// The slider's value as a weight: a number in [0, 0.99], 0 otherwise.
export function clampWeight(v) {
  const x = Number(v);
  if (!Number.isFinite(x) || x <= 0) return 0;
  return Math.min(0.99, x);
}
