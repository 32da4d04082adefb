// view-compare.js — several jobs side by side (#/compare?ids=3,5,8): their
// loss, eval loss, learning rate, tokens/s and grad norm overlaid, one
// colour per job, against step or against the time since each job first
// started; a smoothing slider and per-chart log toggles as on the job
// page; and the table of spec keys whose values differ between the jobs.
//
// The data are each job's events, read through catchup.js (a bounded pool
// of event streams, replayed from seq 0 and continued while a job runs).
// The events are kept, so the step/time toggle refills the charts from
// memory without asking the server again. An address naming fewer than two
// jobs, more than MAX_COMPARE, something that is not an id, or jobs that do
// not exist says so in words instead of showing empty charts.

import {api} from './api.js';
import {Chart} from './charts.js';
import {CatchUp} from './catchup.js';
import {smoothingControl} from './chart-controls.js';
import {parseIds, METRICS, COLORS, MAX_COMPARE, xOf, originOf, specDiff} from './compare-data.js';
import {h, fill, stateBadge} from './util.js';

export function mount(main, app, {query}) {
  const {ids, bad} = parseIds(query);
  const root = h('div', {class: 'compare-view', id: 'compare-view'});
  const message = h('div', {id: 'compare-message', role: 'alert'});
  main.append(root);
  fill(root, h('div', {class: 'view-head'}, h('a', {href: '#/', class: 'back'}, '← Jobs'), h('h1', null, 'Compare runs')),
    message);

  // A clear word rather than a blank page.
  const say = (cls, ...text) => message.append(h('p', {class: cls}, ...text));
  const backLink = () => h('a', {href: '#/'}, 'the jobs list');
  if (bad.length) say('error', `Not a job id: ${bad.join(', ')}.`);
  if (ids.length > MAX_COMPARE) {
    say('error', `At most ${MAX_COMPARE} jobs can be compared at once; the address names ${ids.length}.`);
    return () => {};
  }
  if (ids.length < 2) {
    say('notice', ids.length === 1
      ? ['Comparing needs at least two jobs; the address names only ', h('a', {href: `#/jobs/${ids[0]}`}, `job ${ids[0]}`),
        '. Tick two or more jobs in ', backLink(), ' and press Compare.']
      : ['No jobs to compare. Tick two or more jobs in ', backLink(), ' and press Compare.']);
    root.dataset.ready = 'message';
    return () => {};
  }

  let alive = true;
  let mode = 'step';
  let loader = null;
  const jobs = ids.map(() => null);      // the latest read of each job
  const events = ids.map(() => []);      // metric and eval events, in seq order
  const origins = ids.map(() => NaN);    // time origins (ms)
  const missing = new Set();
  const loaded = new Set();              // read at least once
  // One entry per job in the address's order, filled in as each is read.
  const legendItems = ids.map((id) => h('li', {dataset: {jobId: String(id), state: 'unknown'}}, `#${id} …`));

  const charts = METRICS.map((m) => {
    // Dots only where a series is sparse by nature (evals every N steps),
    // never on a training curve however short; the learning rate is a
    // schedule, drawn unsmoothed.
    const c = new Chart({title: m.title, xKind: 'step', yMin: m.key === 'eval' || m.key === 'loss' ? undefined : 0,
      dots: m.sparse ? 'sparse' : false, smooth: m.smooth !== false,
      emptyText: m.key === 'eval' ? 'no eval events' : 'waiting for data…',
      series: ids.map((id, i) => ({name: `#${id}`, color: COLORS[i % COLORS.length]}))});
    c.element.id = `compare-${m.key}`;
    return c;
  });

  const legend = h('ul', {class: 'compare-legend', id: 'compare-legend'}, legendItems);
  const xToggle = h('fieldset', {class: 'xkind', id: 'compare-x'},
    h('legend', {class: 'sr-only'}, 'X axis'),
    ['step', 'time'].map((k) => h('label', null,
      h('input', {type: 'radio', name: 'compare-x', value: k, checked: k === mode,
        onchange: (e) => { if (e.target.checked) setMode(k); }}),
      k === 'step' ? 'by step' : 'by time')));
  const diffBox = h('div', {id: 'spec-diff'});
  const body = h('div', {hidden: true},
    legend,
    h('div', {class: 'compare-controls'}, xToggle, smoothingControl(() => charts, 'compare-smoothing')),
    h('div', {class: 'chart-grid compare-grid'}, charts.map((c) => c.element)),
    h('section', null, h('h2', null, 'Spec differences'), diffBox));
  root.append(body);

  function label(i) {
    const j = jobs[i];
    return `#${ids[i]}${j && j.name ? ' ' + j.name : ''}`;
  }

  function renderLegend(i) {
    const j = jobs[i];
    const p = (j && j.progress) || {};
    const li = h('li', {dataset: {jobId: String(ids[i]), state: j ? j.state : 'unknown'}},
      h('i', {style: {background: COLORS[i % COLORS.length]}}),
      h('a', {href: `#/jobs/${ids[i]}`}, label(i)), ' ', j ? stateBadge(j.state) : null,
      j ? h('span', {class: 'progress-text'}, ` ${p.step || 0} / ${p.max_steps || '?'}`) : null);
    legendItems[i].replaceWith(li);
    legendItems[i] = li;
    // The charts' keys carry the job's name once it is known.
    for (const c of charts) {
      if (c.series[i].name !== label(i)) { c.series[i].name = label(i); c.renderLegend(); }
    }
  }

  function renderDiff() {
    const present = ids.map((_, i) => i).filter((i) => jobs[i]);
    const rows = specDiff(present.map((i) => jobs[i].spec));
    if (!rows.length) { fill(diffBox, h('p', {class: 'notice'}, 'The specs are identical.')); return; }
    fill(diffBox, h('div', {class: 'table-wrap'}, h('table', {class: 'spec-diff'},
      h('thead', null, h('tr', null, h('th', {scope: 'col'}, 'Key'),
        present.map((i) => h('th', {scope: 'col'}, h('i', {class: 'swatch', style: {background: COLORS[i % COLORS.length]}}), label(i))))),
      h('tbody', null, rows.map((r) => h('tr', {dataset: {key: r.key}}, h('th', {scope: 'row'}, r.key),
        r.values.map((v) => h('td', {class: v.present ? null : 'absent', title: v.text}, v.text))))))));
  }

  // Puts one event on the charts under the current x mode.
  function plot(i, ev) {
    if (mode === 'time' && !Number.isFinite(origins[i])) origins[i] = originOf(jobs[i], events[i]);
    const x = xOf(ev, mode, origins[i]);
    for (let k = 0; k < METRICS.length; k++) {
      const m = METRICS[k];
      if (m.from === ev.type) charts[k].append(i, x, m.value(ev.data));
    }
  }

  function setMode(m) {
    mode = m;
    root.dataset.x = m;
    for (const c of charts) c.reset(m === 'time' ? 'elapsed' : 'step');
    for (let i = 0; i < ids.length; i++) for (const ev of events[i]) plot(i, ev);
  }

  function settle() {
    if (loaded.size + missing.size < ids.length) return;
    const gone = ids.filter((_, i) => missing.has(i));
    if (gone.length && !message.querySelector('.missing')) {
      message.append(h('p', {class: 'error missing'},
        `No job ${gone.join(', ')}: deleted, or never submitted.`));
    }
    if (ids.length - gone.length < 2) {
      message.append(h('p', {class: 'notice'}, 'Comparing needs at least two existing jobs. Pick others in ', backLink(), '.'));
      body.hidden = true;
      root.dataset.ready = 'message';
      if (loader) loader.close();
      return;
    }
    body.hidden = false;
    root.dataset.ready = 'charts';
    for (const i of missing) legendItems[i].remove();
    renderDiff();
  }

  loader = new CatchUp(ids, {
    onJob: (i, job) => {
      if (!alive) return;
      const first = !loaded.has(i);
      const specChanged = jobs[i] && JSON.stringify(jobs[i].spec) !== JSON.stringify(job.spec);
      jobs[i] = job;
      loaded.add(i);
      // The x axis spans the data, not max_steps: a short run next to a
      // long one that has barely begun is still readable.
      renderLegend(i);
      if (first) settle(); else if (specChanged && !body.hidden) renderDiff();
    },
    // A job deleted while on screen counts as missing from then on.
    onMissing: (i) => { if (alive) { loaded.delete(i); missing.add(i); settle(); } },
    onError: (i, e) => {
      if (!alive || !e) return;
      const id = `compare-err-${ids[i]}`;
      if (!document.getElementById(id)) message.append(h('p', {class: 'error', id}, `Job ${ids[i]}: ${e.message}`));
    },
    onEvent: (i, type, ev) => {
      if (!alive || (type !== 'metric' && type !== 'eval') || !ev.data) return;
      events[i].push({type, ts: ev.ts, data: ev.data});
      plot(i, ev);
      const err = document.getElementById(`compare-err-${ids[i]}`);
      if (err) err.remove();
    },
  });
  loader.start();

  return () => {
    alive = false;
    loader.close();
    for (const c of charts) c.destroy();
  };
}
