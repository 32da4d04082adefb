// view-job.js — one job: live charts, summary, controls, checkpoints, log
// tail and spec.
//
// Everything live comes from the job's own SSE stream, opened from seq 0 so
// the database replays the history and then continues seamlessly. The view
// remembers the highest seq it applied and drops anything at or below it,
// so a reconnect (Last-Event-ID) after a server restart adds exactly the
// missing points: no gap, no duplicate, no redraw from scratch.
// A smoothing slider sets every chart's EMA and each chart has a log toggle
// (chart-controls.js, charts.js); the ETA and the age are marked for the
// page clock (clock.js) and count between reads.

import {api, openStream, followText} from './api.js';
import {Chart} from './charts.js';
import {smoothingControl} from './chart-controls.js';
import {etaDeadline, etaText, etaAttrs} from './clock.js';
import {tryBox} from './view-try.js';
import {h, fill, stateBadge, allowedActions, TERMINAL, fmtLoss, fmtLr, fmtInt, fmtCount, fmtBytes, fmtCost,
  fmtTime, fmtAge, modelLabel, gpuLabel} from './util.js';

const LOG_LINES = 400;
const GPU_COLORS = ['#2f7ed8', '#e4572e', '#17a589', '#a66cc1', '#f0a202', '#5c6b73', '#c44d8a', '#3aa35c'];

export function mount(main, app, {id}) {
  let alive = true;
  let job = null;
  let lastSeq = 0;
  let dupes = 0;
  let stream = null;
  let logFollow = null;
  let ckptTimer = null;
  let terminalSeen = false;
  // State events counted as they arrive. A read of the job that was in
  // flight while one arrived may hold an older state than the stream's:
  // the stream's state wins and the job is read again.
  let stateEvents = 0;
  let readAt = Date.now(); // when job was read: its ETA counts from here

  const charts = {
    // The loss reads on a log axis once it has fallen 100x (the toggle
    // still wins); dots mark the evals only; the lr schedule is never
    // smoothed.
    loss: new Chart({title: 'Loss', autoLog: 100, dots: (s, i) => i === 1,
      series: [{name: 'train', color: '#2f7ed8'}, {name: 'eval', color: '#e4572e'}]}),
    lr: new Chart({title: 'Learning rate', yMin: 0, smooth: false, series: [{name: 'lr', color: '#a66cc1'}]}),
    tps: new Chart({title: 'Tokens/s', yMin: 0, series: [{name: 'tokens/s', color: '#17a589'}]}),
    gn: new Chart({title: 'Grad norm', yMin: 0, series: [{name: 'grad norm', color: '#f0a202'}]}),
    util: new Chart({title: 'GPU utilisation (%)', xKind: 'time', yMin: 0, yMax: 100,
      emptyText: 'waiting for GPU samples…', yFormat: (v) => `${Math.round(v)}%`}),
    mem: new Chart({title: 'GPU memory (GiB)', xKind: 'time', yMin: 0,
      emptyText: 'waiting for GPU samples…', yFormat: (v) => `${v.toFixed(2)} GiB`}),
  };
  charts.loss.element.id = 'chart-loss';
  charts.lr.element.id = 'chart-lr';
  charts.tps.element.id = 'chart-tps';
  charts.gn.element.id = 'chart-grad-norm';
  charts.util.element.id = 'chart-gpu-util';
  charts.mem.element.id = 'chart-gpu-mem';

  const title = h('h1', null, `Job ${id}`);
  const badge = h('span');
  const buttons = {
    pause: h('button', {type: 'button', id: 'btn-pause', disabled: true, onclick: () => act('pause')}, 'Pause'),
    resume: h('button', {type: 'button', id: 'btn-resume', disabled: true, onclick: () => act('resume')}, 'Resume'),
    cancel: h('button', {type: 'button', id: 'btn-cancel', class: 'danger', disabled: true, onclick: () => act('cancel')}, 'Cancel'),
    delete: h('button', {type: 'button', id: 'btn-delete', class: 'danger', disabled: true, onclick: () => act('delete')}, 'Delete'),
  };
  const actionError = h('p', {class: 'error', id: 'action-error', role: 'alert', hidden: true});
  const jobError = h('p', {class: 'error job-error', hidden: true});
  // An upload to the job's store that failed for good: shown whatever the
  // state, so a succeeded job never looks fine when a checkpoint is missing.
  const ckptError = h('p', {class: 'error checkpoint-error', id: 'checkpoint-error', role: 'alert', hidden: true});
  const loadError = h('p', {class: 'error', id: 'load-error', hidden: true});
  const summary = h('div', {class: 'summary'});
  const streamState = h('span', {class: 'stream-state'});
  const ckptBody = h('tbody');
  const ckptEmpty = h('p', {class: 'notice'}, 'No checkpoints yet.');
  const ckptTable = h('div', {class: 'table-wrap', hidden: true},
    h('table', {class: 'checkpoints', id: 'checkpoints'},
      h('thead', null, h('tr', null, ['Step', 'Size', 'Upload', 'Remote URI', 'Local path', 'Created']
        .map((t) => h('th', {scope: 'col'}, t)))), ckptBody));
  const logPre = h('pre', {class: 'log', id: 'log-tail'});
  const notices = h('ul', {class: 'notices'});
  const specPre = h('pre', {class: 'spec', id: 'job-spec'});
  const root = h('div', {class: 'job-view', id: 'job-view', dataset: {jobId: String(id)}});

  fill(root,
    h('div', {class: 'view-head'},
      h('a', {href: '#/', class: 'back'}, '← Jobs'), title, badge, h('span', {class: 'spacer'}),
      h('div', {class: 'actions'}, buttons.pause, buttons.resume, buttons.cancel, buttons.delete)),
    actionError, loadError, jobError, ckptError, summary,
    h('section', {class: 'charts'},
      h('div', {class: 'charts-head'}, h('h2', null, 'Training'), streamState, h('span', {class: 'spacer'}),
        smoothingControl(() => Object.values(charts), 'job-smoothing')),
      h('div', {class: 'chart-grid'}, charts.loss.element, charts.lr.element, charts.tps.element,
        charts.gn.element, charts.util.element, charts.mem.element)),
    h('section', null, h('h2', null, 'Checkpoints'),
      ckptTable, ckptEmpty),
    tryBox(id),
    h('section', null, h('h2', null, 'Engine notices'), notices),
    h('section', null, h('h2', null, 'Log'), logPre),
    h('section', null, h('h2', null, 'Spec'), specPre));
  main.append(root);

  // A CPU job has no GPU samples: its GPU charts stay out of the way.
  charts.util.element.hidden = true;
  charts.mem.element.hidden = true;
  function showGpuCharts(on) {
    if (!on || !charts.util.element.hidden) return;
    charts.util.element.hidden = false;
    charts.mem.element.hidden = false;
  }

  // ---- summary and controls ------------------------------------------

  // "all trainable" for full fine-tuning, "4.19M trainable (0.38%)" for
  // LoRA: under the count, so the card never cuts "112k (112k trai…".
  function trainableLabel(e) {
    if (e.trainable === undefined || e.trainable === null) return null;
    if (e.trainable === e.params) return 'all trainable';
    const pct = e.params ? ` (${(100 * e.trainable / e.params).toPrecision(2)}%)` : '';
    return `${fmtCount(e.trainable)} trainable${pct}`;
  }

  function renderSummary() {
    if (!job) return;
    title.textContent = `${job.name || 'Job'} #${job.id}`;
    // A running job that has sent no metric for its stall_after_s: a badge
    // beside its state, and no ETA (clock.js).
    const stalled = job.state === 'running' && !!job.stalled_at;
    fill(badge, stateBadge(job.state), stalled ? h('span', {class: 'stall-badge', id: 'job-stall',
      title: `No metric since ${fmtTime(job.stalled_at)} (stall_after_s)`}, 'stalled') : null);
    root.dataset.stalled = stalled ? 'yes' : 'no';
    root.dataset.state = job.state;
    const allowed = allowedActions(job.state);
    for (const [name, b] of Object.entries(buttons)) b.disabled = !allowed.includes(name);
    const p = job.progress || {};
    const m = job.last_metric || {};
    const e = job.last_eval || {};
    const max = p.max_steps || (job.spec && job.spec.hyperparameters && job.spec.hyperparameters.max_steps);
    const frac = p.fraction ?? (max ? (p.step || 0) / max : 0);
    const eta = etaDeadline(job, readAt);
    // A value too wide for its card ends in an ellipsis; the whole text is
    // its tooltip. sub is a second, smaller line that may wrap.
    const item = (k, v, sub) => h('div', {class: 'stat'}, h('span', {class: 'stat-k'}, k),
      h('span', {class: 'stat-v', title: typeof v === 'string' ? v : null}, v),
      sub ? h('span', {class: 'stat-sub'}, sub) : null);
    fill(summary,
      item('Progress', h('div', {class: 'progress'},
        h('div', {class: 'bar'}, h('div', {class: `fill state-${job.state}`, style: {width: `${Math.min(100, frac * 100)}%`}})),
        h('span', {class: 'progress-text', id: 'progress-text'}, `${p.step || 0} / ${max || '?'}`))),
      job.state === 'queued' && job.queue_position ? item('Queue', `#${job.queue_position}`) : null,
      item('Loss', h('span', {id: 'last-loss'}, fmtLoss(m.loss))),
      item('Eval loss', fmtLoss(e.loss)),
      item('LR', fmtLr(m.lr)),
      item('Tokens/s', fmtInt(m.tokens_per_s)),
      // Only a running job has an ETA (not a paused or finished one).
      item('ETA', h('span', {id: 'job-eta', title: stalled ? 'stalled: no ETA' : null, ...etaAttrs(eta)},
        etaText(eta, Date.now()))),
      item('Method', (job.spec && job.spec.method) || 'full'),
      item('Model', modelLabel(job.spec)),
      item('GPUs', gpuLabel(job)),
      item('Cost', h('span', {id: 'job-cost'}, fmtCost(job.cost))),
      item('Backend', job.backend || '–'),
      job.engine ? item('Parameters', fmtCount(job.engine.params), trainableLabel(job.engine)) : null,
      item('Restarts', `${job.restarts ?? 0} / ${job.max_restarts ?? '?'}`),
      item('Created', fmtTime(job.created_at),
        h('span', {id: 'job-age', dataset: {since: job.created_at || '', sinceSuffix: ' ago'}}, `${fmtAge(job.created_at)} ago`)),
      job.started_at ? item('Started', fmtTime(job.started_at)) : null,
      job.finished_at ? item('Finished', fmtTime(job.finished_at)) : null);
    jobError.hidden = !job.error;
    jobError.textContent = job.error ? `Error: ${typeof job.error === 'string' ? job.error : JSON.stringify(job.error)}` : '';
    ckptError.hidden = !job.checkpoint_error;
    ckptError.textContent = job.checkpoint_error ? `Not in the store: ${job.checkpoint_error}` : '';
    showGpuCharts(job.gpus && job.gpus.length > 0 || !!(job.spec && job.spec.resources && job.spec.resources.gpus));
    const xmax = max ? Number(max) : null;
    for (const c of [charts.loss, charts.lr, charts.tps, charts.gn]) c.setXMax(xmax);
  }

  async function act(action) {
    actionError.hidden = true;
    if (action === 'delete' && !confirm(`Delete job ${id} and its local files?`)) return;
    for (const b of Object.values(buttons)) b.disabled = true;
    try {
      if (action === 'delete') {
        await api(`/jobs/${id}`, {method: 'DELETE'});
        location.hash = '#/';
        return;
      }
      const sent = stateEvents;
      const j = await api(`/jobs/${id}/${action}`, {method: 'POST'});
      if (j && j.id) { adopt(j, sent); renderSummary(); }
      // A resumed job gets a new stream life: make sure it is connected.
      if (action === 'resume') { terminalSeen = false; ensureStream(); }
    } catch (e) {
      actionError.hidden = false;
      actionError.textContent = `${action} refused: ${e.message}${e.code ? ` (${e.code})` : ''}`;
      refreshJob();
    }
  }

  // Takes a job read that was sent when stateEvents was `sent`.
  function adopt(j, sent) {
    if (sent !== stateEvents && job) {
      j.state = job.state;
      later('job', refreshJob, 100);
    }
    job = j;
    readAt = Date.now();
  }

  async function refreshJob() {
    try {
      const sent = stateEvents;
      const j = await api(`/jobs/${id}`);
      if (!alive) return;
      adopt(j, sent);
      loadError.hidden = true;
      renderSummary();
      specPre.textContent = JSON.stringify(j.spec, null, 2);
    } catch (e) {
      if (!alive) return;
      // Shown until the next successful read (a server restart is brief).
      loadError.hidden = false;
      loadError.textContent = e.status === 404 ? `Job ${id} does not exist.`
        : `Could not read the job (${e.message}); retrying.`;
    }
  }

  // ---- live events ---------------------------------------------------

  function onEvent(type, ev) {
    if (typeof ev.seq === 'number') {
      if (ev.seq <= lastSeq) { dupes++; root.dataset.dupes = String(dupes); return; }
      lastSeq = ev.seq;
      root.dataset.seq = String(lastSeq);
    }
    const d = ev.data || {};
    switch (type) {
      case 'metric':
        if (Number.isFinite(d.step)) {
          charts.loss.append(0, d.step, d.loss);
          charts.lr.append(0, d.step, d.lr);
          if (d.tokens_per_s !== undefined) charts.tps.append(0, d.step, d.tokens_per_s);
          if (d.grad_norm !== undefined) charts.gn.append(0, d.step, d.grad_norm);
        }
        if (job) {
          // A metric newer than the stall ends it (the next read agrees);
          // the replayed history is older and leaves it.
          if (job.stalled_at && Date.parse(ev.ts) > Date.parse(job.stalled_at)) job.stalled_at = null;
          job.last_metric = d;
          job.progress = {...(job.progress || {}), step: d.step};
          const max = job.progress.max_steps;
          if (max) job.progress.fraction = d.step / max;
          scheduleSummary();
        }
        break;
      case 'eval':
        charts.loss.append(1, d.step, d.loss);
        if (job) { job.last_eval = d; scheduleSummary(); }
        break;
      case 'gpu': {
        showGpuCharts(true);
        const t = Date.parse(ev.ts) || Date.now();
        const name = `gpu ${d.index}`;
        const color = GPU_COLORS[(d.index || 0) % GPU_COLORS.length];
        if (d.util !== undefined && d.util !== null) charts.util.append(charts.util.seriesIndex(name, color), t, d.util);
        if (d.mem_used !== undefined && d.mem_used !== null) {
          charts.mem.append(charts.mem.seriesIndex(name, color), t, d.mem_used / 2 ** 30);
        }
        break;
      }
      case 'state':
        stateEvents++;
        if (job) { job.state = d.to; renderSummary(); }
        if (TERMINAL.has(d.to)) terminalSeen = true;
        // A replay delivers many state events at once: coalesce the fetches.
        later('job', refreshJob, 100);
        later('ckpt', loadCheckpoints, 300);
        // A log followed since before this run (queued, paused, or a lost
        // connection) is reopened; one already following a run is kept.
        if ((d.to === 'running' || d.to === 'starting') && (!logFollow || logOpenedFor !== 'running')) {
          later('log', restartLog, 300);
        }
        break;
      case 'checkpoint':
        later('ckpt', loadCheckpoints, 300);
        // A failed upload may have set the job's checkpoint_error.
        if (d.state === 'failed') later('job', refreshJob, 300);
        break;
      case 'started':
        if (job) { job.engine = d; scheduleSummary(); }
        break;
      case 'budget':
      case 'stall':
      case 'idle_gpu': {
        // docs/server.md "Operations": said among the notices as warnings.
        const text = type === 'idle_gpu'
          ? `GPU ${(d.gpus || []).join(', ')} under ${d.threshold}% utilisation for ${d.idle_s} s`
          : d.reason || `${type}: ${d.limit || ''}`;
        notices.append(h('li', {class: 'level-warn ops-notice', dataset: {type}}, `${ev.ts ? fmtTime(ev.ts) + ' ' : ''}${text}`));
        while (notices.childElementCount > 200) notices.firstElementChild.remove();
        later('job', refreshJob, 300);
        break;
      }
      case 'log':
        notices.append(h('li', {class: `level-${d.level || 'info'}`}, `${ev.ts ? fmtTime(ev.ts) + ' ' : ''}${d.line || ''}`));
        while (notices.childElementCount > 200) notices.firstElementChild.remove();
        break;
      default:
        break;
    }
  }

  const timers = {};
  function later(key, fn, ms) {
    clearTimeout(timers[key]);
    timers[key] = setTimeout(() => { if (alive) fn(); }, ms);
  }

  let summaryPending = false;
  function scheduleSummary() {
    if (summaryPending) return;
    summaryPending = true;
    requestAnimationFrame(() => { summaryPending = false; if (alive) renderSummary(); });
  }

  function ensureStream() {
    if (stream) return;
    stream = openStream(`/jobs/${id}/events`, {
      from: lastSeq,
      onEvent,
      onStatus: (st, detail) => {
        streamState.dataset.state = st;
        streamState.textContent = {open: 'live', retry: 'reconnecting…', error: detail ? detail.message : 'error',
          closed: terminalSeen ? 'finished' : 'closed'}[st] || st;
        if (st === 'closed') stream = null;
        if (st === 'open') refreshJob();
      },
      // The server ends a job's stream after its terminal state (and, for a
      // paused job, there is nothing more until it is resumed).
      shouldReconnect: () => !terminalSeen && !(job && job.state === 'paused'),
    });
  }

  // ---- checkpoints ---------------------------------------------------

  async function loadCheckpoints() {
    clearTimeout(ckptTimer);
    try {
      const res = await api(`/jobs/${id}/checkpoints`);
      if (!alive) return;
      const list = (res.checkpoints || []).slice().sort((a, b) => b.step - a.step);
      fill(ckptBody, list.map((c) => h('tr', {dataset: {step: String(c.step), state: c.state}},
        h('td', {class: 'num'}, String(c.step)),
        h('td', {class: 'num'}, fmtBytes(c.bytes)),
        h('td', null, h('span', {class: `upload upload-${c.state}`}, c.state),
          c.error ? h('div', {class: 'error small'}, c.error) : null),
        h('td', {class: 'uri'}, c.remote_uri || '–'),
        h('td', {class: 'uri'}, c.local_path || '–'),
        h('td', null, fmtTime(c.created_at)))));
      ckptEmpty.hidden = list.length > 0;
      ckptTable.hidden = list.length === 0;
      // Uploads progress without job events: poll while any is in flight.
      if (list.some((c) => c.state === 'uploading' || (c.state === 'local' && job && job.spec && job.spec.checkpoint && job.spec.checkpoint.store))) {
        ckptTimer = setTimeout(loadCheckpoints, 5000);
      }
    } catch { /* shown as empty; the next checkpoint event retries */ }
  }

  // ---- log tail ------------------------------------------------------

  let logText = '';
  let logOpenedFor = null; // the job's state when the log was (re)opened
  function restartLog() {
    if (logFollow) logFollow.close();
    logText = '';
    logOpenedFor = job ? job.state : null;
    const active = !job || !TERMINAL.has(job.state);
    logFollow = followText(`/jobs/${id}/logs${active ? '?follow=1' : ''}`, (chunk) => {
      logText += chunk;
      // Keep only the tail: the log of a long run can be large.
      if (logText.length > 200000) logText = logText.slice(-100000);
      const lines = logText.split('\n');
      if (lines.length > LOG_LINES + 1) logText = lines.slice(-LOG_LINES - 1).join('\n');
      const stick = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
      logPre.textContent = logText;
      if (stick) logPre.scrollTop = logPre.scrollHeight;
    }, (err) => {
      logFollow = null;
      if (err && alive && !logText) logPre.textContent = `(no log: ${err.message})`;
    });
  }

  // ETA, queue position and GPUs come from the server's view of the job:
  // re-read it every few seconds while it can still change.
  let pollTimer = null;
  function pollJob() {
    pollTimer = setTimeout(async () => {
      if (!alive) return;
      if (job && !TERMINAL.has(job.state) && !document.hidden) await refreshJob();
      if (alive) pollJob();
    }, 5000);
  }
  pollJob();

  (async () => {
    await refreshJob();
    if (!alive) return;
    ensureStream();
    loadCheckpoints();
    restartLog();
  })();

  return () => {
    alive = false;
    if (stream) stream.close();
    if (logFollow) logFollow.close();
    clearTimeout(ckptTimer);
    clearTimeout(pollTimer);
    for (const t of Object.values(timers)) clearTimeout(t);
    for (const c of Object.values(charts)) c.destroy();
  };
}
