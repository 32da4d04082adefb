// compare.test.mjs — web.compare: comparing runs, chart controls and the
// ticking clock, in headless Chromium against a real
// `trainyard serve --require-token` driving the test engine; the page has
// the token in session storage, so every request and stream of the compare
// view goes through the dashboard's token handling.
//
//   node compare.test.mjs --trainyard BIN --engine BIN --out DIR
//
// - Jobs ticked in the list open #/compare?ids=...: loss, eval loss,
//   learning rate, tokens/s and grad norm of each job, the plotted points
//   equal to the job's GET /jobs/{id}/metrics; a running job's curves keep
//   growing; by time the x values are the time since each job started; the
//   spec differences table has the keys that differ and no other.
// - Smoothing (a slider) and a log toggle on every chart, raw points kept.
// - #/compare with nothing, one id, a non-id or unknown ids says so.
// - Ten running jobs compared at once: every curve grows, with at most
//   three job event streams open at once (counted in the page).
// - A running job's ETA and every age count on with the list's and the job
//   view's requests blocked; a paused or finished job shows no ETA.
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {openSuite, suiteArgs} from './suite.mjs';

const args = suiteArgs('compare.test.mjs');
const {daemon, page, outDir, foreign, pageErrors} = await openSuite(args, 'compare',
  {extra: ['--cpu-slots', '10', '--gpus', 'none', '--require-token'], token: 'compare-test', pageToken: true});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls the API (not the page) until the job is in one of the states.
async function waitJob(id, states) {
  for (let i = 0; i < 1200; i++) {
    const j = await daemon.api(`/jobs/${id}`);
    if (states.includes(j.state)) return j;
    if (['failed', 'cancelled', 'succeeded'].includes(j.state)) throw new Error(`job ${id} ended ${j.state}: ${j.error}`);
    await sleep(100);
  }
  throw new Error(`job ${id} never reached ${states}`);
}

function evalSpec(name, model, lr, maxSteps) {
  const s = daemon.spec(name, model, {maxSteps, logEvery: 1, ckptEvery: 1000});
  s.dataset.eval = daemon.dataset();
  s.hyperparameters.eval_every_steps = 10;
  s.hyperparameters.lr = lr;
  return s;
}

const seriesOf = (sel, i) => page.evaluate(([sel, i]) => {
  const s = document.querySelector(sel).tyChart.series[i];
  return {name: s.name, xs: Array.from(s.xs.slice(0, s.n)), ys: Array.from(s.ys.slice(0, s.n))};
}, [sel, i]);

const jobs = {};

test('select jobs in the list and compare them: every metric, by step and by time, and the spec differences', async () => {
  const quick = daemon.fixture('quick', {step_ms: 15});
  const slow = daemon.fixture('slow', {step_ms: 120});
  jobs.a = await daemon.api('/jobs', {method: 'POST', body: evalSpec('run-a', quick, 0.001, 40)});
  jobs.b = await daemon.api('/jobs', {method: 'POST', body: evalSpec('run-b', quick, 0.0005, 40)});
  const sc = evalSpec('run-c', slow, 0.001, 2500);
  sc.tags = ['long'];
  jobs.c = await daemon.api('/jobs', {method: 'POST', body: sc});
  await waitJob(jobs.a.id, ['succeeded']);
  await waitJob(jobs.b.id, ['succeeded']);
  await waitJob(jobs.c.id, ['running']);

  await page.goto(`${daemon.base}/#/`);
  await page.waitForSelector(`tr[data-job-id="${jobs.c.id}"]`);
  assert.equal(await page.isEnabled('#compare-btn'), false, 'compare offered with no job selected');
  await page.check(`tr[data-job-id="${jobs.a.id}"] input.pick-job`);
  assert.equal(await page.isEnabled('#compare-btn'), false, 'compare offered with one job');
  await page.check(`tr[data-job-id="${jobs.b.id}"] input.pick-job`);
  await page.check(`tr[data-job-id="${jobs.c.id}"] input.pick-job`);
  assert.equal(await page.textContent('#compare-btn'), 'Compare 3 jobs');
  assert.match(page.url(), /#\/$/, 'ticking a box opened the job');
  await page.click('#compare-btn');
  await page.waitForSelector('#compare-view[data-ready="charts"]');
  assert.match(page.url(), new RegExp(`#/compare\\?ids=${jobs.a.id},${jobs.b.id},${jobs.c.id}$`));

  // Each finished job's curves are its metrics, step for step.
  for (const [i, j] of [[0, jobs.a], [1, jobs.b]]) {
    const {metrics} = await daemon.api(`/jobs/${j.id}/metrics`);
    const want = {steps: metrics.map((m) => m.step), loss: metrics.map((m) => m.loss)};
    await page.waitForFunction(([i, n]) => document.querySelector('#compare-loss').tyChart.series[i].n === n, [i, want.steps.length]);
    const loss = await seriesOf('#compare-loss', i);
    assert.deepEqual(loss.xs, want.steps);
    assert.deepEqual(loss.ys, want.loss);
    assert.match(loss.name, new RegExp(`^#${j.id} run-`));
    assert.deepEqual((await seriesOf('#compare-lr', i)).ys, metrics.map((m) => m.lr));
    assert.deepEqual((await seriesOf('#compare-tps', i)).ys, metrics.map((m) => m.tokens_per_s));
    assert.deepEqual((await seriesOf('#compare-gn', i)).ys, metrics.map((m) => m.grad_norm));
    await page.waitForFunction((i) => document.querySelector('#compare-eval').tyChart.series[i].n === 4, i);
    assert.deepEqual((await seriesOf('#compare-eval', i)).xs, [10, 20, 30, 40]);
  }
  // Each job a colour, named in the legend with its state.
  const legend = await page.$$eval('#compare-legend li', (els) => els.map((e) => [e.dataset.jobId, e.dataset.state, e.querySelector('i').style.background]));
  assert.deepEqual(legend.map((l) => l.slice(0, 2)), [[String(jobs.a.id), 'succeeded'], [String(jobs.b.id), 'succeeded'], [String(jobs.c.id), 'running']]);
  assert.equal(new Set(legend.map((l) => l[2])).size, 3, 'two jobs share a colour');

  // The running job's curve keeps growing.
  const n0 = (await seriesOf('#compare-loss', 2)).xs.length;
  await page.waitForFunction((n) => document.querySelector('#compare-loss').tyChart.series[2].n >= n + 3, n0);

  // The spec differences: exactly the keys that differ.
  const rows = await page.$$eval('#spec-diff tbody tr', (trs) => trs.map((tr) => [tr.dataset.key, ...[...tr.querySelectorAll('td')].map((td) => td.textContent)]));
  const keys = rows.map((r) => r[0]);
  for (const k of ['hyperparameters.lr', 'hyperparameters.max_steps', 'name', 'model.path', 'tags']) assert.ok(keys.includes(k), `${k} missing from ${keys}`);
  for (const k of ['hyperparameters.seq_len', 'dataset.train', 'dataset.eval', 'hyperparameters.eval_every_steps']) assert.ok(!keys.includes(k), `${k} is the same in all`);
  assert.deepEqual(rows.find((r) => r[0] === 'hyperparameters.lr').slice(1), ['0.001', '0.0005', '0.001']);
  assert.deepEqual(rows.find((r) => r[0] === 'name').slice(1), ['run-a', 'run-b', 'run-c']);
  assert.equal(rows.find((r) => r[0] === 'tags')[3], '["long"]');
  await page.screenshot({path: path.join(outDir, 'compare-step.png'), fullPage: true});

  // By time: the same points, at the milliseconds since each job started.
  await page.check('#compare-x input[value="time"]');
  await page.waitForSelector('#compare-view[data-x="time"]');
  const {metrics: ma} = await daemon.api(`/jobs/${jobs.a.id}/metrics`);
  const ja = await daemon.api(`/jobs/${jobs.a.id}`);
  const byTime = await seriesOf('#compare-loss', 0);
  const t0 = Date.parse(ja.started_at);
  assert.deepEqual(byTime.ys, ma.map((m) => m.loss));
  assert.deepEqual(byTime.xs, ma.map((m) => Date.parse(m.ts) - t0), 'x is not the time since the start');
  assert.equal(await page.evaluate(() => document.querySelector('#compare-loss').tyChart.opts.xKind), 'elapsed');
  await page.check('#compare-x input[value="step"]');
  await page.waitForSelector('#compare-view[data-x="step"]');
  assert.deepEqual((await seriesOf('#compare-loss', 0)).xs, ma.map((m) => m.step));
});

test('every chart: a log toggle and the smoothing slider; hover says smoothed and raw', async () => {
  // The compare view (still open).
  await page.click('#compare-loss .chart-log input');
  await page.waitForSelector('#compare-loss[data-scale="log"]');
  assert.equal(await page.getAttribute('#compare-lr', 'data-scale'), 'linear', 'the toggle is per chart');
  assert.equal(await page.getAttribute('#compare-loss .chart-log input', 'aria-label'), 'Log scale for Loss');
  await page.fill('#compare-smoothing', '0.9');
  for (const id of ['loss', 'eval', 'lr', 'tps', 'gn']) {
    await page.waitForSelector(`#compare-${id}[data-smoothing="0.9"]`);
  }
  assert.equal(await page.textContent('.compare-view .smooth-value'), '0.90');
  assert.equal(await page.textContent('label[for="compare-smoothing"]'), 'Smoothing');
  // Smoothing draws over the raw points, it does not replace them.
  const {metrics} = await daemon.api(`/jobs/${jobs.a.id}/metrics`);
  assert.deepEqual((await seriesOf('#compare-loss', 0)).ys, metrics.map((m) => m.loss));
  const box = await page.locator('#compare-loss canvas').boundingBox();
  await page.mouse.move(box.x + box.width * 0.3, box.y + box.height * 0.5);
  await page.waitForSelector('#compare-loss .chart-tip:not([hidden])');
  assert.match(await page.textContent('#compare-loss .chart-tip'), /^step \d+\n#\d+ run-a: [\d.]+ \(raw [\d.]+\)/);
  await page.screenshot({path: path.join(outDir, 'compare-smoothed-log.png'), fullPage: true});

  // The job page: a grad-norm chart, the same controls; the smoothing
  // chosen is remembered.
  await page.goto(`${daemon.base}/#/jobs/${jobs.a.id}`);
  await page.waitForFunction((n) => Number(document.querySelector('#chart-grad-norm')?.dataset.points) === n, metrics.length);
  assert.equal(await page.inputValue('#job-smoothing'), '0.9');
  for (const id of ['loss', 'lr', 'tps', 'grad-norm']) await page.waitForSelector(`#chart-${id}[data-smoothing="0.9"]`);
  await page.click('#chart-grad-norm .chart-log input');
  await page.waitForSelector('#chart-grad-norm[data-scale="log"]');
  // Log ticks: the fixture's grad norm 1/(1+step) spans 0.024 to 0.5.
  await page.waitForFunction(() => /\b0\.1\b/.test(document.querySelector('#chart-grad-norm')?.dataset.yticks || ''));
  await page.fill('#job-smoothing', '0');
  await page.waitForSelector('#chart-loss[data-smoothing="0"]');
});

test('#/compare with nothing, one id, a non-id or unknown ids says so', async () => {
  const {a, b} = jobs;
  const cases = [
    ['#/compare', /No jobs to compare/],
    [`#/compare?ids=${a.id}`, new RegExp(`at least two jobs; the address names only job ${a.id}`)],
    ['#/compare?ids=x,y', /Not a job id: x, y/],
    [`#/compare?ids=${a.id},99999`, /No job 99999: deleted, or never submitted[^]*at least two existing jobs/],
    ['#/compare?ids=1,2,3,4,5,6,7,8,9,10,11', /At most 10 jobs/],
  ];
  for (const [hash, re] of cases) {
    await page.goto(`${daemon.base}/${hash}`);
    await page.waitForFunction(() => document.querySelector('#compare-message')?.textContent.length > 0);
    await page.waitForFunction((src) => new RegExp(src).test(document.querySelector('#compare-message')?.textContent || ''), re.source);
    assert.equal(await page.isVisible('#compare-loss'), false, `${hash} shows charts`);
  }
  // Two that exist and one that does not: the two are compared, the third named.
  await page.goto(`${daemon.base}/#/compare?ids=${a.id},${b.id},99999`);
  await page.waitForSelector('#compare-view[data-ready="charts"]');
  assert.match(await page.textContent('#compare-message'), /No job 99999/);
  await page.waitForFunction(() => document.querySelector('#compare-loss').tyChart.series[0].n > 0);
});

test('ages and a running job\'s ETA count on without a request; paused and finished jobs show no ETA', async () => {
  const c = jobs.c;
  // A job seconds old, so its age reads in seconds and moves every tick
  // however long the tests before took.
  const fresh = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('fresh', daemon.fixture('slow', {step_ms: 120}), {maxSteps: 100000})});
  await page.goto(`${daemon.base}/#/`);
  const eta = `tr[data-job-id="${c.id}"] td.eta`;
  await page.waitForFunction((sel) => /\d+s$/.test(document.querySelector(sel)?.textContent), eta);
  const ageSel = `tr[data-job-id="${fresh.id}"] td.age`;
  await page.waitForSelector(ageSel);
  // Block the list's reads: only the page clock can change the cells now.
  let listReads = 0;
  const listUrl = (u) => new URL(u).pathname === '/jobs';
  await page.route(listUrl, (r) => { listReads++; r.abort(); });
  const secs = (t) => t.split(' ').reduce((s, p) => s + Number(p.slice(0, -1)) * {h: 3600, m: 60, s: 1}[p.slice(-1)], 0);
  const e1 = secs(await page.textContent(eta));
  const a1 = await page.textContent(ageSel);
  await page.waitForFunction(([sel, v]) => {
    const t = document.querySelector(sel)?.textContent || '';
    const s = t.split(' ').reduce((s, p) => s + Number(p.slice(0, -1)) * {h: 3600, m: 60, s: 1}[p.slice(-1)], 0);
    return s <= v - 2;
  }, [eta, e1]);
  await page.waitForFunction(([sel, v]) => document.querySelector(sel)?.textContent !== v, [ageSel, a1]);
  console.log(`# list ETA ${e1}s counted down with ${listReads} list reads refused`);
  // A finished job: no ETA.
  assert.equal(await page.textContent(`tr[data-job-id="${jobs.a.id}"] td.eta`), '–');
  await page.unroute(listUrl);

  // The job view: its ETA counts with its reads blocked too.
  await page.goto(`${daemon.base}/#/jobs/${c.id}`);
  await page.waitForFunction(() => /\d+s$/.test(document.querySelector('#job-eta')?.textContent));
  const blockJob = (u) => new URL(u).pathname === `/jobs/${c.id}`;
  await page.route(blockJob, (r) => r.abort());
  const j1 = secs(await page.textContent('#job-eta'));
  await page.waitForFunction((v) => {
    const t = document.querySelector('#job-eta')?.textContent || '';
    return t.split(' ').reduce((s, p) => s + Number(p.slice(0, -1)) * {h: 3600, m: 60, s: 1}[p.slice(-1)], 0) <= v - 2;
  }, j1);
  assert.match(await page.textContent('#job-age'), /^\d+[smhd] ago$/);
  await page.unroute(blockJob);

  // Paused: no ETA, here and in the list.
  await daemon.api(`/jobs/${c.id}/pause`, {method: 'POST'});
  await page.waitForSelector('#job-view[data-state="paused"]');
  await page.waitForFunction(() => document.querySelector('#job-eta')?.textContent === '–');
  await page.waitForTimeout(1500); // two ticks of the clock: it stays empty
  assert.equal(await page.textContent('#job-eta'), '–');
  await page.goto(`${daemon.base}/#/`);
  await page.waitForSelector(`tr[data-job-id="${c.id}"][data-state="paused"]`);
  assert.equal(await page.textContent(eta), '–');
  await daemon.api(`/jobs/${c.id}/cancel`, {method: 'POST'});
  await daemon.api(`/jobs/${fresh.id}/cancel`, {method: 'POST'});
  await page.waitForSelector(`tr[data-job-id="${c.id}"][data-state="cancelled"]`);
  assert.equal(await page.textContent(eta), '–');
});

test('select all shown: a state filter, then the header checkbox; the compare view fits a phone', async () => {
  await page.goto(`${daemon.base}/#/`);
  await page.waitForSelector(`tr[data-job-id="${jobs.c.id}"]`);
  if (await page.isVisible('#compare-clear')) await page.click('#compare-clear');
  assert.equal(await page.isEnabled('#compare-btn'), false);
  await page.click('.chip[data-state="succeeded"]');
  await page.waitForSelector(`tr[data-job-id="${jobs.c.id}"]`, {state: 'detached'});
  await page.check('#pick-all');
  assert.equal(await page.textContent('#compare-btn'), 'Compare 2 jobs');
  assert.equal(await page.getAttribute('#pick-all', 'aria-label'), 'Select all shown jobs to compare');
  await page.click('#compare-btn');
  await page.waitForSelector('#compare-view[data-ready="charts"]');
  assert.match(page.url(), new RegExp(`#/compare\\?ids=${jobs.a.id},${jobs.b.id}$`));
  await page.setViewportSize({width: 390, height: 844});
  await page.waitForFunction(() => document.querySelector('#compare-loss').tyChart.series[0].n > 0);
  await page.waitForTimeout(300); // a frame at the new width
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the compare view is ${overflow}px wider than a phone`);
  const w = (await page.locator('#compare-loss canvas').boundingBox()).width;
  assert.ok(w > 300 && w <= 390, `loss chart ${w}px wide on a phone`);
  await page.screenshot({path: path.join(outDir, 'compare-phone.png'), fullPage: true});
  await page.setViewportSize({width: 1280, height: 900});
});

test('ten running jobs: every curve grows, with at most three job streams open at once', async () => {
  const tick = daemon.fixture('tick', {step_ms: 150});
  const ten = [];
  for (let i = 0; i < 10; i++) ten.push(await daemon.api('/jobs', {method: 'POST', body: evalSpec(`many-${i}`, tick, 0.001 * (i + 1), 100000)}));
  for (const j of ten) await waitJob(j.id, ['running']);
  // Job event streams open at once, counted in the page: a fetch of
  // /jobs/N/events is open from its call until its abort (catchup.js aborts
  // every stream it is done with, ended or not).
  await page.evaluate(() => {
    const real = window.fetch;
    window.__streams = {open: 0, most: 0, total: 0};
    window.fetch = (url, init = {}) => {
      if (/\/jobs\/\d+\/events/.test(String(url))) {
        const st = window.__streams;
        st.open++; st.total++;
        st.most = Math.max(st.most, st.open);
        let done = false;
        const end = () => { if (!done) { done = true; st.open--; } };
        if (init.signal) init.signal.addEventListener('abort', end);
        return real(url, init).catch((e) => { end(); throw e; });
      }
      return real(url, init);
    };
  });
  try {
    await page.goto(`${daemon.base}/#/compare?ids=${ten.map((j) => j.id).join(',')}`);
    await page.waitForSelector('#compare-view[data-ready="charts"]');
    await page.waitForFunction(() => document.querySelector('#compare-loss').tyChart.series.every((s) => s.n > 0));
    const n0 = await page.evaluate(() => document.querySelector('#compare-loss').tyChart.series.map((s) => s.n));
    // Every job's curve grows while the view stays open (rounds every 3 s).
    await page.waitForFunction((n0) => document.querySelector('#compare-loss').tyChart.series.every((s, i) => s.n >= n0[i] + 3), n0);
    const colours = await page.$$eval('#compare-legend li i', (els) => els.map((e) => e.style.background));
    assert.equal(new Set(colours).size, 10, 'two jobs share a colour');
    const st = await page.evaluate(() => window.__streams);
    console.log(`# ten running jobs: ${st.total} job streams opened, at most ${st.most} at once`);
    assert.ok(st.total > 10, `only ${st.total} job streams for ten jobs: the running jobs were not followed in rounds`);
    assert.ok(st.most >= 1 && st.most <= 3, `${st.most} job streams open at once`);
  } finally {
    for (const j of ten) await daemon.api(`/jobs/${j.id}/cancel`, {method: 'POST'});
  }
});

test('the page requested nothing from any other host and raised no error', () => {
  assert.deepEqual(foreign, []);
  assert.deepEqual(pageErrors, []);
});
