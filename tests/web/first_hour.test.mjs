// first_hour.test.mjs — web.first_hour: what a new user reads in the first
// hour, in headless Chromium against a real `trainyard serve` driving the
// test engine.
//
//   node first_hour.test.mjs --trainyard BIN --engine BIN --out DIR
//
// - A loss that falls 10,000x reads in four significant digits, in
//   scientific notation below 1e-3 (never 0.0000), on the job page and in
//   the jobs list alike; its chart turns to a log axis by itself once the
//   loss fell 100x, and the user's toggle wins over that.
// - Step charts span the data: a 60-step job ends at its max_steps, marked;
//   a job of 100,000 steps that has made a few dozen spans those, unmarked.
// - Dots mark eval points only; smoothing leaves the learning rate and
//   series under 20 points raw (job page and compare view).
// - The submit form's tags, priority and limits reach the spec, and the
//   server's 400 for each shows next to its input.
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {fillSmallJob, openSuite, suiteArgs} from './suite.mjs';

const args = suiteArgs('first_hour.test.mjs');
const {daemon, page, outDir, foreign, pageErrors} = await openSuite(args, 'first_hour',
  {extra: ['--cpu-slots', '3', '--gpus', 'none']});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitJob(id, state) {
  for (let i = 0; i < 600; i++) {
    const j = await daemon.api(`/jobs/${id}`);
    if (j.state === state) return j;
    await sleep(100);
  }
  throw new Error(`job ${id} never reached ${state}`);
}

function evalSpec(name, model, maxSteps) {
  const s = daemon.spec(name, model, {maxSteps, logEvery: 1, ckptEvery: 1000});
  s.dataset.eval = daemon.dataset();
  s.hyperparameters.eval_every_steps = 10;
  return s;
}

const attr = (sel, name) => page.getAttribute(sel, name);
const jobs = {};

test('numbers, spans, log axis and dots on the job page and the list', async () => {
  // 3 exp(-step/6) + 1e-5: from 2.5 down to 1.5e-4 over 60 steps.
  const falling = daemon.fixture('falling', {step_ms: 15, loss_floor: 0.00001, loss_decay_steps: 6});
  const plain = daemon.fixture('plain', {step_ms: 15});
  const slow = daemon.fixture('slow', {step_ms: 40});
  jobs.a = await daemon.api('/jobs', {method: 'POST', body: evalSpec('falling', falling, 60)});
  jobs.c = await daemon.api('/jobs', {method: 'POST', body: evalSpec('plain', plain, 60)});
  jobs.b = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('long', slow, {maxSteps: 100000})});
  const a = await waitJob(jobs.a.id, 'succeeded');
  await waitJob(jobs.c.id, 'succeeded');

  await page.goto(`${daemon.base}/#/jobs/${a.id}`);
  await page.waitForFunction(() => document.querySelector('#chart-loss')?.dataset.points === '66');
  const loss = await page.textContent('#last-loss');
  assert.match(loss, /^1\.\d{3}e-4$/, 'a tiny loss in scientific notation');
  assert.equal(loss, (await import('../../web/util.js')).fmtMetric(a.last_metric.loss));
  // Fell 100x: a log axis by itself; the span is the data, max_steps marked.
  await page.waitForSelector('#chart-loss[data-scale="log"][data-auto-log="on"]');
  assert.equal(await attr('#chart-loss', 'data-xrange'), '1 60');
  assert.equal(await attr('#chart-loss', 'data-max-marker'), '60');
  // Dots: the six evals, not the 60 training points; none on lr.
  assert.equal(await attr('#chart-loss', 'data-dots'), '6');
  assert.equal(await attr('#chart-lr', 'data-dots'), '0');
  // Smoothing: the training loss, not the lr schedule.
  await page.fill('#job-smoothing', '0.8');
  await page.waitForSelector('#chart-loss[data-smoothing="0.8"][data-smoothed="yes"]');
  await page.waitForSelector('#chart-lr[data-smoothing="0.8"][data-smoothed="no"]');
  await page.fill('#job-smoothing', '0');
  // The user's toggle wins over the automatic log axis.
  await page.click('#chart-loss .chart-log input');
  await page.waitForSelector('#chart-loss[data-scale="linear"]');
  await page.setViewportSize({width: 1000, height: 800}); // a redraw
  await sleep(300);
  assert.equal(await attr('#chart-loss', 'data-scale'), 'linear');
  await page.screenshot({path: path.join(outDir, 'job-falling.png'), fullPage: true});

  // A plain loss (3.5 -> 0.6) stays on a linear axis.
  await page.goto(`${daemon.base}/#/jobs/${jobs.c.id}`);
  await page.waitForFunction(() => document.querySelector('#chart-loss')?.dataset.points === '66');
  await sleep(200);
  assert.equal(await attr('#chart-loss', 'data-scale'), 'linear');

  // 100,000 steps, a few dozen made: the axis spans those, no marker.
  await page.goto(`${daemon.base}/#/jobs/${jobs.b.id}`);
  await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.dataset.points) >= 20);
  const [x0, x1] = (await attr('#chart-loss', 'data-xrange')).split(' ').map(Number);
  assert.equal(x0, 1);
  assert.ok(x1 >= 20 && x1 < 1000, `x axis to ${x1}, not to 100000`);
  assert.equal(await attr('#chart-loss', 'data-max-marker'), null);

  // The list: the same text for the same loss.
  await page.goto(`${daemon.base}/#/`);
  const cell = `tr.job-row[data-job-id="${a.id}"] td.loss`;
  await page.waitForSelector(cell);
  assert.equal(await page.textContent(cell), loss);
  for (const t of await page.$$eval('tr.job-row td.loss', (tds) => tds.map((x) => x.textContent))) {
    assert.notEqual(t, '0.0000');
  }
});

test('compare: dots only on eval loss; no smoothing of lr or short series', async () => {
  await page.goto(`${daemon.base}/#/compare?ids=${jobs.a.id},${jobs.c.id}`);
  await page.waitForFunction(() => document.querySelector('#compare-loss')?.dataset.points === '120'
    && document.querySelector('#compare-eval').dataset.points === '12');
  assert.equal(await attr('#compare-loss', 'data-dots'), '0', 'a 60-point training series is a line');
  assert.equal(await attr('#compare-eval', 'data-dots'), '12');
  await page.fill('#compare-smoothing', '0.9');
  await page.waitForSelector('#compare-loss[data-smoothing="0.9"][data-smoothed="yes"]');
  await page.waitForSelector('#compare-lr[data-smoothing="0.9"][data-smoothed="no"]');
  await page.waitForSelector('#compare-eval[data-smoothing="0.9"][data-smoothed="no"]');
  await page.screenshot({path: path.join(outDir, 'compare.png'), fullPage: true});
  await page.fill('#compare-smoothing', '0');
  await daemon.api(`/jobs/${jobs.b.id}/cancel`, {method: 'POST'});
});

test('the submit form: tags, priority and limits, each error next to its input', async () => {
  await fillSmallJob(page, daemon, daemon.fixture('form', {step_ms: 10}));
  // One bad value at a time: the server names the field, the form shows it there.
  const cases = [
    ['priority', '5000', /priority: must be in \[-1000, 1000\]/],
    ['tags', 'team-a, bad tag!', /tags\[1\]: a tag is/],
    ['limits.max_cost', '5', /limits\.max_cost: this server has no CPU-hour price/],
    ['limits.max_runtime_s', '0', /limits\.max_runtime_s: must be in/],
    ['limits.max_tokens', '0', /limits\.max_tokens: must be in/],
    ['limits.stall_after_s', '0', /limits\.stall_after_s: must be in/],
  ];
  for (const [name, bad, re] of cases) {
    await page.fill(`[name="${name}"]`, bad);
    await page.click('#submit-form-btn');
    const err = `.field[data-field="${name}"] .field-error`;
    await page.waitForSelector(`${err}:not([hidden])`);
    assert.match(await page.textContent(err), re);
    assert.equal(await page.isVisible('#submit-error'), false, `${name}: the error went to the banner`);
    await page.fill(`[name="${name}"]`, '');
  }
  await page.fill('[name="tags"]', 'team-a, exp:7');
  await page.fill('[name="priority"]', '3');
  await page.fill('[name="limits.max_runtime_s"]', '600');
  await page.fill('[name="limits.max_tokens"]', '100000');
  await page.fill('[name="limits.stall_after_s"]', '30');
  await page.selectOption('[name="limits.on_stall"]', 'fail');
  await page.click('#submit-form-btn');
  await page.waitForSelector('#job-view');
  const id = Number(await attr('#job-view', 'data-job-id'));
  const job = await waitJob(id, 'succeeded');
  assert.deepEqual(job.tags, ['team-a', 'exp:7']);
  assert.equal(job.priority, 3);
  const l = job.spec.limits;
  assert.deepEqual([l.max_runtime_s, l.max_tokens, l.stall_after_s, l.on_stall], [600, 100000, 30, 'fail']);
  assert.deepEqual(foreign, []);
  assert.deepEqual(pageErrors, []);
});
