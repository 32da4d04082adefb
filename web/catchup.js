// catchup.js — follows several jobs' event streams with a bounded number
// of connections: the compare view's data source.
//
// A browser opens at most six HTTP/1.1 connections to one host, and the
// page already holds one (/events); ten running jobs each on its own open
// stream would starve every other request. So a job's stream is opened in
// rounds, at most `limit` at once: each round reads the job
// (GET /jobs/{id}), opens its events from the last seq applied (the server
// replays from the database in batches) and closes the stream once the
// metric the job reported as its latest has arrived. A finished job's
// stream ends by itself after its terminal state and is not reopened; an
// active one gets a new round every intervalMs, which skips the stream
// when the job reported no new step. Events are deduplicated by seq, as in
// the job view, so overlapping rounds never apply one twice.

import {api, openStream} from './api.js';
import {TERMINAL} from './util.js';

export class CatchUp {
  // opts: limit (streams at once), intervalMs, onJob(i, job),
  // onEvent(i, type, ev), onMissing(i, err) for a 404, onError(i, err).
  constructor(ids, opts) {
    this.opts = {limit: 3, intervalMs: 3000, maxRoundMs: 60000, ...opts};
    this.jobs = ids.map((id) => ({id, lastSeq: 0, lastStep: null, done: false, stream: null, timer: null}));
    this.active = 0;
    this.waiting = [];
    this.closed = false;
  }

  start() { this.jobs.forEach((_, i) => this.round(i)); }

  close() {
    this.closed = true;
    for (const j of this.jobs) {
      clearTimeout(j.timer);
      if (j.stream) j.stream.close();
    }
    for (const w of this.waiting) w();
    this.waiting = [];
  }

  acquire() {
    if (this.active < this.opts.limit) { this.active++; return Promise.resolve(); }
    return new Promise((r) => this.waiting.push(() => { this.active++; r(); }));
  }

  release() {
    this.active--;
    const next = this.waiting.shift();
    if (next) next();
  }

  later(i) {
    if (this.closed || this.jobs[i].done) return;
    this.jobs[i].timer = setTimeout(() => this.round(i), this.opts.intervalMs);
  }

  async round(i) {
    const st = this.jobs[i];
    if (this.closed || st.done) return;
    let job;
    try {
      job = await api(`/jobs/${st.id}`);
    } catch (e) {
      if (this.closed) return;
      if (e.status === 404) { st.done = true; if (this.opts.onMissing) this.opts.onMissing(i, e); return; }
      if (this.opts.onError) this.opts.onError(i, e);
      this.later(i);
      return;
    }
    if (this.closed) return;
    this.opts.onJob(i, job);
    const terminal = TERMINAL.has(job.state);
    const lm = job.last_metric;
    const target = lm && Number.isFinite(lm.step) ? lm.step : null;
    // Nothing new since the last round: no stream this time.
    if (!terminal && (target === null || (st.lastSeq > 0 && target === st.lastStep))) { this.later(i); return; }

    await this.acquire();
    if (this.closed) { this.release(); return; }
    await new Promise((resolve) => {
      let ended = false;
      const end = () => { if (!ended) { ended = true; clearTimeout(guard); if (st.stream) st.stream.close(); resolve(); } };
      // A round that cannot reach its target (it should not happen) gives
      // its connection back and retries from where it got to.
      const guard = setTimeout(end, this.opts.maxRoundMs);
      st.stream = openStream(`/jobs/${st.id}/events`, {
        from: st.lastSeq,
        shouldReconnect: () => false,
        onStatus: (s, detail) => {
          if (s === 'error' && this.opts.onError) this.opts.onError(i, detail);
          if (s === 'closed') end();
        },
        onEvent: (type, ev) => {
          if (ended) return;
          if (typeof ev.seq === 'number') {
            if (ev.seq <= st.lastSeq) return;
            st.lastSeq = ev.seq;
          }
          if (type === 'metric' && ev.data) st.lastStep = ev.data.step;
          this.opts.onEvent(i, type, ev);
          // Caught up with what the job reported: the next round continues.
          if (!terminal && type === 'metric' && ev.data && ev.data.step === target) end();
        },
      });
    });
    st.stream = null;
    this.release();
    // A finished job's stream has delivered everything up to its end.
    if (terminal) st.done = true;
    else this.later(i);
  }
}
