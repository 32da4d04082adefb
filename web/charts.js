// charts.js — a small canvas line chart for live training curves.
//
// Points are appended into growable typed arrays and the chart redraws at
// most once per animation frame, however many points arrived. Each series
// is decimated to the canvas's pixel columns (first/min/max/last of every
// column), kept between frames and extended by the new points only, so a
// redraw costs O(width) however many points there are: tens of thousands
// of points stay smooth. Axes get "nice" ticks;
// hovering shows the nearest values. The element's data-points attribute
// holds the number of plotted points (what the browser tests assert).

const PAD = {left: 52, right: 12, top: 10, bottom: 24};

export class Series {
  constructor(name, color) {
    this.name = name;
    this.color = color;
    this.xs = new Float64Array(256);
    this.ys = new Float64Array(256);
    this.n = 0;
    this.gen = 0;        // bumped when points are removed: caches restart
    this.yMin = Infinity;
    this.yMax = -Infinity;
    this.cols = null;    // per-pixel-column aggregates (see Chart.decimate)
  }
  push(x, y) {
    // x must not go backwards: a job resumed from an older checkpoint
    // replays steps, and the curve from then on replaces the old tail.
    if (this.n && x <= this.xs[this.n - 1]) {
      this.n = this.lowerBound(x);
      this.gen++;
      this.yMin = Infinity;
      this.yMax = -Infinity;
      for (let i = 0; i < this.n; i++) this.growRange(this.ys[i]);
    }
    if (this.n === this.xs.length) {
      const nx = new Float64Array(this.n * 2); nx.set(this.xs); this.xs = nx;
      const ny = new Float64Array(this.n * 2); ny.set(this.ys); this.ys = ny;
    }
    this.xs[this.n] = x;
    this.ys[this.n] = y;
    this.n++;
    this.growRange(y);
  }
  growRange(y) {
    if (y < this.yMin) this.yMin = y;
    if (y > this.yMax) this.yMax = y;
  }
  // First index whose x >= v.
  lowerBound(v) {
    let lo = 0, hi = this.n;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.xs[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
}

// Ticks at 1, 2, 5 × 10^k covering [lo, hi] with about `count` of them.
function niceTicks(lo, hi, count) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  const step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

// Time ticks (x in ms since the epoch) at whole seconds/minutes/hours.
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
  7200, 10800, 21600, 43200, 86400].map((s) => s * 1000);
function timeTicks(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count);
  const step = TIME_STEPS.find((s) => s >= raw) || TIME_STEPS[TIME_STEPS.length - 1];
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(v);
  return out;
}

function fmtTick(v) {
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) return v.toExponential(1);
  if (a >= 1000) return (v / 1000).toFixed(a >= 1e4 ? 0 : 1) + 'k';
  return String(Number(v.toPrecision(3)));
}

function fmtClock(ms) {
  const d = new Date(ms);
  return d.toTimeString().slice(0, 8);
}

export class Chart {
  // opts: title, xKind ('step' | 'time'), yFormat(v) for hover, yMin (e.g. 0
  // for utilisation), yMax, series: [{name, color}]
  constructor(opts) {
    this.opts = opts;
    this.series = [];
    this.xMaxHint = null;
    this.hoverX = null;
    this.pending = false;
    this.root = document.createElement('figure');
    this.root.className = 'chart';
    this.root.tyChart = this;
    const cap = document.createElement('figcaption');
    this.titleEl = document.createElement('span');
    this.titleEl.className = 'chart-title';
    this.titleEl.textContent = opts.title;
    this.legend = document.createElement('span');
    this.legend.className = 'chart-legend';
    cap.append(this.titleEl, this.legend);
    this.box = document.createElement('div');
    this.box.className = 'chart-box';
    this.canvas = document.createElement('canvas');
    this.tip = document.createElement('div');
    this.tip.className = 'chart-tip';
    this.tip.hidden = true;
    this.empty = document.createElement('div');
    this.empty.className = 'chart-empty';
    this.empty.textContent = opts.emptyText || 'waiting for data…';
    this.box.append(this.canvas, this.tip, this.empty);
    this.root.append(cap, this.box);
    for (const s of opts.series || []) this.addSeries(s.name, s.color);
    this.root.dataset.points = '0';

    this.canvas.addEventListener('pointermove', (e) => this.onHover(e));
    this.canvas.addEventListener('pointerleave', () => { this.hoverX = null; this.tip.hidden = true; this.schedule(); });
    this.resizeObs = new ResizeObserver(() => this.schedule());
    this.resizeObs.observe(this.box);
  }

  get element() { return this.root; }

  addSeries(name, color) {
    const s = new Series(name, color);
    this.series.push(s);
    this.renderLegend();
    return this.series.length - 1;
  }

  seriesIndex(name, color) {
    const i = this.series.findIndex((s) => s.name === name);
    return i >= 0 ? i : this.addSeries(name, color);
  }

  // Appends one point; drawing happens on the next animation frame.
  append(seriesIdx, x, y) {
    if (!Number.isFinite(x) || !Number.isFinite(y)) return;
    this.series[seriesIdx].push(x, y);
    this.schedule();
  }

  // Stretches the x axis to at least this value (max_steps for step charts).
  setXMax(v) { this.xMaxHint = Number.isFinite(v) ? v : null; this.schedule(); }

  pointCount() {
    let n = 0;
    for (const s of this.series) n += s.n;
    return n;
  }

  destroy() { this.resizeObs.disconnect(); }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  renderLegend() {
    this.legend.replaceChildren();
    for (const s of this.series) {
      const item = document.createElement('span');
      item.className = 'chart-key';
      const sw = document.createElement('i');
      sw.style.background = s.color;
      item.append(sw, document.createTextNode(s.name));
      this.legend.append(item);
    }
  }

  bounds() {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of this.series) {
      if (!s.n) continue;
      x0 = Math.min(x0, s.xs[0]);
      x1 = Math.max(x1, s.xs[s.n - 1]);
      y0 = Math.min(y0, s.yMin);
      y1 = Math.max(y1, s.yMax);
    }
    if (this.opts.xKind !== 'time') {
      x0 = Math.min(x0, 0);
      if (this.xMaxHint !== null) x1 = Math.max(x1, this.xMaxHint);
    }
    if (this.opts.yMin !== undefined) y0 = Math.min(y0, this.opts.yMin);
    if (this.opts.yMax !== undefined) y1 = Math.max(y1, this.opts.yMax);
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    else {
      const pad = (y1 - y0) * 0.05;
      if (this.opts.yMin === undefined || y0 > this.opts.yMin) y0 -= pad;
      if (this.opts.yMax === undefined) y1 += pad;
    }
    return {x0, x1, y0, y1};
  }

  draw() {
    const total = this.pointCount();
    this.root.dataset.points = String(total);
    this.empty.hidden = total > 0;
    const dpr = window.devicePixelRatio || 1;
    const w = this.box.clientWidth, hgt = this.box.clientHeight;
    if (!w || !hgt) return;
    if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(hgt * dpr)) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(hgt * dpr);
      this.canvas.style.width = w + 'px';
      this.canvas.style.height = hgt + 'px';
    }
    const ctx = this.canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    if (!total) return;

    const style = getComputedStyle(this.root);
    const fg = style.getPropertyValue('--chart-fg').trim() || '#555';
    const grid = style.getPropertyValue('--chart-grid').trim() || '#ddd';
    const {x0, x1, y0, y1} = this.bounds();
    const pw = w - PAD.left - PAD.right, ph = hgt - PAD.top - PAD.bottom;
    if (pw < 10 || ph < 10) return;
    const sx = pw / (x1 - x0), sy = ph / (y1 - y0);
    const px = (x) => PAD.left + (x - x0) * sx;
    const py = (y) => PAD.top + ph - (y - y0) * sy;
    this.view = {x0, x1, y0, y1, sx, sy, pw, ph};

    // Grid and tick labels.
    ctx.font = '11px system-ui, sans-serif';
    ctx.lineWidth = 1;
    ctx.strokeStyle = grid;
    ctx.fillStyle = fg;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (const t of niceTicks(y0, y1, Math.max(2, Math.floor(ph / 40)))) {
      const y = Math.round(py(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(PAD.left, y); ctx.lineTo(PAD.left + pw, y); ctx.stroke();
      ctx.fillText(fmtTick(t), PAD.left - 6, y);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const nx = Math.max(2, Math.floor(pw / 90));
    const xt = this.opts.xKind === 'time' ? timeTicks(x0, x1, nx) : niceTicks(x0, x1, nx);
    for (const t of xt) {
      const x = Math.round(px(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, PAD.top); ctx.lineTo(x, PAD.top + ph); ctx.stroke();
      ctx.fillText(this.opts.xKind === 'time' ? fmtClock(t) : fmtTick(t), x, PAD.top + ph + 5);
    }

    // Series, decimated to pixel columns.
    ctx.save();
    ctx.beginPath();
    ctx.rect(PAD.left, PAD.top, pw, ph);
    ctx.clip();
    ctx.lineWidth = 1.5;
    ctx.lineJoin = 'round';
    for (const s of this.series) {
      if (!s.n) continue;
      const c = this.decimate(s, x0, sx, Math.ceil(pw));
      ctx.strokeStyle = s.color;
      ctx.beginPath();
      let started = false;
      for (let col = 0; col < c.has.length; col++) {
        if (!c.has[col]) continue;
        const cx = PAD.left + col + 0.5;
        if (!started) { ctx.moveTo(cx, py(c.first[col])); started = true; } else ctx.lineTo(cx, py(c.first[col]));
        if (c.max[col] !== c.min[col]) { ctx.lineTo(cx, py(c.min[col])); ctx.lineTo(cx, py(c.max[col])); }
        ctx.lineTo(cx, py(c.last[col]));
      }
      ctx.stroke();
      // Sparse series (eval loss: a few points) also get a dot per point.
      if (s.n <= 64) {
        ctx.fillStyle = s.color;
        for (let i = 0; i < s.n; i++) {
          ctx.beginPath(); ctx.arc(px(s.xs[i]), py(s.ys[i]), 2.5, 0, Math.PI * 2); ctx.fill();
        }
      }
    }
    ctx.restore();

    if (this.hoverX !== null) this.drawHover(ctx, px, py);
  }

  // Per-pixel-column first/min/max/last of a series, in data units so a
  // change of the y range needs no recomputation. While the x range and the
  // width stay put (step charts span 0..max_steps from the start) only the
  // points appended since the last frame are folded in: a frame costs
  // O(new points + width), not O(all points).
  decimate(s, x0, sx, width) {
    let c = s.cols;
    if (!c || c.x0 !== x0 || c.sx !== sx || c.gen !== s.gen || c.has.length !== width + 1 || c.done > s.n) {
      const n = width + 1;
      c = s.cols = {x0, sx, gen: s.gen, done: 0, has: new Uint8Array(n),
        first: new Float64Array(n), min: new Float64Array(n), max: new Float64Array(n), last: new Float64Array(n)};
    }
    for (let i = c.done; i < s.n; i++) {
      const col = Math.min(width, Math.max(0, Math.floor((s.xs[i] - x0) * sx)));
      const y = s.ys[i];
      if (!c.has[col]) {
        c.has[col] = 1; c.first[col] = c.min[col] = c.max[col] = c.last[col] = y;
      } else {
        if (y < c.min[col]) c.min[col] = y;
        if (y > c.max[col]) c.max[col] = y;
        c.last[col] = y;
      }
    }
    c.done = s.n;
    return c;
  }

  onHover(e) {
    const r = this.canvas.getBoundingClientRect();
    this.hoverX = e.clientX - r.left;
    this.schedule();
  }

  drawHover(ctx, px, py) {
    const v = this.view;
    if (!v) return;
    const xv = v.x0 + (this.hoverX - PAD.left) / v.sx;
    const lines = [];
    let xShown = null;
    for (const s of this.series) {
      if (!s.n) continue;
      let i = s.lowerBound(xv);
      if (i >= s.n) i = s.n - 1;
      if (i > 0 && Math.abs(s.xs[i - 1] - xv) < Math.abs(s.xs[i] - xv)) i--;
      const x = s.xs[i], y = s.ys[i];
      if (xShown === null) xShown = x;
      ctx.fillStyle = s.color;
      ctx.beginPath(); ctx.arc(px(x), py(y), 3, 0, Math.PI * 2); ctx.fill();
      const fy = this.opts.yFormat ? this.opts.yFormat(y) : String(Number(y.toPrecision(5)));
      lines.push(`${s.name}: ${fy}`);
    }
    if (xShown === null) return;
    const hx = Math.round(px(xShown)) + 0.5;
    ctx.strokeStyle = getComputedStyle(this.root).getPropertyValue('--chart-fg').trim() || '#555';
    ctx.setLineDash([3, 3]);
    ctx.beginPath(); ctx.moveTo(hx, PAD.top); ctx.lineTo(hx, PAD.top + v.ph); ctx.stroke();
    ctx.setLineDash([]);
    const head = this.opts.xKind === 'time' ? fmtClock(xShown) : `step ${xShown}`;
    this.tip.textContent = [head, ...lines].join('\n');
    this.tip.hidden = false;
    const left = hx + 10 + 160 > this.box.clientWidth ? hx - 170 : hx + 10;
    this.tip.style.left = Math.max(0, left) + 'px';
  }
}
