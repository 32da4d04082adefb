// browser.mjs — launches Debian's Chromium headless through playwright-core
// with every background network feature off and a fresh profile, so a test
// sees only the requests the page itself makes.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// A clear message when `bash tests/setup-npm.sh` has not been run.
let chromium;
try {
  ({chromium} = await import('playwright-core'));
} catch {
  throw new Error('playwright-core is not installed: run `bash tests/setup-npm.sh` (or npm install in tests/web)');
}

export function chromiumPath() {
  for (const p of [process.env.TY_CHROMIUM, '/usr/lib/chromium/chromium', '/usr/bin/chromium']) {
    if (p && fs.existsSync(p)) return p;
  }
  return null;
}

// Returns {context, profile}; close with closeBrowser().
export async function launch() {
  const exe = chromiumPath();
  if (!exe) throw new Error('no Chromium found (apt-get install chromium)');
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-web-profile-'));
  // A persistent context is how playwright takes --user-data-dir: a fresh
  // directory per run, removed afterwards.
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: exe,
    headless: true,
    viewport: {width: 1280, height: 900},
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return {context, profile};
}

export async function closeBrowser(b) {
  if (!b) return;
  try { await b.context.close(); } catch { /* already gone */ }
  fs.rmSync(b.profile, {recursive: true, force: true});
}
