// suite.mjs — the set-up every browser suite shares, in one place: its
// command line (--trainyard, --engine, --out and the suite's own options),
// a fresh artifacts folder, a real `trainyard serve` (daemon.mjs) and a
// headless Chromium page on it (browser.mjs), and the teardown that runs
// even when an assertion fails: a last screenshot, the browser closed, the
// daemon stopped and its logs checked for sanitizer reports.
//
// A suite opens with top-level await, so its tests use plain constants:
//
//   const args = suiteArgs('ops.test.mjs');
//   const {daemon, page, outDir, pageErrors} = await openSuite(args, 'ops',
//     {extra: ['--cpu-slots', '3', '--gpus', 'none']});
//
// The page records every request to a host other than the daemon's
// (`foreign`) and every uncaught page error (`pageErrors`); the suites
// assert both empty at their end.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {parseArgs} from 'node:util';
import {launch, closeBrowser} from './browser.mjs';
import {Daemon} from './daemon.mjs';

// The suite's command line; `more` names further required string options
// (dashboard.test.mjs's --suite). A missing one exits 2 naming it.
export function suiteArgs(file, more = []) {
  const names = ['trainyard', 'engine', 'out', ...more];
  const options = Object.fromEntries(names.map((k) => [k, {type: 'string'}]));
  const {values} = parseArgs({options});
  for (const k of names) {
    if (!values[k]) { console.error(`${file}: --${k} is required`); process.exit(2); }
  }
  return values;
}

// opts: extra (the daemon's flags), token (a token name: the daemon gets
// one made before it starts, daemon.token), pageToken (the page starts with
// that token in session storage, as after a sign-in).
export async function openSuite(args, name, {extra = [], token = null, pageToken = false} = {}) {
  const outDir = path.join(args.out, name);
  fs.rmSync(outDir, {recursive: true, force: true});
  fs.mkdirSync(outDir, {recursive: true});
  const s = {outDir, daemon: null, browser: null, page: null, foreign: [], pageErrors: []};

  // Registered before anything starts, so a failure further on still tears
  // down whatever did start.
  async function teardown() {
    if (s.page) {
      try {
        await s.page.screenshot({path: path.join(outDir, 'last-page.png'), fullPage: true});
      } catch { /* closed */ }
    }
    await closeBrowser(s.browser);
    if (s.daemon) {
      await s.daemon.cleanup();
      assert.deepEqual(s.daemon.sanitizerReports(), [], 'the daemon reported memory or UB errors');
    }
  }
  try {
    s.daemon = new Daemon({trainyard: args.trainyard, engine: args.engine, outDir, extra});
    if (token) s.daemon.token = s.daemon.createToken(token);
    await s.daemon.start();
    s.browser = await launch();
    s.page = s.browser.context.pages()[0] || await s.browser.context.newPage();
    // Generous: under `make test` the machine runs every suite at once.
    s.page.setDefaultTimeout(60000);
    if (token && pageToken) {
      await s.page.addInitScript((t) => sessionStorage.setItem('trainyard.token', t), s.daemon.token);
    }
    s.page.on('request', (r) => {
      const u = r.url();
      if (!u.startsWith(s.daemon.base + '/') && !u.startsWith('data:')) s.foreign.push(u);
    });
    s.page.on('pageerror', (e) => s.pageErrors.push(e.message));
  } catch (e) {
    await teardown().catch(() => {});
    throw e;
  }
  test.after(teardown);
  return s;
}

// The submit form filled with a small valid job (a full fine-tune of the
// fixture model for 5 steps of 16 tokens, fp32 on the CPU): what a form
// test starts from before it sets the fields it is about.
export async function fillSmallJob(page, daemon, model) {
  await page.goto(`${daemon.base}/#/submit`);
  await page.fill('[name="model.path"]', model);
  await page.fill('[name="dataset.train"]', daemon.dataset());
  await page.selectOption('[name="dataset.format"]', 'tokens');
  await page.selectOption('[name="method"]', 'full');
  await page.selectOption('[name="precision"]', 'fp32');
  await page.fill('[name="resources.gpus"]', '0');
  await page.fill('[name="hyperparameters.max_steps"]', '5');
  await page.fill('[name="hyperparameters.seq_len"]', '16');
}
