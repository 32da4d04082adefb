// view-try.js — the job page's "Try it" box: a prompt, a few settings, and
// the answer of POST /jobs/{id}/generate from the newest checkpoint; with
// "Compare with the base model" the base model answers the same prompt
// beside it (two requests, one after the other: the server runs one
// generation at a time anyway).

import {api} from './api.js';
import {h, fill} from './util.js';

function field(label, input) {
  return h('label', {class: 'try-field'}, h('span', null, label), input);
}

export function tryBox(id) {
  const prompt = h('textarea', {id: 'try-prompt', rows: 3, placeholder: 'Type a prompt…'});
  const maxTokens = h('input', {id: 'try-max-tokens', type: 'number', min: 1, max: 4096, value: 64});
  const temperature = h('input', {id: 'try-temperature', type: 'number', min: 0, max: 100, step: 0.1, value: 0});
  const topP = h('input', {id: 'try-top-p', type: 'number', min: 0.01, max: 1, step: 0.05, value: 1});
  const compare = h('input', {id: 'try-compare', type: 'checkbox'});
  const run = h('button', {type: 'button', id: 'try-run'}, 'Generate');
  const error = h('p', {class: 'error', id: 'try-error', role: 'alert', hidden: true});
  const tuned = h('div', {class: 'try-out', id: 'try-tuned'});
  const base = h('div', {class: 'try-out', id: 'try-base', hidden: true});
  const outs = h('div', {class: 'try-outs'}, base, tuned);

  function show(el, title, res) {
    const meta = `${res.completion_tokens} tokens · ${res.finish_reason} · ` +
      `${res.tokens_per_s.toFixed(1)} tokens/s` + (res.checkpoint ? ` · ${res.checkpoint}` : '');
    fill(el, h('h3', null, title),
      h('pre', {class: 'try-text'}, h('span', {class: 'try-prompt-echo'}, prompt.value), res.text ?? ''),
      h('p', {class: 'try-meta'}, meta));
  }

  async function go() {
    error.hidden = true;
    if (!prompt.value) {
      error.textContent = 'Type a prompt first.';
      error.hidden = false;
      return;
    }
    const body = {prompt: prompt.value, max_tokens: Number(maxTokens.value),
      temperature: Number(temperature.value), top_p: Number(topP.value)};
    run.disabled = true;
    fill(tuned, h('p', {class: 'notice'}, 'Generating…'));
    base.hidden = !compare.checked;
    if (compare.checked) fill(base, h('p', {class: 'notice'}, 'Waiting…'));
    try {
      if (compare.checked) {
        fill(base, h('p', {class: 'notice'}, 'Generating…'));
        show(base, 'Base model', await api(`/jobs/${id}/generate`, {method: 'POST', body: {...body, base: true}}));
      }
      show(tuned, 'Fine-tuned', await api(`/jobs/${id}/generate`, {method: 'POST', body}));
    } catch (e) {
      fill(tuned);
      if (compare.checked && !base.querySelector('pre')) base.hidden = true;
      error.textContent = e.message || String(e);
      error.hidden = false;
    } finally {
      run.disabled = false;
    }
  }
  run.addEventListener('click', go);

  return h('section', {class: 'try', id: 'try-it'},
    h('h2', null, 'Try it'),
    prompt,
    h('div', {class: 'try-controls'},
      field('Max tokens', maxTokens), field('Temperature', temperature), field('Top p', topP),
      h('label', {class: 'try-check'}, compare, ' Compare with the base model'), run),
    error, outs);
}
