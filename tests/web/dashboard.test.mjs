// dashboard.test.mjs — the dashboard in headless Chromium against a real
// `trainyard serve` driving the test engine (tests/fixtures).
//
//   node dashboard.test.mjs --suite live|controls --trainyard BIN --engine BIN --out DIR
//
// live:     the jobs list shows a submitted job and follows its state
//           without reloading; the loss chart gains points as metric events
//           arrive; after a server restart the chart continues with no gap
//           and no duplicate; a screenshot of the job view is saved.
// controls: queue positions; the GPUs view and a GPU job's GPU charts; pause / resume / cancel buttons work and are
//           disabled where the state forbids them; a refused action shows
//           the server's error; the submit form shows a bad learning rate's
//           error next to its field.
// auth:     on a server that requires a token the page asks for one,
//           retries with it, keeps it in sessionStorage and streams with it.
// All: the page makes no request to any host but the daemon.
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {fillSmallJob, openSuite, suiteArgs} from './suite.mjs';

const args = suiteArgs('dashboard.test.mjs', ['suite']);
// One daemon and one browser per suite; everything is torn down even when
// an assertion fails.
const {daemon, page, outDir, foreign, pageErrors} = await openSuite(args, args.suite, {
  extra: ['--cpu-slots', args.suite === 'controls' ? '1' : '2',
    // Two GPUs by list: without NVML the server still schedules them and
    // samples them (as zeros), which exercises the GPU view and charts.
    ...(args.suite === 'controls' ? ['--gpus', '0,1', '--gpu-sample-ms', '250'] : ['--gpus', 'none']),
    ...(args.suite === 'auth' ? ['--require-token'] : []),
    // A priced server: the live suite checks the cost column (3600 per
    // CPU-hour, so a second of running costs $1).
    ...(args.suite === 'live' ? ['--cpu-hour-price', '3600'] : [])],
  token: args.suite === 'auth' ? 'browser-test' : null});

const stateOf = (sel) => page.getAttribute(sel, 'data-state');
async function waitState(sel, state) {
  await page.waitForSelector(`${sel}[data-state="${state}"]`);
}
async function buttons() {
  const out = {};
  for (const b of ['pause', 'resume', 'cancel']) out[b] = await page.isEnabled(`#btn-${b}`);
  return out;
}
const points = async (sel) => Number(await page.getAttribute(sel, 'data-points'));

if (args.suite === 'live') {
  test('jobs list shows a submitted job and follows its state live', async () => {
    await page.goto(daemon.base + '/');
    await page.waitForSelector('#jobs-table');
    await page.evaluate(() => { window.__noReload = true; });
    const model = daemon.fixture('steady', {step_ms: 60});
    const job = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('live-chart', model, {maxSteps: 220, logEvery: 2, ckptEvery: 20})});
    const row = `tr[data-job-id="${job.id}"]`;
    await page.waitForSelector(row);
    assert.match(await page.textContent(row), /live-chart/);
    await waitState(row, 'running');
    assert.equal(await page.evaluate(() => window.__noReload), true, 'the page reloaded');
    // Progress reaches the list through its refresh of active jobs.
    await page.waitForFunction((sel) => {
      const t = document.querySelector(`${sel} .progress-text`);
      return t && parseInt(t.textContent, 10) > 0;
    }, row);
    // Cost so far, in dollars, above zero once the job has run a while.
    await page.waitForFunction((sel) => {
      const c = document.querySelector(`${sel} td.cost`);
      return c && /^\$\d/.test(c.textContent) && parseFloat(c.textContent.slice(1)) > 0;
    }, row);
    daemon.liveJob = job.id;
  });

  test('job view: the loss chart gains points, and a server restart leaves no gap or duplicate', async () => {
    const id = daemon.liveJob;
    assert.ok(id, 'needs the job of the previous test');
    await page.click(`tr[data-job-id="${id}"] a`);
    await page.waitForSelector('#job-view');
    assert.match(await page.textContent('#job-cost'), /^\$\d/);
    await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.dataset.points) > 2);
    const n1 = await points('#chart-loss');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-loss')?.dataset.points) >= n + 3, n1);

    await daemon.stop('SIGTERM');
    await page.waitForSelector('.stream-state[data-state="retry"]');
    const before = await points('#chart-loss');
    await daemon.start();
    await page.waitForSelector('.stream-state[data-state="open"]');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-loss')?.dataset.points) > n + 2, before);
    await page.screenshot({path: path.join(outDir, 'job-view.png'), fullPage: true});
    await waitState('#job-view', 'succeeded');
    // A read that failed while the server was down is not left on screen.
    await page.waitForSelector('#load-error', {state: 'hidden'});
    await page.waitForTimeout(300); // the last frame's redraw

    // The chart's steps are exactly the job's distinct metric steps, in
    // order, with no hole and no repeat; a resumed run replays the steps
    // after its checkpoint, and the newer values replace the older.
    const plotted = await page.evaluate(() => {
      const s = document.querySelector('#chart-loss').tyChart.series[0];
      return {xs: Array.from(s.xs.slice(0, s.n)), ys: Array.from(s.ys.slice(0, s.n))};
    });
    const xs = plotted.xs;
    const {metrics} = await daemon.api(`/jobs/${id}/metrics`);
    const latest = new Map();
    for (const m of metrics) latest.set(m.step, m.loss);
    const steps = [...latest.keys()].sort((a, b) => a - b);
    console.log(`# ${metrics.length} metric rows, ${steps.length} distinct steps, ${xs.length} plotted`);
    assert.deepEqual(xs, steps, 'plotted steps differ from the job\'s metric steps');
    assert.deepEqual(plotted.ys, steps.map((s) => latest.get(s)), 'a replayed step kept its old value');
    assert.equal(xs[xs.length - 1], 220);
    assert.equal(await points('#chart-loss'), xs.length + (await page.evaluate(
      () => document.querySelector('#chart-loss').tyChart.series[1].n)));
    // Events already seen are never applied twice.
    const seq = Number(await page.getAttribute('#job-view', 'data-seq'));
    assert.ok(seq > xs.length, 'the view did not follow the event sequence');
    assert.equal(await page.getAttribute('#job-view', 'data-dupes'), null, 'a replay re-applied events');
  });

  test('the chart shows values on hover, and the job view fits a phone', async () => {
    const box = await page.locator('#chart-loss canvas').boundingBox();
    await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.5);
    await page.waitForSelector('#chart-loss .chart-tip:not([hidden])');
    assert.match(await page.textContent('#chart-loss .chart-tip'), /^step \d+\ntrain: [\d.]+/);
    await page.setViewportSize({width: 390, height: 844});
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone`);
    const chartWidth = (await page.locator('#chart-loss canvas').boundingBox()).width;
    assert.ok(chartWidth > 300 && chartWidth <= 390, `loss chart ${chartWidth}px wide on a phone`);
    await page.screenshot({path: path.join(outDir, 'job-view-phone.png')});
    await page.setViewportSize({width: 1280, height: 900});
  });
}

if (args.suite === 'controls') {
  test('queued jobs show their queue position', async () => {
    const slow = daemon.fixture('slow', {step_ms: 150});
    const a = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('runner', slow, {maxSteps: 100000})});
    const b = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('waiter-1', slow, {maxSteps: 10})});
    const c = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('waiter-2', slow, {maxSteps: 10})});
    await page.goto(daemon.base + '/');
    await waitState(`tr[data-job-id="${a.id}"]`, 'running');
    await page.waitForFunction(([b, c]) => {
      const t = (id) => (document.querySelector(`tr[data-job-id="${id}"] .queue-pos`) || {}).textContent;
      return t(b) === '#1 in queue' && t(c) === '#2 in queue';
    }, [b.id, c.id]);
    // Filter by state.
    await page.click('.chip[data-state="queued"]');
    assert.equal(await page.locator('tr.job-row').count(), 2);
    await page.click('.chip[data-state="all"]');
    assert.equal(await page.locator('tr.job-row').count(), 3);
    for (const j of [b, c]) await daemon.api(`/jobs/${j.id}/cancel`, {method: 'POST'});
    daemon.runner = a.id;
  });

  test('pause, resume and cancel buttons follow the state and work', async () => {
    const id = daemon.runner;
    await page.goto(`${daemon.base}/#/jobs/${id}`);
    await waitState('#job-view', 'running');
    assert.deepEqual(await buttons(), {pause: true, resume: false, cancel: true});

    await page.click('#btn-pause');
    await waitState('#job-view', 'paused');
    assert.deepEqual(await buttons(), {pause: false, resume: true, cancel: true});
    // Pausing checkpointed the job: the list shows it.
    await page.waitForSelector('#checkpoints tbody tr');

    await page.click('#btn-resume');
    await waitState('#job-view', 'running');
    assert.deepEqual(await buttons(), {pause: true, resume: false, cancel: true});

    await page.click('#btn-cancel');
    await waitState('#job-view', 'cancelled');
    assert.deepEqual(await buttons(), {pause: false, resume: false, cancel: false});
    assert.equal(await stateOf('#job-view'), 'cancelled');

    // The server decides: force a click the state forbids and its JSON
    // error is shown.
    await page.evaluate(() => { const b = document.querySelector('#btn-resume'); b.disabled = false; b.click(); });
    await page.waitForSelector('#action-error:not([hidden])');
    assert.match(await page.textContent('#action-error'), /resume refused: .+/);
  });

  test('the submit form shows a bad learning rate next to its field', async () => {
    await fillSmallJob(page, daemon, daemon.fixture('quick', {step_ms: 10}));
    await page.fill('[name="hyperparameters.lr"]', '-1');
    await page.click('#submit-form-btn');
    const err = '.field[data-field="hyperparameters.lr"] .field-error';
    await page.waitForSelector(`${err}:not([hidden])`);
    assert.match(await page.textContent(err), /lr/);
    assert.equal(await page.isVisible('#submit-error'), false, 'the error went to the banner, not the field');

    await page.fill('[name="hyperparameters.lr"]', '0.001');
    await page.click('#submit-form-btn');
    await page.waitForSelector('#job-view');
    await waitState('#job-view', 'succeeded');
  });

  test('GPUs view shows the holding job; a GPU job charts its GPU samples', async () => {
    await page.goto(`${daemon.base}/#/gpus`);
    await page.waitForSelector('article.gpu[data-index="1"]');
    assert.equal(await page.locator('article.gpu').count(), 2);
    const model = daemon.fixture('on-gpu', {step_ms: 100});
    const spec = daemon.spec('gpu-job', model, {maxSteps: 400});
    spec.resources = {gpus: 1};
    const job = await daemon.api('/jobs', {method: 'POST', body: spec});
    // The card of the GPU it got names it, live (state events re-read /gpus).
    await page.waitForFunction((id) => [...document.querySelectorAll('article.gpu a')]
      .some((a) => a.getAttribute('href') === `#/jobs/${id}`), job.id);
    await page.goto(`${daemon.base}/#/jobs/${job.id}`);
    await page.waitForFunction(() => Number(document.querySelector('#chart-gpu-util')?.dataset.points) >= 2);
    const n = await points('#chart-gpu-util');
    await page.waitForFunction((n) => Number(document.querySelector('#chart-gpu-util')?.dataset.points) > n, n);
    assert.ok(await points('#chart-gpu-mem') >= 2);
    await page.click('#btn-cancel');
    await waitState('#job-view', 'cancelled');
  });
}

if (args.suite === 'auth') {
  test('a 401 opens the token prompt; the token is kept for the session and used for streams', async () => {
    // Without a token the API answers 401 and the page asks for one.
    const anon = await fetch(`${daemon.base}/jobs`);
    assert.equal(anon.status, 401);
    await page.goto(daemon.base + '/');
    await page.waitForSelector('#token-dialog[open]');
    await page.fill('#token-dialog input', 'ty_not-a-real-token');
    await page.click('#token-dialog button[value="ok"]');
    // A wrong token is refused and asked for again.
    await page.waitForFunction(() => /refused/.test(document.querySelector('#token-dialog .token-msg')?.textContent || '')
      && document.querySelector('#token-dialog').open);
    await page.fill('#token-dialog input', daemon.token);
    await page.click('#token-dialog button[value="ok"]');
    await page.waitForSelector('#conn[data-state="open"]');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('trainyard.token')), daemon.token);

    // The live feed works with the token: a new job appears without reload.
    const model = daemon.fixture('quick', {step_ms: 20});
    const job = await daemon.api('/jobs', {method: 'POST', body: daemon.spec('authed', model, {maxSteps: 20})});
    await waitState(`tr[data-job-id="${job.id}"]`, 'succeeded');
    await page.click(`tr[data-job-id="${job.id}"] a`);
    await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.dataset.points) >= 20);

    // A reload in the same tab keeps the token: no prompt.
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    assert.equal(await page.evaluate(() => document.querySelector('#token-dialog').open), false);
  });
}

test('the page requested nothing from any other host and raised no error', () => {
  assert.deepEqual(foreign, []);
  assert.deepEqual(pageErrors, []);
});
