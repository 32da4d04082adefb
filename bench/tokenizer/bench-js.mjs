// bench-js.mjs — encode throughput of the JavaScript reference tokenizer
// (gpt-3-encoder, llama-tokenizer-js or llama3-tokenizer-js) on the same text
// file, line by line, for at least a couple of seconds; prints the same JSON
// line as tok-bench (first pass and sustained MB/s) so run.sh can put the two
// side by side.
// usage: node bench-js.mjs gpt2|llama2|llama3 TEXT_FILE
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const here = path.dirname(new URL(import.meta.url).pathname);
const mods = path.join(here, '..', '..', 'tests', 'tokenizer', 'node_modules');
const [model, file] = process.argv.slice(2);
let encode;
if (model === 'gpt2') {
  const gpt3 = createRequire(path.join(mods, 'x.js'))('gpt-3-encoder');
  encode = (t) => gpt3.encode(t);
} else if (model === 'llama2') {
  const { default: tok } = await import(pathToFileURL(path.join(mods, 'llama-tokenizer-js', 'llama-tokenizer.js')));
  encode = (t) => (t.length ? tok.encode(t, false, true) : []);
} else if (model === 'llama3') {
  const { default: tok } = await import(pathToFileURL(path.join(mods, 'llama3-tokenizer-js', 'bundle', 'llama3-tokenizer-with-baked-data.js')));
  encode = (t) => tok.encode(t, { bos: false, eos: false });
} else {
  console.error('usage: node bench-js.mjs gpt2|llama2|llama3 TEXT_FILE');
  process.exit(2);
}
const buf = fs.readFileSync(file);
const lines = buf.toString('utf8').split('\n');
let bytes = 0, tokens = 0, passes = 0;
const start = process.hrtime.bigint();
let elapsed = 0, first = 0;
do {
  for (const l of lines) tokens += encode(l).length;
  bytes += buf.length;
  passes++;
  elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  if (passes === 1) first = elapsed;
} while (elapsed < 2.0);
console.log(JSON.stringify({ bytes, tokens, seconds: +elapsed.toFixed(3), passes, threads: 1,
  first_pass_mb_per_s: +(buf.length / 1e6 / first).toFixed(4), mb_per_s: +(bytes / 1e6 / elapsed).toFixed(4) }));
