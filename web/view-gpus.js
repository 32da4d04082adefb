// view-gpus.js — the machine's GPUs: utilisation, memory, temperature and
// the job holding each, from GET /gpus and the live `gpu` samples on the
// shared /events feed. Allocation changes come with job state changes, so
// a state event re-reads the inventory (GPU samples do not carry job ids).

import {api} from './api.js';
import {h, fill, fmtBytes} from './util.js';

export function mount(main, app) {
  let alive = true;
  const gpus = new Map(); // index -> gpu
  const list = h('div', {class: 'gpu-grid', id: 'gpu-list'});
  const note = h('p', {class: 'notice', hidden: true});
  main.append(h('div', {class: 'view-head'}, h('h1', null, 'GPUs')), note, list);

  function meter(label, frac, text) {
    const pct = Math.max(0, Math.min(100, (frac || 0) * 100));
    const level = pct >= 90 ? 'high' : pct >= 60 ? 'mid' : 'low';
    return h('div', {class: 'meter'},
      h('span', {class: 'meter-label'}, label),
      h('div', {class: 'bar'}, h('div', {class: `fill meter-${level}`, style: {width: `${pct}%`}})),
      h('span', {class: 'meter-text'}, text));
  }

  function card(g) {
    const memFrac = g.mem_total ? g.mem_used / g.mem_total : 0;
    return h('article', {class: 'gpu', dataset: {index: String(g.index)}},
      h('header', null, h('strong', null, `GPU ${g.index}`), h('span', {class: 'gpu-name'}, g.name || '')),
      meter('Utilisation', (g.util ?? 0) / 100, g.util === null || g.util === undefined ? '–' : `${g.util}%`),
      meter('Memory', memFrac, `${fmtBytes(g.mem_used)} / ${fmtBytes(g.mem_total)}`),
      h('div', {class: 'gpu-foot'},
        h('span', null, 'Temperature ', g.temp === null || g.temp === undefined ? '–' : `${g.temp} °C`),
        h('span', null, 'Job ', g.job_id ? h('a', {href: `#/jobs/${g.job_id}`}, `#${g.job_id}`) : 'free')));
  }

  function render() {
    const items = [...gpus.values()].sort((a, b) => a.index - b.index);
    fill(list, items.map(card));
    note.hidden = items.length > 0;
    note.textContent = 'No GPUs on this machine: jobs run on the CPU backend.';
  }

  async function load() {
    try {
      const res = await api('/gpus');
      if (!alive) return;
      gpus.clear();
      for (const g of res.gpus || []) gpus.set(g.index, g);
      render();
    } catch (e) {
      if (!alive) return;
      note.hidden = false;
      note.textContent = `Could not read GPUs: ${e.message}`;
    }
  }

  let pending = false;
  const off = app.feed.on((type, ev) => {
    if (type === 'gpu' && ev.data && gpus.has(ev.data.index)) {
      Object.assign(gpus.get(ev.data.index), ev.data);
      if (!pending) {
        pending = true;
        requestAnimationFrame(() => { pending = false; if (alive) render(); });
      }
    } else if (type === 'state') {
      load();
    }
  });
  load();
  return () => { alive = false; off(); };
}
