// Drives Kiln's built-in UI in Debian's headless Chromium (playwright-core, no browser download)
// for the end-to-end tests, and prints what the page showed as one JSON object.
//
//   node ui-check.mjs <url> <screenshot-dir> [--token T] [--search NAME] [--zoom NAME] [--download FILE]
//                     [--pause-then-refresh]
//
// With --pause-then-refresh, once the first view is read the driver prints `paused` on a line of
// its own and waits for a line on stdin (the test stops Kiln meanwhile), then presses Refresh and
// reports the status line that follows as `afterRefresh`. The JSON is always the last line.
//
// With --token the token page is filled in as a user would. Printed: `tokenAsked` (the token page
// was shown), `status` (the status line), `frames` ([name, total] of every drawn rectangle),
// (with a diff's baseline and comparison values), `table` (the top table's function names), `searchShare` (the share line after typing NAME),
// `matched` (names highlighted), `zoomed` (frames drawn after clicking NAME), `requests`,
// `htmlBytes` and `svgBytes` (the first view's weight), `screenshots`.
import { chromium } from 'playwright-core';

const [url, dir, ...rest] = process.argv.slice(2);
const opt = (name) => {
  const i = rest.indexOf(name);
  return i >= 0 ? rest[i + 1] : undefined;
};

const browser = await chromium.launch({
  executablePath: process.env.KILN_TEST_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const out = { screenshots: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  let requests = 0;
  page.on('request', () => requests++);
  await page.goto(url);
  // Loaded: the status line says what the page shows, or the page asks for a token.
  const ready = () =>
    page.waitForFunction(() => {
      const s = document.getElementById('status').textContent;
      return !document.getElementById('token').hidden || (s && s !== 'Loading…');
    });
  await ready();
  out.tokenAsked = await page.isVisible('#token');
  const shot = async (name) => {
    const path = `${dir}/${name}.png`;
    await page.screenshot({ path, fullPage: true });
    out.screenshots.push(path);
  };
  if (out.tokenAsked) await shot('token');
  const token = opt('--token');
  if (out.tokenAsked && token) {
    await page.fill('#token-input', token);
    await page.click('#token-form button[type=submit]');
    await ready();
  }
  out.status = await page.textContent('#status');
  const frames = () =>
    page.$$eval('#flame rect', (rs) =>
      rs.map((r) => [r.dataset.name, Number(r.dataset.total), r.dataset.left ?? null, r.dataset.right ?? null]),
    );
  out.frames = await frames();
  out.table = await page.$$eval('#top tbody tr td:first-child', (tds) => tds.map((t) => t.textContent));
  // Page weight: the requests of the first view, its HTML and the drawn SVG.
  out.requests = requests;
  out.htmlBytes = await page.evaluate(() => document.documentElement.outerHTML.length);
  out.svgBytes = await page.evaluate(() => document.getElementById('flame').outerHTML.length);
  await shot('flamegraph');
  const search = opt('--search');
  if (search) {
    await page.fill('#search', search);
    out.searchShare = await page.textContent('#search-share');
    out.matched = await page.$$eval('#flame g.match rect', (rs) => rs.map((r) => r.dataset.name));
    await shot('search');
    await page.fill('#search', '');
  }
  const download = opt('--download');
  if (download) {
    const [file] = await Promise.all([page.waitForEvent('download'), page.click('#download')]);
    await file.saveAs(download);
    out.downloaded = file.suggestedFilename();
  }
  if (rest.includes('--pause-then-refresh')) {
    console.log('paused');
    await new Promise((resolve) => process.stdin.once('data', resolve));
    process.stdin.pause();
    await page.click('#refresh');
    await ready();
    out.afterRefresh = await page.textContent('#status');
    await shot('after-refresh');
  }
  const zoom = opt('--zoom');
  if (zoom) {
    await page.click(`#flame rect[data-name="${zoom}"]`);
    out.zoomed = await frames();
    await shot('zoom');
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
