// downsample.js — a series reduced to the chart's pixel columns for drawing.
//
// For every column: the first, minimum, maximum and last value of the
// points falling in it. Drawing first→min→max→last per column gives the
// same picture as drawing every point (spikes included) with at most four
// vertices a column, so a frame costs O(width) whatever the number of
// points: ten jobs of 10,000 points each draw as fast as one short run.
//
// The result is kept (in data units, so a new y range or a log axis needs
// no recomputation) and extended by the points appended since it was made;
// it is rebuilt only when the x origin, the scale, the width or the
// series' generation (bumped when points are removed or revalued) changes.

// c: the previous result or null. xs/ys: the points (xs non-decreasing),
// n of them. gen: anything that changes when old points change. x0, sx:
// data x at the left edge and pixels per x unit. width: columns - 1.
export function columns(c, xs, ys, n, gen, x0, sx, width) {
  if (!c || c.x0 !== x0 || c.sx !== sx || c.gen !== gen || c.has.length !== width + 1 || c.done > n) {
    const m = width + 1;
    c = {x0, sx, gen, done: 0, count: 0, has: new Uint8Array(m),
      first: new Float64Array(m), min: new Float64Array(m), max: new Float64Array(m), last: new Float64Array(m)};
  }
  for (let i = c.done; i < n; i++) {
    const col = Math.min(width, Math.max(0, Math.floor((xs[i] - x0) * sx)));
    const y = ys[i];
    if (!c.has[col]) {
      c.has[col] = 1; c.count++;
      c.first[col] = c.min[col] = c.max[col] = c.last[col] = y;
    } else {
      if (y < c.min[col]) c.min[col] = y;
      if (y > c.max[col]) c.max[col] = y;
      c.last[col] = y;
    }
  }
  c.done = n;
  return c;
}

// The vertices a polyline through the columns has (what a frame strokes):
// one per column when it holds a single value, up to four otherwise.
export function vertexCount(c) {
  let v = 0;
  for (let col = 0; col < c.has.length; col++) {
    if (!c.has[col]) continue;
    v += c.min[col] === c.max[col] ? 2 : 4;
  }
  return v;
}
