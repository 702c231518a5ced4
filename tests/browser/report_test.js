// The report as a person sees it (docs/report.md, "Tests"): Debian's Chromium,
// headless, driven by playwright-core (pinned in package.json; it never
// downloads a browser of its own), opens a `moetier report` page from disk and
//   - sees no console error, no page error and no request but the file itself,
//   - finds every chart the page draws (throughput and TTFT bars, memory,
//     storage traffic, hit-rate curves, monitor charts),
//   - hovers bars and reads their tooltips: each holds the exact value of the
//     bench JSON (JavaScript's shortest round-trip form of the number),
//   - moves over one monitor chart and sees the crosshair on every other one,
//     at the same instant,
//   - writes a full-page screenshot.
//
//   node report_test.js PAGE.html BENCH.json SCREENSHOT.png
// Prints one line per check and a JSON summary; exits 1 when a check fails.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { chromium } = require('playwright-core');

const [pagePath, benchPath, shotPath] = process.argv.slice(2);
if (!pagePath || !benchPath || !shotPath) {
  console.error('usage: node report_test.js PAGE.html BENCH.json SCREENSHOT.png');
  process.exit(2);
}
const CHROMIUM = process.env.MOETIER_CHROMIUM || '/usr/bin/chromium';
const failures = [];
function check(ok, what) {
  console.log((ok ? 'ok   ' : 'FAIL ') + what);
  if (!ok) failures.push(what);
}

async function launch() {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'moetier-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return { context, userDataDir };
}

// Every chart container holds SVG with marks of its kind.
async function checkCharts(page) {
  const want = { 'chart-decode': 'rect.bar', 'chart-prompt': 'rect.bar', 'chart-ttft': 'rect.bar',
    'chart-memory': 'rect.bar', 'chart-storage': 'rect.bar', 'chart-simulate': 'svg.lc path',
    'monitor-charts': 'svg.lc' };
  for (const [id, sel] of Object.entries(want)) {
    const n = await page.locator(`#${id} ${sel}`).count();
    const empty = await page.locator(`#${id} .empty`).count();
    check(n > 0 && empty === 0, `chart #${id}: ${n} marks (${sel}), ${empty} empty notes`);
  }
  const monitor = await page.locator('#monitor-charts svg.lc').count();
  check(monitor >= 3, `monitor: ${monitor} line charts (host MemAvailable, RSS, read bytes at least)`);
  for (const id of ['throughput', 'memory', 'storage', 'simulate', 'monitor']) {
    check(await page.locator(`section#${id} h2`).isVisible(), `section #${id} is visible`);
  }
}

// Hovers the mark whose tooltip begins with `first` and returns the tooltip's text.
async function hoverTip(page, scope, first) {
  const marks = page.locator(`${scope} [data-tip]`);
  const n = await marks.count();
  for (let i = 0; i < n; ++i) {
    const m = marks.nth(i);
    const t = await m.getAttribute('data-tip');
    if (!t.startsWith(first)) continue;
    await m.hover({ force: true });
    const tip = page.locator('#tip');
    if (!(await tip.isVisible())) return null;
    return tip.textContent();
  }
  return null;
}

async function checkTooltips(page, bench) {
  const arm = bench.arms[0], wl = arm.workloads[0];
  const head = `${arm.name} · ${wl.name}`;
  for (const [chart, key, unit] of [['chart-decode', 'decode_tps', 'tok/s'],
    ['chart-prompt', 'prompt_tps', 'tok/s'], ['chart-ttft', 'ttft_s', 's']]) {
    const v = wl.median[key];
    const text = await hoverTip(page, '#' + chart, head + '\n');
    const want = `${key}: ${String(v)} ${unit}`;
    check(text != null && text.includes(want), `#${chart}: hovered bar's tooltip has "${want}"` +
      (text == null ? ' (no tooltip)' : ''));
  }
  const mem = arm.memory;
  for (const [label, v] of [['resident core', mem.core_bytes], ['expert arena', mem.arena_bytes]]) {
    const text = await hoverTip(page, '#chart-memory', arm.name + '\n' + label + ':');
    check(text != null && text.includes(`${label}: ${String(v)} B`),
      `#chart-memory: ${label} tooltip has ${String(v)} B`);
  }
  const peak = Math.max(...wl.runs.map((r) => r.peak_device_bytes));
  const text = await hoverTip(page, '#chart-memory', arm.name + '\npeak device memory');
  check(text != null && text.includes(String(peak) + ' B'),
    `#chart-memory: peak device memory tooltip has ${String(peak)} B`);
  const cold = wl.runs.find((r) => r.cold);
  const st = await hoverTip(page, '#chart-storage', head + '\nexpert reads (cold)');
  check(st != null && st.includes(String(cold.expert_read_bytes) + ' B'),
    `#chart-storage: cold expert reads tooltip has ${String(cold.expert_read_bytes)} B`);
}

async function moveOver(page, locator, fx) {
  const box = await locator.boundingBox();
  await locator.scrollIntoViewIfNeeded();
  const b = (await locator.boundingBox()) || box;
  await page.mouse.move(b.x + b.width * fx, b.y + b.height * 0.5);
}

async function checkSimulate(page) {
  await moveOver(page, page.locator('#chart-simulate svg.lc'), 0.5);
  const tip = await page.locator('#tip').textContent();
  check(tip.includes('min (optimal)') && / B \(/.test(tip),
    'hit-rate curves: the crosshair tooltip names MIN and bytes');
  check(await page.locator('#chart-simulate g.xh line').count() === 1,
    'hit-rate curves: the crosshair is drawn');
}

// Moving over the first monitor chart draws the crosshair on all of them at one x.
async function checkCrosshair(page) {
  const svgs = page.locator('#mon0 svg.lc');
  const n = await svgs.count();
  await moveOver(page, svgs.nth(0), 0.6);
  const xs = [];
  for (let i = 0; i < n; ++i) {
    const line = svgs.nth(i).locator('g.xh line');
    xs.push((await line.count()) ? await line.first().getAttribute('x1') : null);
  }
  check(xs.every((x) => x != null), `monitor: crosshair on all ${n} charts (x = ${xs.join(', ')})`);
  check(new Set(xs).size === 1, 'monitor: every chart marks the same instant');
  const tip = await page.locator('#tip').textContent();
  check(/^t = [0-9.e+-]+ s · phase /.test(tip), `monitor: the tooltip gives the sample (${tip.split('\n')[0]})`);
  await page.mouse.move(2, 2);
  check(await page.locator('#mon0 g.xh line').count() === 0, 'monitor: the crosshair leaves with the mouse');
  const buttons = page.locator('#monitor-charts button[data-phase]');
  const nb = await buttons.count();
  await buttons.nth(nb - 1).click();
  check(await page.locator('#mon0 svg.lc').count() >= 1 &&
    (await buttons.nth(nb - 1).getAttribute('class')) === 'on', 'monitor: a phase button redraws');
  await buttons.nth(0).click();
}

async function main() {
  const bench = JSON.parse(fs.readFileSync(benchPath, 'utf8'));
  const url = 'file://' + path.resolve(pagePath);
  const { context, userDataDir } = await launch();
  const errors = [], requests = [];
  try {
    const page = context.pages()[0] || (await context.newPage());
    page.on('console', (m) => { if (m.type() === 'error') errors.push('console: ' + m.text()); });
    page.on('pageerror', (e) => errors.push('page error: ' + e.message));
    context.on('request', (r) => { if (r.url() !== url) requests.push(r.url()); });
    await page.goto(url, { waitUntil: 'load' });
    await page.waitForSelector('body[data-charts-ready="1"]', { timeout: 10000 });
    await checkCharts(page);
    await checkTooltips(page, bench);
    await checkSimulate(page);
    await checkCrosshair(page);
    await page.mouse.move(2, 2);
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: shotPath, fullPage: true });
    check(fs.statSync(shotPath).size > 10000, `screenshot written: ${shotPath}`);
  } finally {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
  check(errors.length === 0, `no console error (${errors.join(' | ') || 'none'})`);
  check(requests.length === 0, `no network request (${requests.join(' ') || 'none'})`);
  console.log(JSON.stringify({ failures, errors, requests }));
  process.exit(failures.length ? 1 : 0);
}

main().catch((e) => {
  console.error('report_test.js: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
