// chart-controls.js — the smoothing slider a view shows above its charts.
//
// One slider per view sets the EMA weight of every chart in it (0 = raw,
// up to 0.99), as TensorBoard does; each chart's log toggle is its own
// (charts.js). The weight is remembered in localStorage, so the job page
// and the compare view open with the smoothing last chosen.

import {h} from './util.js';
import {clampWeight} from './smooth.js';

const KEY = 'trainyard.smoothing';

export function savedSmoothing() {
  try { return clampWeight(localStorage.getItem(KEY)); } catch { return 0; }
}

// A labelled range input and its read-out; charts() returns the charts to
// set (the compare view rebuilds its list).
export function smoothingControl(charts, id) {
  const w0 = savedSmoothing();
  const out = h('output', {class: 'smooth-value', for: id}, w0.toFixed(2));
  const input = h('input', {type: 'range', id, min: '0', max: '0.99', step: '0.01', value: String(w0),
    'aria-describedby': `${id}-hint`,
    oninput: () => {
      const w = clampWeight(input.value);
      out.textContent = w.toFixed(2);
      for (const c of charts()) c.setSmoothing(w);
      try { localStorage.setItem(KEY, String(w)); } catch { /* not remembered */ }
    }});
  for (const c of charts()) c.setSmoothing(w0);
  return h('div', {class: 'smooth-control'},
    h('label', {for: id}, 'Smoothing'), input, out,
    h('span', {class: 'sr-only', id: `${id}-hint`}, 'Exponential moving average weight, 0 is raw'));
}
