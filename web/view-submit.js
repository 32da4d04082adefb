// view-submit.js — submitting a job: a form for the common fields and a raw
// JSON editor for the full spec (DESIGN §4, common/jobspec.c).
//
// The page does not re-implement validation: the server checks the spec and
// answers {"error": {"field": "hyperparameters.lr", ...}}; the message is
// shown next to the input whose name is that dotted path (or the nearest
// enclosing one). Each submission carries an Idempotency-Key so a retried
// click never creates a second job.

import {api} from './api.js';
import {h, fill} from './util.js';

const EXAMPLE = {
  name: 'my-run',
  model: {path: '/models/tinyllama-1.1b'},
  dataset: {train: '/data/train.jsonl', eval: '/data/eval.jsonl', format: 'prompt_completion'},
  method: 'lora',
  lora: {r: 16, alpha: 32, dropout: 0.05, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj']},
  hyperparameters: {max_steps: 1000, batch_size: 8, seq_len: 1024, grad_accum: 1, lr: 2e-4,
    schedule: 'cosine', warmup_steps: 50, log_every_steps: 10},
  precision: 'bf16',
  resources: {gpus: 1, backend: 'auto'},
  checkpoint: {every_steps: 200, keep_last: 3},
};

const DRAFT_KEY = 'trainyard.submit.json';

function newKey() {
  const a = new Uint8Array(16);
  crypto.getRandomValues(a);
  return [...a].map((b) => b.toString(16).padStart(2, '0')).join('');
}

// One labelled input bound to a dotted spec path.
function field(label, name, input, hint) {
  input.name = name;
  input.id = 'f-' + name.replace(/[^a-z0-9]+/gi, '-');
  return h('div', {class: 'field', dataset: {field: name}},
    h('label', {for: input.id}, label),
    input,
    hint ? h('small', {class: 'hint'}, hint) : null,
    h('div', {class: 'field-error', role: 'alert', hidden: true}));
}

const text = (attrs = {}) => h('input', {type: 'text', spellcheck: false, autocomplete: 'off', ...attrs});
const num = (attrs = {}) => h('input', {type: 'number', step: 'any', inputmode: 'decimal', ...attrs});
const select = (opts, value) => h('select', null, opts.map((o) => h('option', {value: o, selected: o === value}, o)));

export function mount(main) {
  let idemKey = newKey();
  let busy = false;

  const form = h('form', {id: 'submit-form', class: 'spec-form', novalidate: true});
  const formError = h('p', {class: 'error', id: 'submit-error', role: 'alert', hidden: true});
  const modelKind = select(['path', 'init'], 'path');
  const modelPath = field('Model path', 'model.path', text({placeholder: '/models/… or s3://…'}),
    'A Hugging Face model directory or a remote URI.');
  const modelInit = field('Model config (train from scratch)', 'model.init',
    h('textarea', {rows: 4, spellcheck: false},
      '{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 128, "vocab_size": 64, "layer_norm_epsilon": 1e-5}'));
  modelInit.hidden = true;
  const method = select(['full', 'lora', 'qlora'], 'lora');
  const loraFields = h('div', {class: 'row'},
    field('LoRA r', 'lora.r', num({value: '16', step: '1', min: '1'})),
    field('LoRA alpha', 'lora.alpha', num({value: '32'})));

  fill(form,
    h('fieldset', null, h('legend', null, 'Job'),
      field('Name', 'name', text({placeholder: 'optional'}))),
    h('fieldset', null, h('legend', null, 'Model'),
      h('div', {class: 'field'}, h('label', {for: 'f-model-kind'}, 'Source'), Object.assign(modelKind, {id: 'f-model-kind'})),
      modelPath, modelInit),
    h('fieldset', null, h('legend', null, 'Dataset'),
      field('Train file', 'dataset.train', text({placeholder: '/data/train.jsonl'})),
      field('Eval file', 'dataset.eval', text({placeholder: 'optional'})),
      field('Format', 'dataset.format', select(['tokens', 'text', 'prompt_completion', 'chat'], 'prompt_completion'))),
    h('fieldset', null, h('legend', null, 'Method'),
      field('Method', 'method', method), loraFields),
    h('fieldset', null, h('legend', null, 'Hyperparameters'),
      h('div', {class: 'row'},
        field('Max steps', 'hyperparameters.max_steps', num({value: '1000', step: '1', min: '1'})),
        field('Batch size', 'hyperparameters.batch_size', num({value: '8', step: '1', min: '1'})),
        field('Sequence length', 'hyperparameters.seq_len', num({value: '1024', step: '1', min: '2'})),
        field('Learning rate', 'hyperparameters.lr', num({value: '0.0002'}))),
      field('Precision', 'precision', select(['fp32', 'bf16', 'fp16'], 'bf16'))),
    h('fieldset', null, h('legend', null, 'Resources and checkpoints'),
      h('div', {class: 'row'},
        field('GPUs', 'resources.gpus', num({value: '1', step: '1', min: '0'}), '0 runs on CPU slots.'),
        field('Checkpoint every (steps)', 'checkpoint.every_steps', num({value: '200', step: '1', min: '0'}))),
      field('Checkpoint store', 'checkpoint.store', text({placeholder: 's3://bucket/prefix (optional)'}))),
    // The operations fields of the spec (docs/api.md): where the job goes in
    // the queue and what it may spend. Empty inputs keep the server's
    // defaults; the server checks the bounds and names the field.
    h('fieldset', null, h('legend', null, 'Queue and limits'),
      h('div', {class: 'row'},
        field('Tags', 'tags', text({placeholder: 'team-a, exp:7'}),
          'Comma-separated; letters, digits and _ . : - (at most 16).'),
        field('Priority', 'priority', num({step: '1', min: '-1000', max: '1000', placeholder: '0'}),
          'Higher runs first, -1000 to 1000.')),
      h('div', {class: 'row'},
        field('Max cost', 'limits.max_cost', num({min: '0', placeholder: 'no limit'}),
          "In the server's currency; needs a price on the server."),
        field('Max running time (s)', 'limits.max_runtime_s', num({step: '1', min: '1', placeholder: 'server default'})),
        field('Max tokens', 'limits.max_tokens', num({step: '1', min: '1', placeholder: 'server default'}))),
      h('div', {class: 'row'},
        field('Stalled after (s)', 'limits.stall_after_s', num({step: '1', min: '1', placeholder: 'server default'}),
          'Silence (no metric) that counts as a stall.'),
        field('On stall', 'limits.on_stall',
          h('select', null, h('option', {value: ''}, 'server default (warn)'),
            ['warn', 'restart', 'fail'].map((o) => h('option', {value: o}, o)))))),
    formError,
    h('div', {class: 'actions'},
      h('button', {type: 'submit', class: 'primary', id: 'submit-form-btn'}, 'Submit job'),
      h('button', {type: 'button', onclick: () => { editor.value = JSON.stringify(formSpec(), null, 2); showTab('json'); }},
        'Edit as JSON')));

  const editor = h('textarea', {id: 'spec-json', class: 'json-editor', rows: 24, spellcheck: false,
    'aria-label': 'Job spec (JSON)'});
  const jsonError = h('p', {class: 'error', id: 'json-error', role: 'alert', hidden: true});
  try { editor.value = sessionStorage.getItem(DRAFT_KEY) || JSON.stringify(EXAMPLE, null, 2); } catch {
    editor.value = JSON.stringify(EXAMPLE, null, 2);
  }
  editor.addEventListener('input', () => {
    try { sessionStorage.setItem(DRAFT_KEY, editor.value); } catch { /* no storage */ }
    idemKey = newKey();
  });
  const jsonPane = h('div', {class: 'json-pane'},
    h('p', {class: 'hint'}, 'The full job spec; unknown fields are rejected by the server. See docs/api.md.'),
    editor, jsonError,
    h('div', {class: 'actions'},
      h('button', {type: 'button', class: 'primary', id: 'submit-json-btn', onclick: () => submitJson()}, 'Submit JSON'),
      h('button', {type: 'button', onclick: () => {
        try { editor.value = JSON.stringify(JSON.parse(editor.value), null, 2); jsonError.hidden = true; }
        catch (e) { showJsonError(`Not valid JSON: ${e.message}`); }
      }}, 'Format')));

  const tabs = {
    form: h('button', {type: 'button', role: 'tab', class: 'tab', onclick: () => showTab('form')}, 'Form'),
    json: h('button', {type: 'button', role: 'tab', class: 'tab', id: 'tab-json', onclick: () => showTab('json')}, 'JSON'),
  };
  function showTab(t) {
    form.hidden = t !== 'form';
    jsonPane.hidden = t !== 'json';
    for (const [k, b] of Object.entries(tabs)) {
      b.classList.toggle('active', k === t);
      b.setAttribute('aria-selected', String(k === t));
    }
  }
  main.append(h('div', {class: 'view-head'}, h('h1', null, 'Submit a job')),
    h('div', {class: 'tabs', role: 'tablist'}, tabs.form, tabs.json), form, jsonPane);
  showTab('form');

  const syncVisibility = () => {
    modelPath.hidden = modelKind.value !== 'path';
    modelInit.hidden = modelKind.value !== 'init';
    loraFields.hidden = method.value === 'full';
  };
  // On a machine without GPUs a job asking for one would wait forever:
  // start the form at 0 there.
  api('/gpus').then((res) => {
    const n = (res && res.gpus || []).length;
    const input = form.elements['resources.gpus'];
    const hint = input.parentElement.querySelector('.hint');
    if (n === 0 && input.value === '1') {
      input.value = '0';
      form.elements.precision.value = 'fp32';
    }
    hint.textContent = n ? `This server has ${n} GPU${n > 1 ? 's' : ''}; 0 runs on CPU slots.`
      : 'This server has no GPUs: jobs run on CPU slots.';
  }).catch(() => { /* keep the defaults */ });
  modelKind.addEventListener('change', syncVisibility);
  method.addEventListener('change', syncVisibility);
  syncVisibility();
  form.addEventListener('input', () => { idemKey = newKey(); });

  // The spec the form describes; empty inputs are left out so the server's
  // defaults apply.
  function formSpec() {
    const v = (name) => form.elements[name].value.trim();
    const numOrText = (name) => {
      const s = v(name);
      if (s === '') return undefined;
      const n = Number(s);
      return Number.isFinite(n) ? n : s; // let the server name a non-number
    };
    const spec = {};
    const set = (path, val) => {
      if (val === undefined || val === '') return;
      const keys = path.split('.');
      let o = spec;
      for (const k of keys.slice(0, -1)) o = (o[k] ??= {});
      o[keys[keys.length - 1]] = val;
    };
    set('name', v('name'));
    if (modelKind.value === 'path') set('model.path', v('model.path'));
    else {
      let init;
      try { init = JSON.parse(v('model.init')); } catch { init = v('model.init'); }
      set('model.init', init);
    }
    if (!spec.model) spec.model = {};
    set('dataset.train', v('dataset.train'));
    set('dataset.eval', v('dataset.eval'));
    set('dataset.format', v('dataset.format'));
    set('method', method.value);
    if (method.value !== 'full') {
      set('lora.r', numOrText('lora.r'));
      set('lora.alpha', numOrText('lora.alpha'));
    }
    for (const k of ['max_steps', 'batch_size', 'seq_len', 'lr']) set(`hyperparameters.${k}`, numOrText(`hyperparameters.${k}`));
    set('precision', v('precision'));
    set('resources.gpus', numOrText('resources.gpus'));
    set('checkpoint.every_steps', numOrText('checkpoint.every_steps'));
    set('checkpoint.store', v('checkpoint.store'));
    const tags = v('tags').split(',').map((t) => t.trim()).filter(Boolean);
    if (tags.length) spec.tags = tags;
    set('priority', numOrText('priority'));
    for (const k of ['max_cost', 'max_runtime_s', 'max_tokens', 'stall_after_s']) set(`limits.${k}`, numOrText(`limits.${k}`));
    set('limits.on_stall', v('limits.on_stall'));
    return spec;
  }

  function clearErrors() {
    formError.hidden = true;
    jsonError.hidden = true;
    for (const el of form.querySelectorAll('.field-error')) { el.hidden = true; el.textContent = ''; }
    for (const el of form.querySelectorAll('.field.invalid')) el.classList.remove('invalid');
  }

  // Shows a server error next to the field it names: "lora.targets[2]"
  // falls back to "lora.targets", then "lora", then the form's banner.
  function showFieldError(err) {
    for (let name = err.field || ''; name;) {
      const box = form.querySelector(`.field[data-field="${CSS.escape(name)}"]`);
      if (box && !box.hidden) {
        box.classList.add('invalid');
        const msg = box.querySelector('.field-error');
        msg.textContent = err.message;
        msg.hidden = false;
        const input = box.querySelector('input, select, textarea');
        if (input) input.focus();
        return;
      }
      const parent = name.replace(/(\[\d+\]|\.[^.[\]]*)$/, '');
      if (parent === name) break;
      name = parent;
    }
    formError.hidden = false;
    formError.textContent = err.field ? `${err.field}: ${err.message}` : err.message;
  }

  function showJsonError(message) {
    jsonError.hidden = false;
    jsonError.textContent = message;
  }

  async function submit(body) {
    const job = await api('/jobs', {method: 'POST', body, headers: {'Idempotency-Key': idemKey}});
    idemKey = newKey();
    location.hash = `#/jobs/${job.id}`;
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (busy) return;
    busy = true;
    clearErrors();
    try { await submit(formSpec()); } catch (err) { showFieldError(err); } finally { busy = false; }
  });

  async function submitJson() {
    if (busy) return;
    clearErrors();
    let spec;
    try { spec = JSON.parse(editor.value); } catch (e) { showJsonError(`Not valid JSON: ${e.message}`); return; }
    busy = true;
    try { await submit(spec); } catch (err) {
      showJsonError(err.field ? `${err.field}: ${err.message}` : err.message);
    } finally { busy = false; }
  }
}
