// util.js — DOM building and number/time formatting shared by the views.
//
// Every view builds its DOM through h(), which only ever sets textContent
// and properties, never innerHTML, so job names, log lines and error
// messages from the server cannot inject markup.

// h('div', {class: 'x', onclick: f}, child, 'text', [more]) -> Element
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
      else if (k in el && typeof v !== 'string') el[k] = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// Replaces an element's children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
export const STATES = ['queued', 'starting', 'running', 'stopping', 'paused',
  'succeeded', 'failed', 'cancelled'];

// The actions DESIGN §2 allows from each state; the server still decides
// (409 when it refuses), the buttons only avoid offering the impossible.
export function allowedActions(state) {
  switch (state) {
    case 'queued': return ['cancel'];
    case 'starting': return ['cancel'];
    case 'running': return ['pause', 'cancel'];
    case 'paused': return ['resume', 'cancel'];
    case 'succeeded': case 'failed': case 'cancelled': return ['delete'];
    default: return []; // stopping: wait for it to settle
  }
}

export function stateBadge(state) {
  return h('span', {class: `state state-${state || 'unknown'}`}, state || '?');
}

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  if (typeof v !== 'number') return String(v);
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

// Losses and other metrics for people: four significant digits ("2.117",
// "0.1000", "0.001733"), scientific notation below 1e-3 ("7.590e-4"),
// whole numbers from 1000 up ("12346"), "0" for zero; never "0.0000",
// however far a loss falls. The CLI (server/cli_fmt.c clifmt_metric)
// prints the same text for the same value.
export function fmtMetric(v) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a < 1e-3) return v.toExponential(3).replace('e+', 'e');
  if (a >= 999.95) return Math.round(v).toString();
  return v.toPrecision(4);
}

// The loss cards and columns: the metric format above.
export const fmtLoss = fmtMetric;

// Learning rates always as 1.50e-4, rates as whole numbers with thousands
// separators: one format per column, whatever the value.
export function fmtLr(v) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  return v.toExponential(2);
}

export function fmtInt(v) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return '–';
  return Math.round(v).toLocaleString('en-US');
}

// 112384 -> "112k", 1100048384 -> "1.10B": parameter counts at a glance.
export function fmtCount(v) {
  if (v === null || v === undefined) return '–';
  const a = Math.abs(v);
  for (const [d, u] of [[1e12, 'T'], [1e9, 'B'], [1e6, 'M'], [1e3, 'k']]) {
    if (a >= d) return `${Number((v / d).toPrecision(3))}${u}`;
  }
  return String(v);
}

export function fmtBytes(b) {
  if (b === null || b === undefined) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${i ? b.toFixed(1) : b} ${u[i]}`;
}

export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return '–';
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// "3m" style age of an RFC 3339 timestamp at `now` (ms; default the clock).
export function fmtAge(ts, now = Date.now()) {
  if (!ts) return '–';
  const t = Date.parse(ts);
  if (Number.isNaN(t)) return '–';
  const s = (now - t) / 1000;
  if (s < 60) return `${Math.max(0, Math.floor(s))}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

// Local clock time; the date too when it is not today.
export function fmtTime(ts) {
  if (!ts) return '–';
  const d = new Date(ts);
  if (Number.isNaN(d.getTime())) return String(ts);
  const time = d.toLocaleTimeString([], {hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false});
  if (d.toDateString() === new Date().toDateString()) return time;
  return `${d.toLocaleDateString([], {month: 'short', day: 'numeric'})} ${time}`;
}

// A short description of a job's model: the directory name, or the
// from-scratch config's family and size.
export function modelLabel(spec) {
  const m = spec && spec.model;
  if (!m) return '–';
  if (m.path) {
    const parts = String(m.path).replace(/\/+$/, '').split('/');
    return parts[parts.length - 1] || m.path;
  }
  if (m.init) {
    const c = m.init;
    const dims = [c.n_layer ?? c.num_hidden_layers, c.n_embd ?? c.hidden_size]
      .filter((x) => x !== undefined).join('×');
    return `init ${c.model_type || '?'}${dims ? ' ' + dims : ''}`;
  }
  return '–';
}

// A job's cost so far in its currency ("$1.23", "€0.0042"); '–' when the
// server knows no price (cost is null). Amounts under one unit keep two
// significant digits so a short run does not read as free.
export function fmtCost(cost) {
  if (!cost || typeof cost.amount !== 'number') return '–';
  const a = cost.amount;
  const frac = a > 0 && a < 1 ? Math.min(6, Math.max(2, 1 - Math.floor(Math.log10(a)))) : 2;
  try {
    return new Intl.NumberFormat('en-US', {style: 'currency', currency: cost.currency || 'USD',
      minimumFractionDigits: 2, maximumFractionDigits: frac}).format(a);
  } catch (e) { // a code this browser does not know
    return `${a.toFixed(frac)} ${cost.currency}`;
  }
}

// "0.5 GPU-h" / "0.02 CPU-h": what the cost was charged for (a tooltip).
export function costHours(cost) {
  if (!cost) return 'no price configured on the server';
  return cost.gpu_hours > 0 ? `${fmtNum(cost.gpu_hours, 3)} GPU-hours` : `${fmtNum(cost.cpu_hours, 3)} CPU-hours`;
}

export function gpuLabel(job) {
  if (job.gpus && job.gpus.length) return job.gpus.join(',');
  const want = job.spec && job.spec.resources && job.spec.resources.gpus;
  if (want) return `${want} wanted`;
  return job.backend || 'cpu';
}
