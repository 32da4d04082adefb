// clock.js — relative times that stay current without refetching.
//
// A job's age and ETA are relative to now, but the job object is read only
// every few seconds (and a finished job's never again). Rather than
// re-rendering rows, the views mark such cells with the absolute instant
// they count from or to — data-since (an RFC 3339 time: an age) and
// data-until (milliseconds since the epoch: an ETA) — and one page-wide
// clock rewrites just those cells' text once a second. The server's
// progress.eta_s is as of the moment the job was read, so the deadline is
// that moment plus eta_s, and the next read corrects it. Only a running
// job has an ETA: a paused, stopping, queued or finished one shows none,
// and neither does a stalled one (stalled_at set: no metric for its
// stall_after_s), whose pace says nothing about when it ends.

import {fmtAge, fmtDuration} from './util.js';

const TICK_MS = 1000;

// The instant (ms since the epoch) a job read at readAt (ms) should reach
// max_steps, or null when it has no ETA.
export function etaDeadline(job, readAt) {
  if (!job || job.state !== 'running' || job.stalled_at) return null;
  const eta = job.progress && job.progress.eta_s;
  if (typeof eta !== 'number' || !Number.isFinite(eta) || eta < 0) return null;
  return readAt + eta * 1000;
}

// An ETA's text at `now`: the time left, never below zero; '–' for none.
export function etaText(deadline, now) {
  if (deadline === null || deadline === undefined || !Number.isFinite(deadline)) return '–';
  return fmtDuration(Math.max(0, (deadline - now) / 1000));
}

// Attributes that make an element an ETA the clock keeps current.
export function etaAttrs(deadline) {
  return deadline === null ? {} : {dataset: {until: String(Math.round(deadline))}};
}

// Rewrites every marked cell under root for the time `now`.
export function tickTimes(root, now) {
  for (const el of root.querySelectorAll('[data-since]')) {
    const t = fmtAge(el.dataset.since, now) + (el.dataset.sinceSuffix || '');
    if (el.textContent !== t) el.textContent = t;
  }
  for (const el of root.querySelectorAll('[data-until]')) {
    const t = etaText(Number(el.dataset.until), now);
    if (el.textContent !== t) el.textContent = t;
  }
}

// Starts the page's one clock over root; returns the stop function.
export function startClock(root) {
  const id = setInterval(() => { if (!document.hidden) tickTimes(root, Date.now()); }, TICK_MS);
  return () => clearInterval(id);
}
