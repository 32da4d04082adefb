// store.test.mjs — the dashboard never shows a job as fine when its
// checkpoints are not in its store.
//
//   node store.test.mjs --trainyard BIN --engine BIN --out DIR
//
// A real `trainyard serve` with the test engine and a file:// checkpoint
// store that stops taking writes right after the submit (its directory is
// replaced by a file): the job view shows the job's checkpoint_error as
// soon as an upload fails for good, the job ends failed with the reason
// naming the store, and the jobs list marks the job.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {openSuite, suiteArgs} from './suite.mjs';

const args = suiteArgs('store.test.mjs');
// One try per upload: the first failure is final, so the test does not
// wait out the retry backoff.
const {daemon, page, outDir, pageErrors} = await openSuite(args, 'store',
  {extra: ['--cpu-slots', '1', '--gpus', 'none', '--upload-attempts', '1']});

test('a store that stops taking writes: the job view and the list say so, the job fails', async () => {
  const storeDir = path.join(daemon.root, 'store');
  fs.mkdirSync(storeDir);
  const uri = `file://${storeDir}`;
  const model = daemon.fixture('steady', {step_ms: 80});
  const spec = daemon.spec('broken-store', model, {maxSteps: 40, ckptEvery: 10});
  spec.checkpoint.store = uri;
  const job = await daemon.api('/jobs', {method: 'POST', body: spec}); // the probe passed
  fs.rmSync(storeDir, {recursive: true, force: true});
  fs.writeFileSync(storeDir, 'not a directory any more\n');

  await page.goto(`${daemon.base}/#/jobs/${job.id}`);
  await page.waitForSelector('#checkpoint-error:not([hidden])');
  assert.match(await page.textContent('#checkpoint-error'),
    new RegExp(`^Not in the store: step-\\d{6} not uploaded to ${uri}: `));
  await page.waitForSelector('#job-view[data-state="failed"]');
  // The state event comes first; the error arrives with the job's re-read.
  await page.waitForSelector('.job-error:not([hidden])');
  assert.match(await page.textContent('.job-error'),
    new RegExp(`final checkpoint step-000040 is not in ${uri}`));
  await page.screenshot({path: path.join(outDir, 'job-view.png'), fullPage: true});

  await page.goto(`${daemon.base}/#/`);
  const warn = `tr[data-job-id="${job.id}"] .ckpt-warn`;
  await page.waitForSelector(warn);
  assert.match(await page.getAttribute(warn, 'title'), new RegExp(`not uploaded to ${uri}`));
  assert.deepEqual(pageErrors, []);
});
