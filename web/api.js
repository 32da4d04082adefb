// api.js — the dashboard's only door to the daemon: JSON requests and SSE.
//
// Both go through fetch() so one code path sends the bearer token, asks the
// user for it on a 401 (kept in sessionStorage for the tab's lifetime) and,
// for event streams, sends Last-Event-ID on reconnect. EventSource cannot
// set headers, which is why SSE is parsed here by hand (SseParser).

const TOKEN_KEY = 'trainyard.token';

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || 'http_' + status;
    this.field = e.field || null;
  }
}

export function getToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
}

export function setToken(t) {
  try {
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: the token lives only in this page */ }
}

// The token prompt is shared: ten requests failing with 401 at once open
// one dialog, and all of them retry with the token the user typed.
let tokenPrompt = null;
let askToken = async () => null;

// The app installs the dialog (a function returning the typed token or null).
export function setTokenAsker(fn) { askToken = fn; }

function promptForToken(rejected) {
  if (!tokenPrompt) {
    tokenPrompt = Promise.resolve(askToken(rejected)).then((t) => {
      tokenPrompt = null;
      if (t) setToken(t);
      return t;
    });
  }
  return tokenPrompt;
}

// fetch() with the token; on 401 asks for a token and retries until the
// user gives up (then the 401 response is returned to the caller).
export async function authFetch(url, init = {}) {
  for (;;) {
    const token = getToken();
    const headers = new Headers(init.headers || {});
    if (token) headers.set('Authorization', `Bearer ${token}`);
    const res = await fetch(url, {...init, headers, cache: 'no-store'});
    if (res.status !== 401) return res;
    const t = await promptForToken(!!token);
    if (!t) return res;
  }
}

async function readError(res) {
  let body = null;
  try { body = await res.json(); } catch { /* not JSON: keep the status */ }
  return new ApiError(res.status, body);
}

// JSON request. Throws ApiError with the server's code/message/field.
export async function api(path, {method = 'GET', body, headers = {}} = {}) {
  const init = {method, headers: {Accept: 'application/json', ...headers}};
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  const res = await authFetch(path, init);
  if (!res.ok) throw await readError(res);
  if (res.status === 204) return null;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

export async function apiText(path) {
  const res = await authFetch(path, {headers: {Accept: 'text/plain'}});
  if (!res.ok) throw await readError(res);
  return res.text();
}

// Incremental text/event-stream parser (the WHATWG rules: lines end in
// \n, \r or \r\n; "data" lines join with \n; ':' starts a comment; a blank
// line dispatches). push() takes decoded text and returns complete events.
export class SseParser {
  constructor() {
    this.buf = '';
    this.reset();
  }
  reset() { this.id = null; this.event = ''; this.data = []; this.hasData = false; }
  push(text) {
    this.buf += text;
    const out = [];
    let start = 0;
    for (;;) {
      let nl = -1;
      for (let i = start; i < this.buf.length; i++) {
        const c = this.buf.charCodeAt(i);
        if (c === 10 || c === 13) { nl = i; break; }
      }
      if (nl < 0) break;
      // A \r at the very end may be the first half of \r\n: wait for more.
      if (this.buf.charCodeAt(nl) === 13 && nl === this.buf.length - 1) break;
      const line = this.buf.slice(start, nl);
      start = nl + 1;
      if (this.buf.charCodeAt(nl) === 13 && this.buf.charCodeAt(start) === 10) start++;
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    this.buf = this.buf.slice(start);
    return out;
  }
  line(line) {
    if (line === '') {
      if (!this.hasData) { this.event = ''; return null; }
      const ev = {id: this.id, event: this.event || 'message', data: this.data.join('\n')};
      this.event = ''; this.data = []; this.hasData = false;
      return ev;
    }
    if (line[0] === ':') return null;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value[0] === ' ') value = value.slice(1);
    if (field === 'data') { this.data.push(value); this.hasData = true; }
    else if (field === 'event') this.event = value;
    else if (field === 'id' && !value.includes('\0')) this.id = value;
    return null;
  }
}

// Opens an SSE stream with reconnects. The stream remembers the last id it
// saw and resumes from it (Last-Event-ID header and ?from=, which the API
// treats the same), so a server restart leaves no gap; callers still
// dedupe by seq because a replay may overlap what already arrived.
//
// opts: from      first connect replays ids > from (omit for live only)
//       onEvent   (type, payload, rawId) for each event with JSON data
//       onStatus  ('open' | 'retry' | 'closed' | 'error', detail)
//       shouldReconnect () -> bool, asked when the server ends the stream
// Returns {close()}.
export function openStream(path, opts) {
  let lastId = opts.from !== undefined && opts.from !== null ? String(opts.from) : null;
  let ctrl = null;
  let closed = false;
  let delay = 500;
  const status = opts.onStatus || (() => {});

  const url = () => {
    if (lastId === null) return path;
    return path + (path.includes('?') ? '&' : '?') + 'from=' + encodeURIComponent(lastId);
  };

  async function connect() {
    while (!closed) {
      ctrl = new AbortController();
      let ended = 'error';
      try {
        const headers = {Accept: 'text/event-stream'};
        if (lastId !== null) headers['Last-Event-ID'] = lastId;
        const res = await authFetch(url(), {headers, signal: ctrl.signal});
        if (!res.ok) {
          const err = await readError(res);
          status('error', err);
          // 4xx other than rate limiting will not get better by retrying.
          if (res.status >= 400 && res.status < 500 && res.status !== 429) { closed = true; break; }
        } else {
          status('open');
          delay = 500;
          const reader = res.body.getReader();
          const dec = new TextDecoder();
          const parser = new SseParser();
          for (;;) {
            const {value, done} = await reader.read();
            if (done) break;
            for (const ev of parser.push(dec.decode(value, {stream: true}))) {
              if (ev.id !== null && ev.id !== '') lastId = ev.id;
              let payload = null;
              try { payload = JSON.parse(ev.data); } catch { continue; }
              opts.onEvent(ev.event, payload, ev.id);
            }
          }
          ended = 'eof';
        }
      } catch {
        // A network error or a dropped connection: retry below.
      }
      if (closed) break;
      if (ended === 'eof' && opts.shouldReconnect && !opts.shouldReconnect()) {
        closed = true;
        break;
      }
      status('retry');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 4000);
    }
    status('closed');
  }
  connect();
  return {
    close() { closed = true; if (ctrl) ctrl.abort(); },
    get lastId() { return lastId; },
  };
}

// Streams a plain-text response line by line (the log's ?follow=1).
export function followText(path, onText, onEnd) {
  const ctrl = new AbortController();
  (async () => {
    try {
      const res = await authFetch(path, {signal: ctrl.signal});
      if (!res.ok) { onEnd(await readError(res)); return; }
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        onText(dec.decode(value, {stream: true}));
      }
      onEnd(null);
    } catch (e) {
      if (!ctrl.signal.aborted) onEnd(e);
    }
  })();
  return {close() { ctrl.abort(); }};
}
