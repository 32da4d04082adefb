// summary.test.mjs — web.summary: the job view's summary cards and the jobs
// table read at a glance, in headless Chromium against a real
// `trainyard serve` driving the test engine.
//
//   node summary.test.mjs --trainyard BIN --engine BIN --out DIR
//
// The Parameters card shows the count and, on a line of its own, what is
// trainable ("all trainable", or "45.1k trainable (4.1%)" for LoRA) instead
// of cutting "112k (112k trai…"; no card of the summary is cut at desktop or
// phone width; each number column keeps one format (loss in four significant
// digits, lr 2.72e-5,
// tokens/s 1,234). Screenshots of both widths are saved in DIR/summary.
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {openSuite, suiteArgs} from './suite.mjs';

const args = suiteArgs('summary.test.mjs');
const {daemon, page, outDir} = await openSuite(args, 'summary', {extra: ['--cpu-slots', '2', '--gpus', 'none']});

// A loss of the fixture (0.5 to 3.5) in four significant digits: 2.117, 0.5012.
const FOUR_DIGITS = /^(\d\.\d{3}|0\.\d{4})$/;

// Text of each summary card by its label, and whether its value is cut.
async function cards() {
  return page.$$eval('.summary .stat', (els) => els.map((el) => {
    const v = el.querySelector('.stat-v');
    const sub = el.querySelector('.stat-sub');
    return {k: el.querySelector('.stat-k').textContent, v: v.textContent, sub: sub ? sub.textContent : null,
      cut: v.scrollWidth > v.clientWidth + 1};
  }));
}

async function openJob(id) {
  await page.goto(`${daemon.base}/#/jobs/${id}`);
  // The engine's started event has arrived and a metric with it.
  await page.waitForFunction(() => {
    const ks = [...document.querySelectorAll('.summary .stat-k')].map((e) => e.textContent);
    const loss = document.getElementById('last-loss');
    return ks.includes('Parameters') && loss && /\d/.test(loss.textContent);
  });
}

test('Parameters shows the count and what is trainable, uncut; one format per number', async () => {
  const slow = daemon.fixture('slow', {step_ms: 200});
  const full = daemon.spec('full-job', slow, {maxSteps: 2000});
  full.hyperparameters.lr = 2.72036e-05;
  const a = await daemon.api('/jobs', {method: 'POST', body: full});
  const lora = daemon.spec('lora-job', slow, {maxSteps: 2000});
  lora.method = 'lora';
  lora.lora = {r: 8};
  const b = await daemon.api('/jobs', {method: 'POST', body: lora});

  for (const [width, height] of [[1280, 900], [390, 844]]) {
    await page.setViewportSize({width, height});
    await openJob(a.id);
    let c = await cards();
    const params = c.find((x) => x.k === 'Parameters');
    assert.equal(params.v, '1.1M');
    assert.equal(params.sub, 'all trainable');
    for (const x of c) {
      if (x.k !== 'Model') assert.equal(x.cut, false, `the ${x.k} card is cut at ${width}px: "${x.v}"`);
    }
    assert.match(c.find((x) => x.k === 'LR').v, /^2\.72e-5$/);
    assert.match(c.find((x) => x.k === 'Loss').v, FOUR_DIGITS);
    assert.match(c.find((x) => x.k === 'Tokens/s').v, /^[\d,]+$/);
    await page.screenshot({path: path.join(outDir, `job-${width}px.png`), fullPage: true});

    await openJob(b.id);
    c = await cards();
    const lp = c.find((x) => x.k === 'Parameters');
    assert.equal(lp.v, '1.1M');
    assert.equal(lp.sub, '45.1k trainable (4.1%)');
    assert.equal(lp.cut, false);
  }

  // The jobs table: every loss with four significant digits.
  await page.setViewportSize({width: 1280, height: 900});
  await page.goto(`${daemon.base}/#/`);
  await page.waitForSelector(`tr.job-row[data-job-id="${b.id}"]`);
  await page.waitForFunction(() => [...document.querySelectorAll('tr.job-row td.loss')]
    .every((t) => /\d/.test(t.textContent)));
  const losses = await page.$$eval('tr.job-row td.loss', (tds) => tds.map((t) => t.textContent));
  assert.equal(losses.length, 2);
  for (const l of losses) assert.match(l, FOUR_DIGITS);
  await daemon.api(`/jobs/${a.id}/cancel`, {method: 'POST'});
  await daemon.api(`/jobs/${b.id}/cancel`, {method: 'POST'});
});
