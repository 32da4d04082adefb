// daemon.mjs — starts and stops a real `trainyard serve` for the browser
// tests: a free port, a fresh data directory, the test engine, and the job
// fixtures (a model directory holding fixture.json, which tells the test
// engine how to behave, and a small tokens dataset).
import {spawn, spawnSync} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const {port} = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Daemon {
  // opts: trainyard, engine (paths), outDir (logs), extra (more flags)
  constructor(opts) {
    this.opts = opts;
    this.root = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-web-'));
    this.dataDir = path.join(this.root, 'data');
    this.proc = null;
    this.starts = 0;
  }

  async start() {
    if (!this.port) this.port = await freePort();
    this.base = `http://127.0.0.1:${this.port}`;
    const logPath = path.join(this.opts.outDir, `daemon-${++this.starts}.log`);
    this.logs = [...(this.logs || []), logPath];
    const log = fs.openSync(logPath, 'w');
    this.proc = spawn(this.opts.trainyard, ['serve', '--listen', `127.0.0.1:${this.port}`,
      '--data-dir', this.dataDir, '--engine', this.opts.engine,
      '--allowed-roots', this.root, '--store-roots', this.root, '--grace', '5',
      ...(this.opts.extra || [])],
    {stdio: ['ignore', log, log]});
    fs.closeSync(log);
    const proc = this.proc;
    let exited = null;
    proc.once('exit', (code, sig) => { exited = `exit ${code ?? sig}`; });
    for (let i = 0; i < 300; i++) {
      if (exited) throw new Error(`trainyard serve died at start (${exited}); see ${this.opts.outDir}`);
      try {
        const res = await fetch(`${this.base}/healthz`);
        if (res.ok) return;
      } catch { /* not listening yet */ }
      await sleep(100);
    }
    throw new Error('trainyard serve did not answer /healthz within 30 s');
  }

  // `trainyard token create NAME`: a token for a --require-token daemon.
  createToken(name) {
    const r = spawnSync(this.opts.trainyard, ['token', 'create', name, '--data-dir', this.dataDir], {encoding: 'utf8'});
    if (r.status !== 0) throw new Error(`trainyard token create failed: ${r.stderr}`);
    return r.stdout.trim();
  }

  // SIGTERM (a clean restart) or SIGKILL; waits for the process to go.
  async stop(signal = 'SIGTERM') {
    const p = this.proc;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const gone = new Promise((r) => p.once('exit', r));
    p.kill(signal);
    const t = setTimeout(() => p.kill('SIGKILL'), 15000);
    await gone;
    clearTimeout(t);
    this.proc = null;
  }

  // Engines are in their own process groups; the test engine exits when
  // its event pipe closes, so after stop() they follow on their own.
  async cleanup() {
    await this.stop('SIGTERM');
    fs.rmSync(this.root, {recursive: true, force: true});
  }

  // AddressSanitizer / UBSan reports in the daemon's logs (the browser's
  // request patterns — aborted streams, reconnects — are worth checking).
  sanitizerReports() {
    const out = [];
    for (const f of this.logs || []) {
      const text = fs.existsSync(f) ? fs.readFileSync(f, 'utf8') : '';
      for (const line of text.split('\n')) {
        if (/ERROR: AddressSanitizer|runtime error:/.test(line)) out.push(`${path.basename(f)}: ${line}`);
      }
    }
    return out;
  }

  async api(p, {method = 'GET', body} = {}) {
    const headers = body ? {'Content-Type': 'application/json'} : {};
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    const res = await fetch(this.base + p, {method, headers,
      body: body ? JSON.stringify(body) : undefined});
    const text = await res.text();
    const json = text ? JSON.parse(text) : null;
    if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
    return json;
  }

  // A model directory whose fixture.json drives the test engine.
  fixture(name, behaviour) {
    const dir = path.join(this.root, 'models', name);
    fs.mkdirSync(dir, {recursive: true});
    fs.writeFileSync(path.join(dir, 'fixture.json'), JSON.stringify(behaviour));
    return dir;
  }

  dataset() {
    const f = path.join(this.root, 'train.jsonl');
    if (!fs.existsSync(f)) {
      const rows = [];
      for (let i = 0; i < 16; i++) rows.push(JSON.stringify({input_ids: Array.from({length: 16}, (_, t) => (i + t) % 32)}));
      fs.writeFileSync(f, rows.join('\n') + '\n');
    }
    return f;
  }

  spec(name, modelDir, {maxSteps = 100, logEvery = 1, ckptEvery = 10} = {}) {
    return {
      name,
      model: {path: modelDir},
      dataset: {train: this.dataset(), format: 'tokens'},
      hyperparameters: {max_steps: maxSteps, batch_size: 1, seq_len: 16, lr: 0.001, log_every_steps: logEvery},
      checkpoint: {every_steps: ckptEvery},
    };
  }
}
