// app.js — the dashboard's entry point: hash router, token prompt and the
// one shared connection to GET /events.
//
// Views are modules exporting mount(main, app, params) -> unmount(). They
// subscribe to the shared feed (every job's state changes and GPU samples)
// through app.feed.on() rather than opening their own connection, so the
// page keeps exactly one global stream however the user navigates. One
// page clock (clock.js) keeps the views' ages and ETAs current.

import {openStream, setTokenAsker, setToken, getToken} from './api.js';
import * as jobsView from './view-jobs.js';
import * as jobView from './view-job.js';
import * as submitView from './view-submit.js';
import * as gpusView from './view-gpus.js';
import * as compareView from './view-compare.js';
import {startClock} from './clock.js';

// A tiny publish/subscribe over the /events stream.
class Feed {
  constructor() {
    this.subs = new Set();
    this.statusSubs = new Set();
    this.stream = null;
    this.status = 'connecting';
  }
  start() {
    this.stream = openStream('/events', {
      onEvent: (type, ev) => { for (const f of this.subs) f(type, ev); },
      onStatus: (st, detail) => {
        this.status = st;
        for (const f of this.statusSubs) f(st, detail);
      },
      shouldReconnect: () => true,
    });
  }
  // f(type, event) for every event; returns the unsubscribe function.
  on(f) { this.subs.add(f); return () => this.subs.delete(f); }
  onStatus(f) { this.statusSubs.add(f); return () => this.statusSubs.delete(f); }
}

const app = {feed: new Feed()};
let unmount = null;

const routes = [
  {re: /^#?\/?(?:jobs)?\/?(?:\?(.*))?$/, view: jobsView, nav: 'jobs',
    params: (m) => ({query: new URLSearchParams(m[1] || '')})},
  {re: /^#\/jobs\/(\d+)\/?$/, view: jobView, nav: 'jobs', params: (m) => ({id: Number(m[1])})},
  {re: /^#\/submit\/?$/, view: submitView, nav: 'submit', params: () => ({})},
  {re: /^#\/gpus\/?$/, view: gpusView, nav: 'gpus', params: () => ({})},
  {re: /^#\/compare\/?(?:\?(.*))?$/, view: compareView, nav: 'jobs',
    params: (m) => ({query: new URLSearchParams(m[1] || '')})},
];

function route() {
  const hash = location.hash || '#/';
  const main = document.getElementById('main');
  if (unmount) { unmount(); unmount = null; }
  main.replaceChildren();
  for (const r of routes) {
    const m = hash.match(r.re);
    if (!m) continue;
    for (const a of document.querySelectorAll('nav.top a[data-nav]')) {
      a.classList.toggle('active', a.dataset.nav === r.nav);
    }
    unmount = r.view.mount(main, app, r.params(m)) || null;
    main.focus({preventScroll: true});
    return;
  }
  const p = document.createElement('p');
  p.className = 'notice';
  p.textContent = `No page at ${hash}.`;
  main.append(p);
}

// The token dialog: resolves with the typed token, or null on cancel.
function askToken(rejected) {
  const dlg = document.getElementById('token-dialog');
  const input = dlg.querySelector('input');
  const msg = dlg.querySelector('.token-msg');
  msg.textContent = rejected
    ? 'The server refused that token. Enter another.'
    : 'This server needs an API token (create one with `trainyard token create NAME`).';
  input.value = '';
  return new Promise((resolve) => {
    const done = (v) => {
      dlg.removeEventListener('close', onClose);
      resolve(v);
    };
    const onClose = () => done(dlg.returnValue === 'ok' && input.value.trim() ? input.value.trim() : null);
    dlg.addEventListener('close', onClose);
    dlg.showModal();
    input.focus();
  });
}

function showConnection(st) {
  const el = document.getElementById('conn');
  const word = {open: 'live', retry: 'reconnecting', error: 'error', closed: 'offline'}[st] || st;
  el.textContent = word;
  el.dataset.state = st;
}

function init() {
  setTokenAsker(askToken);
  const signout = document.getElementById('signout');
  const syncSignout = () => { signout.hidden = !getToken(); };
  syncSignout();
  signout.addEventListener('click', () => { setToken(''); syncSignout(); location.reload(); });
  app.feed.onStatus((st) => { showConnection(st); syncSignout(); });
  app.feed.start();
  startClock(document.getElementById('main'));
  window.addEventListener('hashchange', route);
  route();
}

init();
