// ops.test.mjs — operations on the dashboard: a running job that
// stopped reporting shows a "stalled" badge in the jobs list, a notice in
// its view and a badge in its header with no ETA, and the list filters by
// tag (from the URL, the filter box, or a click on a row's tag).
//
//   node ops.test.mjs --trainyard BIN --engine BIN --out DIR
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {openSuite, suiteArgs} from './suite.mjs';

const args = suiteArgs('ops.test.mjs');
const {daemon, page, outDir, pageErrors} = await openSuite(args, 'ops',
  {extra: ['--cpu-slots', '3', '--gpus', 'none', '--grace', '1']});

test('a stalled job is marked; the list filters by tag', async () => {
  const hang = daemon.fixture('hang', {step_ms: 30, hang_at_step: 5});
  const steady = daemon.fixture('steady', {step_ms: 30});
  const s1 = daemon.spec('stuck', hang, {maxSteps: 1000});
  s1.limits = {stall_after_s: 1};
  s1.tags = ['team-a'];
  const stuck = await daemon.api('/jobs', {method: 'POST', body: s1});
  const s2 = daemon.spec('other', steady, {maxSteps: 20});
  s2.tags = ['team-b'];
  const other = await daemon.api('/jobs', {method: 'POST', body: s2});

  await page.goto(`${daemon.base}/#/`);
  const badge = `tr[data-job-id="${stuck.id}"] .stall-badge`;
  await page.waitForSelector(badge);
  assert.match(await page.getAttribute(badge, 'title'), /^No metric since \d{4}-/);
  await page.waitForSelector(`tr[data-job-id="${other.id}"]`);
  assert.equal(await page.$(`tr[data-job-id="${other.id}"] .stall-badge`), null);
  await page.screenshot({path: path.join(outDir, 'stalled.png'), fullPage: true});

  // The job view says it among the engine notices.
  await page.goto(`${daemon.base}/#/jobs/${stuck.id}`);
  await page.waitForSelector('.ops-notice[data-type="stall"]');
  assert.match(await page.textContent('.ops-notice[data-type="stall"]'), /stalled: no metric for \d+ s \(stall_after_s 1, step \d+\); on_stall warn/);
  // Its header carries the badge beside the state, and it shows no ETA.
  await page.waitForSelector('#job-view[data-stalled="yes"] .view-head #job-stall');
  assert.match(await page.getAttribute('#job-stall', 'title'), /^No metric since /);
  assert.equal(await page.textContent('#job-eta'), '–');
  await page.goto(`${daemon.base}/#/`);
  await page.waitForSelector(badge);

  // A click on a row's tag filters the list by it (the server's ?tag=).
  await page.click(`tr[data-job-id="${other.id}"] .tag`);
  await page.waitForSelector(`tr[data-job-id="${stuck.id}"]`, {state: 'detached'});
  assert.equal(await page.$eval('#tag-filter', (e) => e.value), 'team-b');
  assert.match(page.url(), /tag=team-b/);
  // The filter box; and from the URL alone.
  await page.fill('#tag-filter', 'team-a');
  await page.press('#tag-filter', 'Enter');
  await page.waitForSelector(`tr[data-job-id="${other.id}"]`, {state: 'detached'});
  await page.waitForSelector(`tr[data-job-id="${stuck.id}"]`);
  await page.goto(`${daemon.base}/#/?tag=nobody`);
  await page.reload();
  await page.waitForSelector('p.notice:not([hidden])');
  assert.match(await page.textContent('p.notice'), /tagged nobody/);
  await daemon.api(`/jobs/${stuck.id}/cancel`, {method: 'POST'});
  assert.deepEqual(pageErrors, []);
});
