// charts.js — a small canvas line chart for live training curves.
//
// Points are appended into growable typed arrays and the chart redraws at
// most once per animation frame, however many points arrived. Each series
// is decimated to the canvas's pixel columns (downsample.js: first/min/
// max/last of every column), kept between frames and extended by the new
// points only, so a redraw costs O(width) however many points there are:
// ten runs of 10,000 points stay smooth. Axes get "nice" ticks (axes.js);
// hovering shows the nearest values. Every chart has a log-scale toggle
// for its y axis in its caption, and takes a smoothing weight (the view's
// slider): the EMA of smooth.js is drawn over the raw points, which stay
// faint behind it. The element's data-points attribute holds the number of
// plotted points (what the browser tests assert).

import {niceTicks, logTicks, timeTicks, fmtTick, fmtClock, fmtElapsed} from './axes.js';
import {columns} from './downsample.js';
import {emaInto} from './smooth.js';
import {fmtMetric} from './util.js';

const PAD = {left: 52, right: 12, top: 10, bottom: 24};
const RAW_ALPHA = 0.22; // the raw line behind a smoothed one
export const MIN_SMOOTH = 20; // shorter series are drawn raw

// The x range of a step chart: from the first step seen to the last, the
// right edge rounded up to a tenth of the span's decade so that it moves in
// steps, not with every point (the column aggregates survive most frames of
// a live run). maxSteps (the job's length) joins the range, with a marker,
// only when it lies within NEAR_END of the span beyond the data: a job that
// has barely begun is not squeezed into the left edge of its chart.
export const NEAR_END = 0.2;
export function stepRange(first, last, maxSteps = null) {
  let x0 = first, x1 = last;
  if (!(x1 > x0)) x1 = x0 + 1;
  const span = x1 - x0;
  let marker = null;
  if (Number.isFinite(maxSteps) && maxSteps >= last && maxSteps <= last + NEAR_END * span) {
    marker = maxSteps;
    x1 = Math.max(x1, maxSteps);
  } else if (span >= 10) {
    const unit = Math.pow(10, Math.floor(Math.log10(span))) / 10;
    x1 = x0 + Math.ceil((x1 - x0) / unit) * unit;
  }
  return {x0, x1, marker};
}

// Whether a series has fallen by `factor` from its first value (a loss
// 100x down is read on a log axis).
export function fallen(s, factor) {
  return s.n > 1 && s.ys[0] > 0 && s.yMinPos < Infinity && s.ys[0] / s.yMinPos >= factor;
}

export class Series {
  // rewind: a point whose x does not advance replaces the tail from there
  // (x is a step); otherwise x is a time and equal times follow each other.
  constructor(name, color, rewind = true) {
    this.name = name;
    this.color = color;
    this.rewind = rewind;
    this.xs = new Float64Array(256);
    this.ys = new Float64Array(256);
    this.n = 0;
    this.gen = 0;        // bumped when points are removed: caches restart
    this.yMin = Infinity;
    this.yMax = -Infinity;
    this.yMinPos = Infinity; // smallest value above 0: a log axis's floor
    this.cols = null;    // per-pixel-column aggregates (see Chart.decimate)
    // The smoothed copy (smooth.js): values and the EMA accumulator, valid
    // for the first smN points at weight smW.
    this.sm = null;
    this.acc = null;
    this.smN = 0;
    this.smW = 0;
    this.smCols = null;
  }
  push(x, y) {
    // x must not go backwards: a job resumed from an older checkpoint
    // replays steps, and the curve from then on replaces the old tail.
    // Time never runs backwards on the chart (a clock step would).
    if (!this.rewind && this.n && x < this.xs[this.n - 1]) x = this.xs[this.n - 1];
    if (this.rewind && this.n && x <= this.xs[this.n - 1]) {
      this.n = this.lowerBound(x);
      this.gen++;
      this.yMin = Infinity;
      this.yMax = -Infinity;
      this.yMinPos = Infinity;
      for (let i = 0; i < this.n; i++) this.growRange(this.ys[i]);
      if (this.smN > this.n) this.smN = this.n;
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
    if (y > 0 && y < this.yMinPos) this.yMinPos = y;
  }
  // Empties the series (the compare view's step/time toggle refills it).
  clear() {
    this.n = 0;
    this.gen++;
    this.yMin = Infinity;
    this.yMax = -Infinity;
    this.yMinPos = Infinity;
    this.smN = 0;
  }
  // The smoothed values at weight w, brought up to date with the points
  // appended since the last call (only those are computed).
  smoothed(w) {
    if (w !== this.smW) { this.smW = w; this.smN = 0; }
    if (!this.sm || this.sm.length < this.xs.length) {
      const sm = new Float64Array(this.xs.length), acc = new Float64Array(this.xs.length);
      if (this.sm) { sm.set(this.sm.subarray(0, this.smN)); acc.set(this.acc.subarray(0, this.smN)); }
      this.sm = sm; this.acc = acc;
    }
    if (this.smN < this.n) this.smN = emaInto(this.ys, this.n, w, this.acc, this.sm, this.smN);
    return this.sm;
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

export class Chart {
  // opts: title, xKind ('step' | 'time' | 'elapsed': ms since the epoch, or
  // since the run began), yFormat(v) for hover, yMin (e.g. 0 for
  // utilisation), yMax, logY (start on a log axis), autoLog (switch to a
  // log axis once the first series has fallen by this factor, unless the
  // user has set the toggle), smoothing (EMA weight), smooth (false: never
  // smoothed, whatever the slider), dots (see dotted(); none by default),
  // series: [{name, color}]
  constructor(opts) {
    this.opts = opts;
    this.series = [];
    this.xMaxHint = null;
    this.hoverX = null;
    this.pending = false;
    this.logY = !!opts.logY;
    this.userLog = false; // the user chose the scale: autoLog no longer applies
    this.smoothing = opts.smoothing || 0;
    this.root = document.createElement('figure');
    this.root.className = 'chart';
    this.root.tyChart = this;
    const cap = document.createElement('figcaption');
    this.titleEl = document.createElement('span');
    this.titleEl.className = 'chart-title';
    this.titleEl.textContent = opts.title;
    this.legend = document.createElement('span');
    this.legend.className = 'chart-legend';
    // The log toggle: a labelled checkbox, so keyboards and screen readers
    // reach it like any form control.
    const logLabel = document.createElement('label');
    logLabel.className = 'chart-log';
    this.logBox = document.createElement('input');
    this.logBox.type = 'checkbox';
    this.logBox.checked = this.logY;
    this.logBox.setAttribute('aria-label', `Log scale for ${opts.title}`);
    this.logBox.addEventListener('change', () => { this.userLog = true; this.setLogY(this.logBox.checked); });
    logLabel.append(this.logBox, document.createTextNode('log'));
    cap.append(this.titleEl, this.legend, logLabel);
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
    this.root.dataset.scale = this.logY ? 'log' : 'linear';

    this.canvas.addEventListener('pointermove', (e) => this.onHover(e));
    this.canvas.addEventListener('pointerleave', () => { this.hoverX = null; this.tip.hidden = true; this.schedule(); });
    this.resizeObs = new ResizeObserver(() => this.schedule());
    this.resizeObs.observe(this.box);
  }

  get element() { return this.root; }

  addSeries(name, color) {
    const s = new Series(name, color, this.opts.xKind !== 'time' && this.opts.xKind !== 'elapsed');
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

  // A log y axis (values <= 0 sit on its floor) or a linear one.
  setLogY(on) {
    this.logY = !!on;
    this.logBox.checked = this.logY;
    this.root.dataset.scale = this.logY ? 'log' : 'linear';
    this.schedule();
  }

  // The EMA weight of the smoothed line, 0 (off) to 0.99.
  setSmoothing(w) {
    this.smoothing = w > 0 ? Math.min(0.99, w) : 0;
    this.root.dataset.smoothing = String(this.smoothing);
    this.schedule();
  }

  // Drops every point and takes a new x kind (the series and their colours
  // stay): the compare view refills its charts when step/time is toggled.
  reset(xKind) {
    if (xKind) this.opts.xKind = xKind;
    this.xMaxHint = null;
    const rewind = this.opts.xKind !== 'time' && this.opts.xKind !== 'elapsed';
    for (const s of this.series) { s.clear(); s.rewind = rewind; }
    this.schedule();
  }

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

  // The plotted range in data units (y as log10 of the value on a log axis).
  bounds() {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    const log = this.logY;
    for (const s of this.series) {
      if (!s.n) continue;
      x0 = Math.min(x0, s.xs[0]);
      x1 = Math.max(x1, s.xs[s.n - 1]);
      if (log) {
        if (s.yMinPos === Infinity) continue;
        y0 = Math.min(y0, s.yMinPos);
        y1 = Math.max(y1, s.yMax);
      } else {
        y0 = Math.min(y0, s.yMin);
        y1 = Math.max(y1, s.yMax);
      }
    }
    this.marker = null;
    if (this.opts.xKind === 'step' || !this.opts.xKind) {
      // Steps span the data (stepRange); max_steps only when near.
      const r = stepRange(x0, x1, this.xMaxHint);
      x0 = r.x0; x1 = r.x1; this.marker = r.marker;
    } else if (this.opts.xKind === 'elapsed') {
      // Time since the run began: from 0, the right edge moving in steps
      // of a tenth of a decade of the span.
      x0 = Math.min(x0, 0);
      if (x1 > x0) {
        const unit = Math.pow(10, Math.floor(Math.log10(x1 - x0))) / 10;
        x1 = Math.ceil(x1 / unit) * unit;
      }
    }
    if (x1 <= x0) x1 = x0 + 1;
    if (log) {
      // Nothing above zero to show: a decade around 1.
      if (!(y0 > 0)) { y0 = 1; y1 = 10; }
      let l0 = Math.log10(y0), l1 = Math.log10(y1);
      if (l1 - l0 < 1e-9) { l0 -= 0.5; l1 += 0.5; } else {
        const pad = (l1 - l0) * 0.05;
        l0 -= pad; l1 += pad;
      }
      return {x0, x1, y0: l0, y1: l1};
    }
    if (this.opts.yMin !== undefined) y0 = Math.min(y0, this.opts.yMin);
    if (this.opts.yMax !== undefined) y1 = Math.max(y1, this.opts.yMax);
    if (y1 <= y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    else {
      const pad = (y1 - y0) * 0.05;
      if (this.opts.yMin === undefined || y0 > this.opts.yMin) y0 -= pad;
      if (this.opts.yMax === undefined) y1 += pad;
    }
    return {x0, x1, y0, y1};
  }

  fmtX(x) {
    const k = this.opts.xKind;
    return k === 'time' ? fmtClock(x) : k === 'elapsed' ? fmtElapsed(x) : fmtTick(x);
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
    if (this.opts.autoLog && !this.userLog && !this.logY && this.series[0] && fallen(this.series[0], this.opts.autoLog)) {
      this.setLogY(true);
      this.root.dataset.autoLog = 'on';
    }

    const style = getComputedStyle(this.root);
    const fg = style.getPropertyValue('--chart-fg').trim() || '#555';
    const grid = style.getPropertyValue('--chart-grid').trim() || '#ddd';
    const {x0, x1, y0, y1} = this.bounds();
    const pw = w - PAD.left - PAD.right, ph = hgt - PAD.top - PAD.bottom;
    if (pw < 10 || ph < 10) return;
    const sx = pw / (x1 - x0), sy = ph / (y1 - y0);
    const log = this.logY;
    // A value's height: log10 on a log axis, where values <= 0 (a warmup's
    // lr of 0) sit on the floor rather than vanishing.
    const ty = log ? (y) => (y > 0 ? Math.log10(y) : y0) : (y) => y;
    const px = (x) => PAD.left + (x - x0) * sx;
    const py = (y) => PAD.top + ph - (ty(y) - y0) * sy;
    this.view = {x0, x1, y0, y1, sx, sy, pw, ph};
    this.root.dataset.xrange = `${x0} ${x1}`;
    if (this.marker !== null) this.root.dataset.maxMarker = String(this.marker);
    else delete this.root.dataset.maxMarker;

    // Grid and tick labels.
    ctx.font = '11px system-ui, sans-serif';
    ctx.lineWidth = 1;
    ctx.strokeStyle = grid;
    ctx.fillStyle = fg;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    const ny = Math.max(2, Math.floor(ph / 40));
    const yt = log ? logTicks(Math.pow(10, y0), Math.pow(10, y1), ny) : niceTicks(y0, y1, ny);
    for (const t of yt) {
      const y = Math.round(py(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(PAD.left, y); ctx.lineTo(PAD.left + pw, y); ctx.stroke();
      ctx.fillText(fmtTick(t), PAD.left - 6, y);
    }
    this.root.dataset.yticks = yt.map((t) => fmtTick(t)).join(' ');
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const nx = Math.max(2, Math.floor(pw / 90));
    const xt = this.opts.xKind === 'time' || this.opts.xKind === 'elapsed' ? timeTicks(x0, x1, nx) : niceTicks(x0, x1, nx);
    for (const t of xt) {
      const x = Math.round(px(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, PAD.top); ctx.lineTo(x, PAD.top + ph); ctx.stroke();
      ctx.fillText(this.fmtX(t), x, PAD.top + ph + 5);
    }

    // The job's end (max_steps) when it is near: a faint dashed line.
    if (this.marker !== null) {
      const x = Math.round(px(this.marker)) - 0.5;
      ctx.save();
      ctx.globalAlpha = 0.45;
      ctx.strokeStyle = fg;
      ctx.setLineDash([2, 4]);
      ctx.beginPath(); ctx.moveTo(x, PAD.top); ctx.lineTo(x, PAD.top + ph); ctx.stroke();
      ctx.restore();
    }

    // Series, decimated to pixel columns; with smoothing, the raw line faint
    // and the smoothed one over it.
    ctx.save();
    ctx.beginPath();
    ctx.rect(PAD.left, PAD.top, pw, ph);
    ctx.clip();
    ctx.lineWidth = 1.5;
    ctx.lineJoin = 'bevel';
    const width = Math.ceil(pw);
    let drawn = 0;
    let smoothedAny = false, dots = 0;
    for (const s of this.series) {
      if (!s.n) continue;
      const wsm = this.weightFor(s);
      smoothedAny ||= wsm > 0;
      const raw = this.decimate(s, x0, sx, width);
      ctx.strokeStyle = s.color;
      ctx.globalAlpha = wsm > 0 ? RAW_ALPHA : 1;
      drawn += this.stroke(ctx, raw, py);
      // Series sparse by nature (eval loss: a few points) also get a dot
      // per point; a chart says which with opts.dots.
      if (this.dotted(s)) {
        ctx.fillStyle = s.color;
        dots += s.n;
        for (let i = 0; i < s.n; i++) {
          ctx.beginPath(); ctx.arc(px(s.xs[i]), py(s.ys[i]), 2.5, 0, Math.PI * 2); ctx.fill();
        }
      }
      if (wsm > 0) {
        const ys = s.smoothed(wsm);
        s.smCols = columns(s.smCols, s.xs, ys, s.n, `${s.gen}:${wsm}`, x0, sx, width);
        ctx.globalAlpha = 1;
        drawn += this.stroke(ctx, s.smCols, py);
      }
    }
    ctx.globalAlpha = 1;
    ctx.restore();
    this.root.dataset.smoothed = smoothedAny ? 'yes' : 'no';
    this.root.dataset.dots = String(dots);
    // What the last frame stroked: bounded by the width, not the points.
    this.root.dataset.vertices = String(drawn);

    if (this.hoverX !== null) this.drawHover(ctx, px, py);
  }

  // The smoothing weight a series is drawn with: none on a chart made with
  // smooth: false (a learning rate is a schedule, not noise) and none for a
  // series of fewer than MIN_SMOOTH points (an EMA over a handful of points
  // only drags the line).
  weightFor(s) {
    return this.opts.smooth === false || s.n < MIN_SMOOTH ? 0 : this.smoothing;
  }

  // Whether a series gets a dot per point: only where the chart asks,
  // for series sparse by nature (evals): opts.dots 'sparse' dots every
  // series of at most 64 points, a function decides per series (and the
  // 64-point bound still holds); a training curve of 60 points is a line.
  dotted(s) {
    const d = this.opts.dots;
    if (typeof d === 'function') return d(s, this.series.indexOf(s)) && s.n <= 64;
    return d === 'sparse' && s.n <= 64;
  }

  // Strokes one series' columns; returns the vertices drawn.
  stroke(ctx, c, py) {
    ctx.beginPath();
    let started = false, v = 0;
    for (let col = 0; col < c.has.length; col++) {
      if (!c.has[col]) continue;
      const cx = PAD.left + col + 0.5;
      if (!started) { ctx.moveTo(cx, py(c.first[col])); started = true; } else ctx.lineTo(cx, py(c.first[col]));
      if (c.max[col] !== c.min[col]) { ctx.lineTo(cx, py(c.min[col])); ctx.lineTo(cx, py(c.max[col])); v += 2; }
      ctx.lineTo(cx, py(c.last[col]));
      v += 2;
    }
    ctx.stroke();
    return v;
  }

  // Per-pixel-column first/min/max/last of a series (downsample.js), kept
  // on the series and extended by the points appended since the last frame.
  decimate(s, x0, sx, width) {
    s.cols = columns(s.cols, s.xs, s.ys, s.n, s.gen, x0, sx, width);
    return s.cols;
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
    const fmt = (y) => (this.opts.yFormat ? this.opts.yFormat(y) : fmtMetric(y));
    for (const s of this.series) {
      if (!s.n) continue;
      let i = s.lowerBound(xv);
      if (i >= s.n) i = s.n - 1;
      if (i > 0 && Math.abs(s.xs[i - 1] - xv) < Math.abs(s.xs[i] - xv)) i--;
      const x = s.xs[i], y = s.ys[i];
      const wsm = this.weightFor(s);
      // With smoothing the marker sits on the smoothed line; the raw value
      // is said too.
      const shown = wsm > 0 ? s.smoothed(wsm)[i] : y;
      if (xShown === null) xShown = x;
      ctx.fillStyle = s.color;
      ctx.beginPath(); ctx.arc(px(x), py(shown), 3, 0, Math.PI * 2); ctx.fill();
      lines.push(wsm > 0 ? `${s.name}: ${fmt(shown)} (raw ${fmt(y)})` : `${s.name}: ${fmt(y)}`);
    }
    if (xShown === null) return;
    const hx = Math.round(px(xShown)) + 0.5;
    ctx.strokeStyle = getComputedStyle(this.root).getPropertyValue('--chart-fg').trim() || '#555';
    ctx.setLineDash([3, 3]);
    ctx.beginPath(); ctx.moveTo(hx, PAD.top); ctx.lineTo(hx, PAD.top + v.ph); ctx.stroke();
    ctx.setLineDash([]);
    const k = this.opts.xKind;
    const head = k === 'time' ? fmtClock(xShown) : k === 'elapsed' ? `after ${fmtElapsed(xShown)}` : `step ${xShown}`;
    this.tip.textContent = [head, ...lines].join('\n');
    this.tip.hidden = false;
    const left = hx + 10 + 160 > this.box.clientWidth ? hx - 170 : hx + 10;
    this.tip.style.left = Math.max(0, left) + 'px';
  }
}
