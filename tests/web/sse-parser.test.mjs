// sse-parser.test.mjs — the dashboard's text/event-stream parser (web/api.js)
// fed the ways a network delivers bytes: split anywhere, \r\n split across
// chunks, bare \r line ends, comments, multi-line data, ids without data.
// Runs in plain Node: api.js touches the browser only inside functions.
import test from 'node:test';
import assert from 'node:assert/strict';
import {SseParser} from '../../web/api.js';

const STREAM = ': hb\r\n\r\nid: 1\r\nevent: state\r\ndata: {"seq":1}\r\n\r\n' +
  'id: 2\nevent: metric\ndata: {"a":\ndata: 2}\n\n' +
  'id: 3\revent: log\rdata:no-space\r\r' +
  'id: 4\n\n' + // an id alone dispatches nothing
  'data: tail\n\n';

const WANT = [
  {id: '1', event: 'state', data: '{"seq":1}'},
  {id: '2', event: 'metric', data: '{"a":\n2}'},
  {id: '3', event: 'log', data: 'no-space'},
  {id: '4', event: 'message', data: 'tail'},
];

test('whole stream at once', () => {
  assert.deepEqual(new SseParser().push(STREAM), WANT);
});

test('every split point, in two chunks', () => {
  for (let i = 0; i <= STREAM.length; i++) {
    const p = new SseParser();
    const got = [...p.push(STREAM.slice(0, i)), ...p.push(STREAM.slice(i))];
    assert.deepEqual(got, WANT, `split at ${i}`);
  }
});

test('one character at a time', () => {
  const p = new SseParser();
  const got = [];
  for (const c of STREAM) got.push(...p.push(c));
  assert.deepEqual(got, WANT);
});

test('an unfinished event is held back until its blank line', () => {
  const p = new SseParser();
  assert.deepEqual(p.push('id: 9\ndata: x\n'), []);
  assert.deepEqual(p.push('\n'), [{id: '9', event: 'message', data: 'x'}]);
});
