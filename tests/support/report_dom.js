// Runs a `moetier report` page's inline script in node against a minimal DOM
// (tests/unit/test_report.cpp): the script must run without an exception,
// fill every chart container with SVG, put exact values in its tooltips, and
// answer a hover on the hit-rate curves and the monitor charts and a click on
// every phase button. Prints one JSON line of findings; exits 1 on an error.
//   node report_dom.js PAGE.html [SVG_DIR]   (SVG_DIR: also write each chart's SVG)
'use strict';
const fs = require('fs');
const vm = require('vm');

const html = fs.readFileSync(process.argv[2], 'utf8');
const data = html.match(/<script type="application\/json" id="moetier-data">([\s\S]*?)<\/script>/);
const scripts = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
if (!data || scripts.length !== 1) throw new Error('expected the data block and one script');

const byId = {};
const decode = (s) => s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<')
  .replace(/&gt;/g, '>').replace(/&amp;/g, '&');

class El {
  constructor(id, attrs) {
    this.id = id;
    this.attrs = attrs || {};
    this.listeners = {};
    this.style = {};
    this.hidden = false;
    this.className = '';
    this.textContent = '';
    this._html = '';
    this._q = {};
    if (id) byId[id] = this;
  }
  set innerHTML(h) {
    this._html = h;
    this._q = {};
    for (const m of h.matchAll(/ id="([^"]+)"/g)) new El(m[1]);
  }
  get innerHTML() { return this._html; }
  addEventListener(type, f) { (this.listeners[type] = this.listeners[type] || []).push(f); }
  fire(type, ev) { (this.listeners[type] || []).forEach((f) => f(ev)); }
  getAttribute(n) { return this.attrs[n] === undefined ? null : this.attrs[n]; }
  setAttribute(n, v) { this.attrs[n] = String(v); }
  getBoundingClientRect() { return { left: 0, top: 0, width: 880, height: 200 }; }
  closest() { return this.attrs['data-tip'] !== undefined ? this : null; }
  querySelector(sel) { return this.querySelectorAll(sel)[0] || null; }
  querySelectorAll(sel) {
    if (this._q[sel]) return this._q[sel];
    let out = [];
    const all = this.id === 'monitor-charts' ? this.deepHtml() : this._html;
    if (sel === 'svg.lc') out = [...all.matchAll(/<svg class="lc"/g)].map(() => new El());
    else if (sel === 'g.xh') out = [...all.matchAll(/<g class="xh">/g)].map(() => new El());
    else if (/button\[data-phase\]/.test(sel)) {
      out = [...all.matchAll(/<button data-group="([^"]*)" data-phase="([^"]*)">/g)].map((m) =>
        new El(null, { 'data-group': decode(m[1]), 'data-phase': decode(m[2]) }));
    } else throw new Error('selector not in the stub: ' + sel);
    this._q[sel] = out;
    return out;
  }
  deepHtml() { return this._html; }
}

for (const m of html.matchAll(/ id="?([A-Za-z0-9_-]+)"?/g)) new El(m[1]);
byId['moetier-data'].textContent = data[1];
const body = new El('body');
const doc = new El('document');
const document = {
  body,
  getElementById: (id) => byId[id] || null,
  querySelectorAll: (sel) => {
    const m = sel.match(/^#([\w-]+) (.*)$/);
    if (!m) throw new Error('selector not in the stub: ' + sel);
    return byId[m[1]].querySelectorAll(m[2]);
  },
  addEventListener: (t, f) => doc.addEventListener(t, f),
};
const errors = [];
const context = { document, window: { innerWidth: 1200 }, console: { log() {}, error: (...a) =>
  errors.push(a.join(' ')) }, JSON, Math, String, Number, Object, Array, isFinite };
vm.createContext(context);
vm.runInContext(scripts[0], context, { filename: 'report.js' });

const found = { charts: {}, tips: 0, decodeTips: [], simulateTip: '', monitorTip: '', clicks: 0 };
const allHtml = () => Object.values(byId).map((e) => e._html).join('\n');
for (const id of ['chart-decode', 'chart-prompt', 'chart-ttft', 'chart-memory', 'chart-storage',
  'chart-simulate', 'monitor-charts']) {
  const el = byId[id];
  if (!el) throw new Error('no container #' + id);
  let h = el._html;
  for (const m of h.matchAll(/<div id="(mon\d+)">/g)) h += byId[m[1]]._html;
  found.charts[id] = (h.match(/<svg/g) || []).length;
}
const tips = [...allHtml().matchAll(/data-tip="([^"]*)"/g)].map((m) => decode(m[1]));
found.tips = tips.length;
found.decodeTips = tips.filter((t) => /decode_tps/.test(t));
found.peakTip = tips.find((t) => /peak device memory/.test(t)) || '';

const tip = byId.tip;
const sim = byId['chart-simulate'].querySelector('svg.lc');
if (sim) {
  sim.fire('mousemove', { clientX: 500, clientY: 100 });
  found.simulateTip = tip.textContent;
}
const buttons = document.querySelectorAll('#monitor-charts button[data-phase]');
for (const b of buttons) {
  b.fire('click', {});
  found.clicks++;
  const group = byId[b.getAttribute('data-group')];
  const svg = group.querySelector('svg.lc');
  if (svg) {
    svg.fire('mousemove', { clientX: 300, clientY: 50 });
    if (!found.monitorTip) found.monitorTip = tip.textContent;
  }
}
// leave every group on "all" again for the SVG dump
for (const b of buttons) if (b.getAttribute('data-phase') === 'all') b.fire('click', {});
const hover = { target: new El(null, { 'data-tip': 'x\ny' }), clientX: 1, clientY: 1 };
doc.fire('mouseover', hover);
found.hoverTip = tip.textContent;
found.ready = body.getAttribute('data-charts-ready');
found.errors = errors;

if (process.argv[3]) {
  let n = 0;
  for (const e of Object.values(byId)) {
    for (const m of e._html.matchAll(/<svg[\s\S]*?<\/svg>/g)) {
      const svg = m[0].replace('<svg', '<svg xmlns="http://www.w3.org/2000/svg"');
      fs.writeFileSync(`${process.argv[3]}/${e.id || 'el'}-${n++}.svg`, svg);
    }
  }
}
console.log(JSON.stringify(found));
process.exit(errors.length ? 1 : 0);
