#!/usr/bin/env node
// Flame graph render test: draws a flame-graph data frame (the JSON shape Kiln's backend sends to
// Grafana) with @grafana/flamegraph in headless Chromium and checks that the root ("total") and a
// given function are drawn.
//
// usage: node render-test/run.mjs [frame.json] [function-name]
//   frame.json     default: test/fixtures/flamegraph-frame.json (relative to the frontend directory)
//   function-name  default: main
// env: CHROMIUM=/path/to/chromium (default /usr/bin/chromium), KILN_RENDER_TIMEOUT_MS (default 60000),
//      KILN_RENDER_SCREENSHOT=path.png (default render-test/build/flamegraph.png)
//
// Exit codes: 0 pass; 1 the flame graph did not draw what was expected; 2 bad input or set-up failure.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const frontendDir = path.resolve(here, '..');
const started = Date.now();
const log = (msg) => console.log(`[render-test] ${msg}`);

function fail(code, msg) {
  console.error(`[render-test] FAIL: ${msg}`);
  process.exit(code);
}

// ---- input ---------------------------------------------------------------------------------------
const framePath = path.resolve(process.cwd(), process.argv[2] ?? path.join(frontendDir, 'test/fixtures/flamegraph-frame.json'));
const fnName = process.argv[3] ?? 'main';

let frame;
try {
  frame = JSON.parse(fs.readFileSync(framePath, 'utf8'));
} catch (e) {
  fail(2, `cannot read frame JSON ${framePath}: ${e.message}`);
}

function validateFrame(f) {
  if (!f || !Array.isArray(f.fields)) {
    return 'top-level "fields" array missing';
  }
  const byName = Object.fromEntries(f.fields.map((x) => [x.name, x]));
  for (const n of ['level', 'value', 'self', 'label']) {
    if (!byName[n] || !Array.isArray(byName[n].values)) {
      return `field "${n}" with a "values" array missing`;
    }
  }
  const len = byName.level.values.length;
  for (const x of f.fields) {
    if (!Array.isArray(x.values) || x.values.length !== len) {
      return `field "${x.name}" has ${x.values?.length} values, "level" has ${len}`;
    }
  }
  for (const n of ['level', 'value', 'self']) {
    if (!byName[n].values.every((v) => typeof v === 'number' && Number.isFinite(v))) {
      return `field "${n}" must hold finite numbers`;
    }
  }
  if (!byName.label.values.every((v) => typeof v === 'string')) {
    return 'field "label" must hold strings';
  }
  if (len === 0) {
    return 'frame has no rows';
  }
  if (byName.level.values[0] !== 0) {
    return `row 0 must be the root at level 0 (got level ${byName.level.values[0]})`;
  }
  for (let i = 1; i < len; i++) {
    const l = byName.level.values[i];
    if (l < 1 || l > byName.level.values[i - 1] + 1) {
      return `row ${i}: level ${l} is not a valid depth-first pre-order step from ${byName.level.values[i - 1]}`;
    }
  }
  return null;
}
const invalid = validateFrame(frame);
if (invalid) {
  fail(2, `${framePath}: ${invalid}`);
}
const labels = frame.fields.find((x) => x.name === 'label').values;
const rootName = labels[0];
if (rootName !== 'total') {
  fail(2, `${framePath}: row 0 is "${rootName}", expected the root "total"`);
}
log(`frame ${framePath}: ${labels.length} rows; expecting "total" and "${fnName}"`);

// ---- environment: chromium and this package's node_modules ---------------------------------------
const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
if (!fs.existsSync(chromiumPath)) {
  if (process.env.CHROMIUM) {
    fail(2, `CHROMIUM=${chromiumPath} does not exist`);
  }
  log(`${chromiumPath} missing: apt-get install -y chromium`);
  const apt = (args) =>
    execFileSync('apt-get', args, { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
  try {
    try {
      apt(['install', '-y', '--no-install-recommends', 'chromium']);
    } catch {
      apt(['update']);
      apt(['install', '-y', '--no-install-recommends', 'chromium']);
    }
  } catch (e) {
    fail(2, `could not install chromium with apt-get (${e.message}); install it or set CHROMIUM`);
  }
}
if (!fs.existsSync(path.join(here, 'node_modules', '@grafana', 'flamegraph'))) {
  log('render-test/node_modules missing: npm ci');
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: here, stdio: 'inherit' });
}

// Imported only now: they live in render-test/node_modules.
const { bundle } = await import('./build.mjs');
const { chromium } = await import('playwright-core');

// ---- bundle and page ------------------------------------------------------------------------------
const buildDir = path.join(here, 'build');
fs.mkdirSync(buildDir, { recursive: true });
const bundlePath = await bundle(path.join(buildDir, 'bundle.js'));
log(`bundled ${path.relative(frontendDir, bundlePath)} (${(fs.statSync(bundlePath).size / 1e6).toFixed(1)} MB)`);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-render-'));
const htmlPath = path.join(tmp, 'index.html');
const frameJs = JSON.stringify(frame).replace(/</g, '\\u003c');
fs.writeFileSync(
  htmlPath,
  `<!doctype html>
<html><head><meta charset="utf-8"><title>Kiln flame graph render test</title>
<style>html,body{margin:0;background:#fff} #root{width:1400px;height:900px}</style></head>
<body><div id="root"></div>
<script>window.__KILN_FRAME__ = ${frameJs};</script>
<script src="${pathToFileURL(bundlePath).href}"></script>
</body></html>
`
);

const userDataDir = path.join(tmp, 'profile');
const timeout = Number(process.env.KILN_RENDER_TIMEOUT_MS ?? 60000);
const screenshot = process.env.KILN_RENDER_SCREENSHOT ?? path.join(buildDir, 'flamegraph.png');

let context;
let exitCode = 0;
try {
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1400, height: 900 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      '--allow-file-access-from-files',
    ],
    timeout,
  });
  const page = context.pages()[0] ?? (await context.newPage());
  const consoleErrors = [];
  const missingFiles = new Set();
  page.on('console', (m) => {
    // Grafana serves @grafana/ui's icon SVGs (public/img/icons/…); this page does not, so those
    // loads fail. That is expected and not an error of the flame graph.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) {
      consoleErrors.push(m.text());
    }
  });
  page.on('requestfailed', (r) => missingFiles.add(r.url().replace(/^.*\/public\//, 'public/')));
  page.on('pageerror', (e) => consoleErrors.push(`pageerror: ${e.message}`));
  // Nothing but file:// is needed: refuse every network request.
  await context.route(/^(?!file:|data:|blob:)/, (route) => route.abort());

  await page.goto(pathToFileURL(htmlPath).href, { waitUntil: 'load', timeout });
  // Wait until the canvas has drawn the root and the top table has rows (or an error shows up).
  await page
    .waitForFunction(
      () => {
        const r = window.__KILN_RESULT__;
        if (!r) {
          return false;
        }
        if (r.errors.length || r.checkError) {
          return true;
        }
        const table = document.querySelector('[data-testid="topTable"]');
        // "(2) total (120 ms)": the component prefixes nodes it collapsed with a count.
        return r.drawn.some((t) => t.replace(/^\(\d+\) /, '').startsWith('total')) && table && table.querySelectorAll('[role="row"]').length > 1;
      },
      null,
      { timeout, polling: 100 }
    )
    .catch(() => log('timed out waiting for the flame graph to draw'));
  // Give the last animation frame a moment, then collect.
  await page.waitForTimeout(300);
  const result = await page.evaluate(() => {
    const r = window.__KILN_RESULT__ ?? { drawn: [], rects: 0, errors: ['entry script did not run'] };
    const table = document.querySelector('[data-testid="topTable"]');
    const rows = table
      ? Array.from(table.querySelectorAll('[role="row"]')).map((row) =>
          Array.from(row.querySelectorAll('[role="cell"]')).map((c) => c.textContent.trim())
        )
      : [];
    const canvas = document.querySelector('canvas[data-testid="flameGraph"]');
    return {
      drawn: r.drawn,
      rects: r.rects,
      errors: r.errors,
      checkError: r.checkError,
      rendered: r.rendered,
      tableRows: rows.filter((c) => c.length > 0),
      canvas: canvas ? { width: canvas.width, height: canvas.height } : null,
      bodyText: document.body.innerText.slice(0, 2000),
    };
  });
  await page.screenshot({ path: screenshot, fullPage: true }).catch((e) => log(`screenshot failed: ${e.message}`));

  // The top table is virtualised: only rows in view are in the DOM. If the function is neither
  // drawn nor in view, search for it with the component's own search box and read the table again.
  // A label may carry the count of collapsed nodes in front: "(2) total (120 ms)".
  const bare = (t) => t.replace(/^\(\d+\) /, '');
  const isDrawn = (name) => result.drawn.map(bare).some((t) => t === name || t.startsWith(`${name} (`));
  const inTable = (name) => result.tableRows.some((cells) => cells.includes(name));
  let foundBySearch = false;
  if (!isDrawn(fnName) && !inTable(fnName)) {
    const search = page.getByPlaceholder('Search...');
    if ((await search.count()) > 0) {
      await search.first().fill(fnName);
      await page.waitForTimeout(1000);
      const rows = await page.evaluate(() =>
        Array.from(document.querySelectorAll('[data-testid="topTable"] [role="row"]')).map((row) =>
          Array.from(row.querySelectorAll('[role="cell"]')).map((c) => c.textContent.trim())
        )
      );
      foundBySearch = rows.some((cells) => cells.includes(fnName));
      log(`searched the top table for "${fnName}": ${JSON.stringify(rows.filter((c) => c.length).slice(0, 10))}`);
    }
  }
  const uniqueDrawn = [...new Set(result.drawn)];
  log(`canvas ${result.canvas ? `${result.canvas.width}x${result.canvas.height}` : 'missing'}, ${result.rects} fills, labels drawn: ${JSON.stringify(uniqueDrawn)}`);
  log(`top table rows: ${JSON.stringify(result.tableRows.slice(0, 20))}`);
  log(`screenshot: ${screenshot}`);
  if (missingFiles.size) {
    log(`${missingFiles.size} files not served (expected: Grafana's icons), e.g. ${[...missingFiles].slice(0, 3).join(', ')}`);
  }

  const problems = [];
  if (result.checkError) {
    problems.push(`@grafana/flamegraph rejected the frame: ${result.checkError}`);
  }
  for (const e of [...result.errors, ...consoleErrors]) {
    problems.push(`browser error: ${e}`);
  }
  if (!result.canvas) {
    problems.push('no flame graph canvas in the page');
  }
  if (result.rects === 0) {
    problems.push('nothing was filled on the canvas');
  }
  // A drawn label is "<name> (<value with unit>)" or, when the bar is narrow, just "<name>".
  if (!isDrawn('total')) {
    problems.push('the root "total" was not drawn on the canvas');
  }
  if (isDrawn(fnName)) {
    log(`"${fnName}" drawn on the canvas`);
  } else if (inTable(fnName) || foundBySearch) {
    log(`"${fnName}" is in the top table but its bar is too narrow to carry a label on the canvas`);
  } else {
    problems.push(`"${fnName}" was neither drawn on the canvas nor listed in the top table`);
  }
  if (problems.length) {
    for (const p of problems) {
      console.error(`[render-test] FAIL: ${p}`);
    }
    console.error(`[render-test] page text: ${result.bodyText}`);
    exitCode = 1;
  } else {
    log(`PASS: "total" and "${fnName}" rendered (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  }
} catch (e) {
  console.error(`[render-test] FAIL: ${e.stack ?? e}`);
  exitCode = 2;
} finally {
  if (context) {
    await context.close().catch(() => {});
  }
  fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(exitCode);
