// fake-api.mjs — a development stand-in for `trainyard serve`, speaking the
// JSON shapes and SSE format of docs/api.md, for working on the dashboard
// without building the daemon: `node tests/web/fake-api.mjs [port] [gpus]`.
// Jobs "train" on a timer (a metric every 200 ms). The ctest cases never use
// it: they run against the real daemon (dashboard.test.mjs).

import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const WEB = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../web');
const port = Number(process.argv[2] || 8099);
const ngpus = Number(process.argv[3] || 0); // fake GPUs sampled every second
const gpus = Array.from({length: ngpus}, (_, i) => ({index: i, name: 'Fake GPU 80GB', mem_total: 80 * 2 ** 30,
  mem_used: 0, util: 0, temp: 35, job_id: null}));
const jobs = new Map();
const events = new Map(); // job id -> [event]
const global = [];
const clients = new Set(); // {res, jobId|null}
let nextId = 1;
const now = () => new Date().toISOString();
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

function emit(job, type, data) {
  const list = events.get(job.id);
  const ev = {job_id: job.id, seq: list.length + 1, ts: now(), type, data};
  list.push(ev);
  if (type === 'state' || type === 'started' || type === 'gpu') {
    const g = {...ev, gid: global.length + 1};
    global.push(g);
    for (const c of clients) if (c.jobId === null) send(c.res, g.gid, g);
  }
  for (const c of clients) if (c.jobId === job.id) {
    send(c.res, ev.seq, ev);
    if (type === 'state' && TERMINAL.has(data.to)) c.res.end();
  }
}

function send(res, id, ev) {
  const {gid, ...body} = ev;
  res.write(`id: ${id}\nevent: ${ev.type}\ndata: ${JSON.stringify(body)}\n\n`);
}

function transition(job, to, reason) {
  const from = job.state;
  if (to !== 'running' && to !== 'starting') for (const g of gpus) if (g.job_id === job.id) g.job_id = null;
  job.state = to;
  job.updated_at = now();
  if (to === 'running' && !job.started_at) job.started_at = now();
  if (TERMINAL.has(to)) job.finished_at = now();
  emit(job, 'state', {from, to, reason: reason || ''});
}

function view(job) {
  const queued = [...jobs.values()].filter((j) => j.state === 'queued').sort((a, b) => a.id - b.id);
  const max = job.spec.hyperparameters.max_steps;
  const step = job.last_metric ? job.last_metric.step : 0;
  return {...job, timer: undefined, queue_position: job.state === 'queued' ? queued.indexOf(job) + 1 : null,
    progress: {step, max_steps: max, fraction: step / max, eta_s: job.last_metric ? (max - step) * 0.2 : null}};
}

function run(job) {
  const free = gpus.find((g) => g.job_id === null);
  if (free) { free.job_id = job.id; job.gpus = [free.index]; }
  transition(job, 'starting');
  setTimeout(() => {
    transition(job, 'running');
    emit(job, 'started', {params: 120000, trainable: 120000, world: 1, backend: 'cpu'});
    let step = job.last_metric ? job.last_metric.step : 0;
    job.timer = setInterval(() => {
      step += 2;
      const m = {step, loss: 4.2 * Math.exp(-step / 80) + 0.1 + Math.random() * 0.05, lr: 3e-3, grad_norm: 1,
        tokens: step * 512, tokens_per_s: 2500 + Math.random() * 300, mem_bytes: 1 << 24};
      job.last_metric = m;
      emit(job, 'metric', m);
      if (step % 50 === 0) { job.last_eval = {step, loss: m.loss + 0.1}; emit(job, 'eval', job.last_eval); }
      if (step >= job.spec.hyperparameters.max_steps) { clearInterval(job.timer); transition(job, 'succeeded'); }
    }, 200);
  }, 300);
}

function json(res, status, body) {
  res.writeHead(status, {'Content-Type': 'application/json'});
  res.end(JSON.stringify(body));
}
const fail = (res, status, code, message, field) => json(res, status, {error: {code, message, ...(field ? {field} : {})}});

function stream(req, res, url, jobId) {
  res.writeHead(200, {'Content-Type': 'text/event-stream', 'Cache-Control': 'no-store'});
  res.flushHeaders();
  const from = Number(req.headers['last-event-id'] ?? url.searchParams.get('from') ?? NaN);
  const list = jobId === null ? global : events.get(jobId);
  if (Number.isFinite(from)) for (const ev of list) { const id = jobId === null ? ev.gid : ev.seq; if (id > from) send(res, id, ev); }
  const c = {res, jobId};
  clients.add(c);
  req.on('close', () => clients.delete(c));
  if (jobId !== null && TERMINAL.has(jobs.get(jobId).state)) res.end();
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  const p = url.pathname;
  let m;
  if (p === '/' || p.startsWith('/static/')) {
    const f = p === '/' ? 'index.html' : p.slice(8);
    if (f.includes('/') || !fs.existsSync(path.join(WEB, f))) return fail(res, 404, 'not_found', 'no such file');
    const type = {'.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css'}[path.extname(f)] || 'application/octet-stream';
    res.writeHead(200, {'Content-Type': type + '; charset=utf-8'});
    return res.end(fs.readFileSync(path.join(WEB, f)));
  }
  if (p === '/events') return stream(req, res, url, null);
  if (p === '/gpus') return json(res, 200, {gpus});
  if (p === '/jobs' && req.method === 'GET') {
    const states = url.searchParams.getAll('state').flatMap((s) => s.split(',')).filter(Boolean);
    const list = [...jobs.values()].filter((j) => !states.length || states.includes(j.state)).sort((a, b) => b.id - a.id);
    return json(res, 200, {jobs: list.map(view), next_cursor: null});
  }
  if (p === '/jobs' && req.method === 'POST') {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      let spec;
      try { spec = JSON.parse(body); } catch { return fail(res, 400, 'invalid_json', 'body is not JSON'); }
      const hp = spec.hyperparameters || {};
      if (!(hp.max_steps >= 1)) return fail(res, 400, 'invalid_spec', 'hyperparameters.max_steps: required', 'hyperparameters.max_steps');
      if (hp.lr !== undefined && !(hp.lr > 0 && hp.lr <= 10)) return fail(res, 400, 'invalid_spec', 'hyperparameters.lr: must be in (0, 10]', 'hyperparameters.lr');
      const job = {id: nextId++, name: spec.name || null, state: 'queued', spec, priority: 0, created_at: now(),
        started_at: null, finished_at: null, updated_at: now(), restarts: 0, max_restarts: 3, error: null,
        backend: 'cpu', gpus: [], last_metric: null, last_eval: null};
      jobs.set(job.id, job);
      events.set(job.id, []);
      emit(job, 'state', {from: null, to: 'queued'});
      json(res, 201, view(job));
      setTimeout(() => run(job), 500);
    });
    return;
  }
  if ((m = p.match(/^\/jobs\/(\d+)(?:\/(\w+))?$/))) {
    const job = jobs.get(Number(m[1]));
    if (!job) return fail(res, 404, 'not_found', `no job ${m[1]}`);
    const sub = m[2];
    if (!sub) return json(res, 200, view(job));
    if (sub === 'events') return stream(req, res, url, job.id);
    if (sub === 'logs') { res.writeHead(200, {'Content-Type': 'text/plain'}); return res.end(`fake engine log for job ${job.id}\n`); }
    if (sub === 'checkpoints') return json(res, 200, {checkpoints: []});
    if (sub === 'metrics') return json(res, 200, {metrics: events.get(job.id).filter((e) => e.type === 'metric').map((e) => e.data)});
    const allowed = {cancel: ['queued', 'running', 'paused'], pause: ['running'], resume: ['paused']}[sub];
    if (!allowed || req.method !== 'POST') return fail(res, 404, 'not_found', 'no such route');
    if (!allowed.includes(job.state)) return fail(res, 409, 'conflict', `cannot ${sub} a ${job.state} job`);
    clearInterval(job.timer);
    if (sub === 'cancel') transition(job, 'cancelled');
    if (sub === 'pause') { transition(job, 'stopping'); transition(job, 'paused'); }
    if (sub === 'resume') { transition(job, 'queued'); setTimeout(() => run(job), 300); }
    return json(res, 202, view(job));
  }
  fail(res, 404, 'not_found', 'no such route');
});
setInterval(() => {
  for (const g of gpus) {
    const busy = g.job_id !== null;
    g.util = busy ? 80 + Math.round(Math.random() * 18) : 0;
    g.mem_used = busy ? 30 * 2 ** 30 + Math.round(Math.random() * 2 ** 30) : 2 ** 20;
    g.temp = busy ? 70 + Math.round(Math.random() * 5) : 35;
    const {index, util, mem_used, mem_total, temp} = g;
    // Samples go to /events; a held GPU's samples also go to its job's stream.
    const holder = busy ? jobs.get(g.job_id) : null;
    if (holder) emit(holder, 'gpu', {index, util, mem_used, mem_total, temp});
    else {
      const ev = {job_id: null, seq: 0, ts: now(), type: 'gpu', data: {index, util, mem_used, mem_total, temp}, gid: global.length + 1};
      global.push(ev);
      for (const c of clients) if (c.jobId === null) send(c.res, ev.gid, ev);
    }
  }
}, 1000);

server.listen(port, '127.0.0.1', () => console.log(`fake trainyard API on http://127.0.0.1:${port}/`));
