// charts.mjs — the compare view's drawing cost in headless Chromium: ten
// runs of 10,000 points on each of four charts (400,000 points), drawn by
// web/charts.js (decimated to pixel columns, downsample.js) side by side
// with its peer, the same canvas stroking every point. Prints the cold
// draw, a live frame (one new point per run, then a redraw) with and
// without smoothing and on a log axis, and the ratio to the peer.
//
//   node bench/web/charts.mjs        (needs `bash tests/setup-npm.sh`)
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {launch, closeBrowser} from '../../tests/web/browser.mjs';

const WEB = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../web');
const PAGE = `<!doctype html><meta charset="utf-8"><link rel="stylesheet" href="/static/style.css">
<main style="max-width:1280px"><div class="chart-grid compare-grid" id="grid"></div></main>`;

const server = http.createServer((req, res) => {
  if (req.url === '/') { res.writeHead(200, {'Content-Type': 'text/html'}); return res.end(PAGE); }
  const f = req.url.startsWith('/static/') ? req.url.slice(8) : '';
  if (!f || f.includes('/') || !fs.existsSync(path.join(WEB, f))) { res.writeHead(404); return res.end(); }
  const type = {'.js': 'text/javascript', '.css': 'text/css'}[path.extname(f)] || 'text/plain';
  res.writeHead(200, {'Content-Type': type});
  res.end(fs.readFileSync(path.join(WEB, f)));
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;
const browser = await launch();
try {
  const page = browser.context.pages()[0] || await browser.context.newPage();
  await page.goto(base + '/');
  const r = await page.evaluate(async () => {
    const {Chart} = await import('/static/charts.js');
    const RUNS = 10, N = 10000, FRAMES = 40;
    const grid = document.getElementById('grid');
    const charts = ['Loss', 'Learning rate', 'Tokens/s', 'Grad norm'].map((title, k) => {
      const c = new Chart({title, series: Array.from({length: RUNS}, (_, i) => ({name: `#${i}`, color: `hsl(${i * 36} 70% 45%)`}))});
      grid.append(c.element);
      for (let i = 0; i < RUNS; i++) {
        for (let s = 1; s <= N; s++) c.series[i].push(s, (k + 1) * (3 * Math.exp(-s / (2000 + 300 * i)) + 0.3 * Math.sin(s * 0.37 + i)) + 1);
      }
      return c;
    });
    // The peer: the same canvas and transform, a lineTo for every point.
    function naive(c) {
      const ctx = c.canvas.getContext('2d');
      const w = c.box.clientWidth, h = c.box.clientHeight, dpr = window.devicePixelRatio || 1;
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      const {x0, x1, y0, y1} = c.bounds();
      const pw = w - 64, ph = h - 34, sx = pw / (x1 - x0), sy = ph / (y1 - y0);
      for (const s of c.series) {
        ctx.strokeStyle = s.color; ctx.lineWidth = 1.5;
        ctx.beginPath();
        for (let i = 0; i < s.n; i++) {
          const x = 52 + (s.xs[i] - x0) * sx, y = 10 + ph - (s.ys[i] - y0) * sy;
          if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        }
        ctx.stroke();
      }
      ctx.getImageData(0, 0, 1, 1); // wait for the raster
    }
    const drawAll = () => { for (const c of charts) c.draw(); charts[0].canvas.getContext('2d').getImageData(0, 0, 1, 1); };
    const time = (f, reps = 1) => { const t = performance.now(); for (let i = 0; i < reps; i++) f(i); return (performance.now() - t) / reps; };
    let step = N;
    const appendOne = () => { step++; for (const c of charts) for (let i = 0; i < RUNS; i++) c.series[i].push(step, 2 + Math.sin(step + i)); };
    const out = {points: charts.length * RUNS * N, width: charts[0].box.clientWidth};
    out.cold = time(drawAll);
    out.live = time(() => { appendOne(); drawAll(); }, FRAMES);
    out.vertices = charts.reduce((s, c) => s + Number(c.element.dataset.vertices), 0);
    out.naiveLive = time(() => { appendOne(); for (const c of charts) naive(c); }, 5);
    for (const c of charts) c.setSmoothing(0.9);
    out.smoothCold = time(drawAll);
    out.smoothLive = time(() => { appendOne(); drawAll(); }, FRAMES);
    for (const c of charts) { c.setSmoothing(0); c.setLogY(true); }
    out.logCold = time(drawAll);
    out.logLive = time(() => { appendOne(); drawAll(); }, FRAMES);
    return out;
  });
  const f = (v) => v.toFixed(1);
  console.log(`web charts: 4 charts x 10 runs x 10,000 points = ${r.points} points, chart width ${r.width}px (load ${os.loadavg()[0].toFixed(1)})`);
  console.log(`  trainyard (decimated)  cold ${f(r.cold)} ms  live frame ${f(r.live)} ms  (${r.vertices} vertices stroked)`);
  console.log(`  smoothing 0.9          cold ${f(r.smoothCold)} ms  live frame ${f(r.smoothLive)} ms`);
  console.log(`  log axis               cold ${f(r.logCold)} ms  live frame ${f(r.logLive)} ms`);
  console.log(`  peer (every point)     live frame ${f(r.naiveLive)} ms`);
  console.log(`  ratio peer / trainyard live frame: ${(r.naiveLive / r.live).toFixed(1)}x`);
} finally {
  await closeBrowser(browser);
  server.close();
}
