// view-jobs.js — the jobs list: every job's state, progress and latest
// metrics, filterable by state and by tag (the server filters: GET
// /jobs?tag=), updated live; a running job that stopped reporting shows a
// "stalled" badge (the job's stalled_at). Checkboxes select jobs for the
// compare view (#/compare?ids=...); the selection lasts the tab's session.
// Ages and ETAs are marked for the page clock (clock.js), which keeps them
// current between reads.
//
// State changes arrive on the shared /events feed and re-fetch only that
// job's row. Metrics are not on /events (they would flood it), so while
// any job is active the view polls GET /jobs?state=<active states> every
// few seconds — one small request however many jobs are listed.

import {api} from './api.js';
import {h, fill, STATES, stateBadge, fmtLoss, fmtInt, fmtAge, fmtCost, costHours, modelLabel, gpuLabel} from './util.js';
import {etaDeadline, etaText, etaAttrs} from './clock.js';

const ACTIVE = ['starting', 'running', 'stopping'];
const POLL_MS = 3000;
const PAGE = 200;
const SELECTED_KEY = 'trainyard.compare';
export const COMPARE_MAX = 10;

function loadSelection() {
  try { return new Set(JSON.parse(sessionStorage.getItem(SELECTED_KEY) || '[]').filter(Number.isInteger)); } catch { return new Set(); }
}

export function mount(main, app, params) {
  const jobs = new Map();        // id -> job
  const rows = new Map();        // id -> <tr>
  let filter = params.query.get('state') || '';
  let tag = params.query.get('tag') || '';
  let nextCursor = null;
  let alive = true;
  const pendingRow = new Set();
  const readAt = new Map();      // id -> when the job was read (ETA base)
  const selected = loadSelection();

  const chips = h('div', {class: 'chips', role: 'tablist'});
  const tagInput = h('input', {type: 'search', id: 'tag-filter', placeholder: 'Filter by tag', value: tag,
    'aria-label': 'Filter by tag', onchange: () => setTag(tagInput.value.trim())});
  const tagBar = h('div', {class: 'tag-filter'}, tagInput);
  const tbody = h('tbody');
  const empty = h('p', {class: 'notice', hidden: true});
  const error = h('p', {class: 'error', hidden: true});
  const more = h('button', {type: 'button', hidden: true, onclick: () => loadPage(nextCursor)}, 'Load older jobs');
  // Ticks every job shown (a state or tag filter narrows them), or none.
  const pickAll = h('input', {type: 'checkbox', id: 'pick-all', 'aria-label': 'Select all shown jobs to compare',
    onchange: () => {
      for (const id of rows.keys()) { if (pickAll.checked) selected.add(id); else selected.delete(id); }
      saveSelection();
      for (const [id, tr] of rows) tr.querySelector('input.pick-job').checked = selected.has(id);
    }});
  const table = h('table', {class: 'jobs', id: 'jobs-table'},
    h('thead', null, h('tr', null,
      h('th', {scope: 'col', class: 'pick'}, pickAll),
      ['ID', 'Name', 'State', 'Method', 'Model', 'Progress', 'Loss', 'Tokens/s', 'ETA', 'GPUs', 'Cost', 'Age']
        .map((t) => h('th', {scope: 'col'}, t)))),
    tbody);
  const compareBtn = h('button', {type: 'button', id: 'compare-btn', onclick: () => {
    location.hash = `#/compare?ids=${[...selected].sort((a, b) => a - b).join(',')}`;
  }});
  const clearBtn = h('button', {type: 'button', class: 'link', id: 'compare-clear', onclick: () => {
    selected.clear(); saveSelection(); renderAll();
  }}, 'clear selection');
  main.append(
    h('div', {class: 'view-head'}, h('h1', null, 'Jobs'), h('span', {class: 'spacer'}), compareBtn, clearBtn,
      h('a', {class: 'button primary', href: '#/submit'}, 'Submit a job')),
    chips, tagBar, error, h('div', {class: 'table-wrap'}, table), empty, more);

  function saveSelection() {
    try { sessionStorage.setItem(SELECTED_KEY, JSON.stringify([...selected])); } catch { /* this page only */ }
    renderCompare();
  }

  // "Compare 3 jobs", enabled from two; at most COMPARE_MAX (one colour each).
  function renderCompare() {
    const n = selected.size;
    compareBtn.textContent = n >= 2 ? `Compare ${n} jobs` : 'Compare (select 2 or more)';
    compareBtn.disabled = n < 2 || n > COMPARE_MAX;
    compareBtn.title = n > COMPARE_MAX ? `At most ${COMPARE_MAX} jobs at once` : '';
    clearBtn.hidden = n === 0;
    pickAll.checked = rows.size > 0 && [...rows.keys()].every((id) => selected.has(id));
  }

  function hashFor() {
    const q = new URLSearchParams();
    if (filter) q.set('state', filter);
    if (tag) q.set('tag', tag);
    const s = q.toString();
    return s ? `#/?${s}` : '#/';
  }

  // A tag filter is the server's (GET /jobs?tag=): older pages hold only
  // tagged jobs too.
  function setTag(t) {
    tag = t;
    tagInput.value = t;
    history.replaceState(null, '', hashFor());
    loadPage(null);
  }

  // Adds the tag filter to a /jobs query.
  function withTag(q) { if (tag) q.set('tag', tag); return q; }

  function renderChips() {
    const counts = {};
    for (const j of jobs.values()) counts[j.state] = (counts[j.state] || 0) + 1;
    const chip = (state, label, n) => h('button', {
      type: 'button', role: 'tab', class: 'chip' + (filter === state ? ' active' : ''),
      'aria-selected': String(filter === state), dataset: {state: state || 'all'},
      onclick: () => {
        filter = state;
        history.replaceState(null, '', hashFor());
        renderChips(); renderAll();
      },
    }, state ? stateBadge(state) : label, h('span', {class: 'count'}, String(n)));
    fill(chips, chip('', 'all', jobs.size),
      STATES.filter((s) => counts[s] || s === filter).map((s) => chip(s, s, counts[s] || 0)));
  }

  function progressCell(j) {
    if (j.state === 'queued' && j.queue_position) {
      return h('span', {class: 'queue-pos'}, `#${j.queue_position} in queue`);
    }
    const p = j.progress || {};
    const max = p.max_steps || (j.spec && j.spec.hyperparameters && j.spec.hyperparameters.max_steps) || 0;
    const step = p.step || 0;
    const frac = p.fraction ?? (max ? step / max : 0);
    return h('div', {class: 'progress', title: `${Math.round(frac * 100)}%`},
      h('div', {class: 'bar'}, h('div', {class: `fill state-${j.state}`, style: {width: `${Math.min(100, frac * 100)}%`}})),
      h('span', {class: 'progress-text'}, `${step} / ${max || '?'}`));
  }

  function renderRow(j) {
    const m = j.last_metric || {};
    // Only a running job has an ETA; the page clock counts it down.
    const eta = etaDeadline(j, readAt.get(j.id) || Date.now());
    const tr = h('tr', {
      dataset: {jobId: String(j.id), state: j.state},
      class: 'job-row', tabindex: '0',
      onclick: () => { location.hash = `#/jobs/${j.id}`; },
      onkeydown: (e) => { if (e.key === 'Enter') location.hash = `#/jobs/${j.id}`; },
    },
    h('td', {class: 'pick', onclick: (e) => e.stopPropagation()},
      h('input', {type: 'checkbox', class: 'pick-job', checked: selected.has(j.id),
        'aria-label': `Select job ${j.id} to compare`,
        onchange: (e) => { if (e.target.checked) selected.add(j.id); else selected.delete(j.id); saveSelection(); }})),
    h('td', {class: 'num'}, h('a', {href: `#/jobs/${j.id}`}, String(j.id))),
    h('td', {class: 'name'}, j.name || (j.spec && j.spec.name) || '–',
      (j.tags || []).map((t) => h('button', {type: 'button', class: 'tag', title: `Only jobs tagged ${t}`,
        onclick: (e) => { e.stopPropagation(); setTag(t); }}, t))),
    h('td', {class: 'state-cell'}, stateBadge(j.state),
      // No metric for stall_after_s (docs/server.md "Operations").
      j.state === 'running' && j.stalled_at ? h('span', {class: 'stall-badge',
        title: `No metric since ${j.stalled_at}`}, 'stalled') : null,
      // An upload to the store failed for good: never a plain "succeeded".
      j.checkpoint_error ? h('span', {class: 'ckpt-warn', title: `Not in the store: ${j.checkpoint_error}`,
        'aria-label': 'checkpoint upload failed'}, ' ⚠') : null),
    h('td', null, (j.spec && j.spec.method) || 'full'),
    h('td', {class: 'model', title: (j.spec && j.spec.model && j.spec.model.path) || ''}, modelLabel(j.spec)),
    h('td', {class: 'progress-cell'}, progressCell(j)),
    h('td', {class: 'num loss'}, fmtLoss(m.loss)),
    h('td', {class: 'num'}, fmtInt(m.tokens_per_s)),
    h('td', {class: 'num eta', ...etaAttrs(eta)}, etaText(eta, Date.now())),
    h('td', null, gpuLabel(j)),
    h('td', {class: 'num cost', title: costHours(j.cost)}, fmtCost(j.cost)),
    h('td', {class: 'num age', title: j.created_at || '', dataset: {since: j.created_at || ''}}, fmtAge(j.created_at)));
    return tr;
  }

  function visible(j) { return (!filter || j.state === filter) && (!tag || (j.tags || []).includes(tag)); }

  function renderAll() {
    const ids = [...jobs.keys()].sort((a, b) => b - a);
    const frag = [];
    rows.clear();
    for (const id of ids) {
      const j = jobs.get(id);
      if (!visible(j)) continue;
      const tr = renderRow(j);
      rows.set(id, tr);
      frag.push(tr);
    }
    fill(tbody, frag);
    empty.hidden = frag.length > 0;
    empty.textContent = tag ? `No ${filter} jobs tagged ${tag}.`
      : jobs.size ? `No ${filter} jobs.` : 'No jobs yet. Submit one, or run `trainyard demo`.';
    more.hidden = !nextCursor;
    renderCompare();
  }

  // Puts one job into the table in place (or where its id sorts).
  function upsert(j) {
    const prev = jobs.get(j.id);
    jobs.set(j.id, j);
    readAt.set(j.id, Date.now());
    if (!prev || prev.state !== j.state) renderChips();
    const old = rows.get(j.id);
    if (!visible(j)) {
      if (old) { old.remove(); rows.delete(j.id); renderCompare(); }
      return;
    }
    const tr = renderRow(j);
    if (old) { old.replaceWith(tr); rows.set(j.id, tr); return; }
    rows.set(j.id, tr);
    renderCompare();
    let before = null;
    for (const [id, r] of rows) if (id > j.id && (!before || id < Number(before.dataset.jobId))) before = r;
    // Rows are newest first: insert after the smallest id above this one.
    if (before) before.after(tr); else tbody.prepend(tr);
    empty.hidden = true;
  }

  async function loadPage(cursor) {
    try {
      const q = withTag(new URLSearchParams({limit: String(PAGE)}));
      if (cursor) q.set('cursor', cursor);
      const res = await api(`/jobs?${q}`);
      if (!alive) return;
      if (!cursor) jobs.clear();
      const now = Date.now();
      for (const j of res.jobs) { jobs.set(j.id, j); readAt.set(j.id, now); }
      nextCursor = res.next_cursor || null;
      error.hidden = true;
      renderChips();
      renderAll();
    } catch (e) {
      if (!alive) return;
      error.hidden = false;
      error.textContent = `Could not list jobs: ${e.message}`;
    }
  }

  // Re-fetches one job, coalescing bursts of events about it.
  function refreshJob(id) {
    if (pendingRow.has(id)) return;
    pendingRow.add(id);
    setTimeout(async () => {
      pendingRow.delete(id);
      try {
        const j = await api(`/jobs/${id}`);
        if (alive) upsert(j);
      } catch (e) {
        if (alive && e.status === 404 && jobs.has(id)) {
          jobs.delete(id);
          const r = rows.get(id);
          if (r) { r.remove(); rows.delete(id); }
          renderChips();
        }
      }
    }, 50);
  }

  let queuedTimer = null;
  function refreshQueued() {
    clearTimeout(queuedTimer);
    queuedTimer = setTimeout(async () => {
      try {
        const res = await api(`/jobs?${withTag(new URLSearchParams({state: 'queued', limit: String(PAGE)}))}`);
        if (alive) for (const j of res.jobs) upsert(j);
      } catch { /* the next state event or reload retries */ }
    }, 150);
  }

  async function poll() {
    if (!alive) return;
    const active = [...jobs.values()].some((j) => ACTIVE.includes(j.state));
    if (active && !document.hidden) {
      try {
        const res = await api(`/jobs?${withTag(new URLSearchParams({state: ACTIVE.join(','), limit: String(PAGE)}))}`);
        if (!alive) return;
        for (const j of res.jobs) upsert(j);
      } catch { /* the next poll tries again; the feed shows connectivity */ }
    }
    // Ages and ETAs tick without a request: the page clock (clock.js).
    timer = setTimeout(poll, POLL_MS);
  }

  const offEvents = app.feed.on((type, ev) => {
    if (!ev.job_id) return;
    if (type === 'state' || type === 'started') {
      refreshJob(ev.job_id);
      // A state change can move every queued job's position: one request
      // re-reads them all.
      if (type === 'state' && [...jobs.values()].some((j) => j.state === 'queued' && j.id !== ev.job_id)) {
        refreshQueued();
      }
    }
  });
  // After a reconnect the feed may have missed events: reload everything.
  let wasDown = false;
  const offStatus = app.feed.onStatus((st) => {
    if (st === 'retry' || st === 'error') wasDown = true;
    if (st === 'open' && wasDown) { wasDown = false; loadPage(null); }
  });

  let timer = setTimeout(poll, POLL_MS);
  renderChips();
  renderCompare();
  loadPage(null);

  return () => {
    alive = false;
    clearTimeout(timer);
    clearTimeout(queuedTimer);
    offEvents();
    offStatus();
  };
}
