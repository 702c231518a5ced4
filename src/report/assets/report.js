// moetier report: draws the page's charts as inline SVG from the results
// embedded in <script id="moetier-data"> (docs/report.md). No library, no
// network. Every mark carries its exact value in data-tip (the tooltip); the
// tables under the charts hold the same values.
(function () {
  'use strict';
  const files = JSON.parse(document.getElementById('moetier-data').textContent);
  const tip = document.getElementById('tip');
  const PALETTE = ['#3a5ba0', '#e07b39', '#3f9e5a', '#a04a8c', '#c9a227', '#4aa3b8', '#8c6d3a',
    '#d04b4b'];
  const W = 880;

  // ---- formatting -------------------------------------------------------
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) =>
    ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
  const exact = (v) => String(v);  // the stored value, shortest round-trip form
  function si(v, unit, digits) {  // 3 significant digits unless told
    if (v == null || !isFinite(v)) return '—';
    const a = Math.abs(v), d = digits || 3;
    const units = [[1e15, 'P'], [1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
    for (const [f, p] of units) {
      if (a >= f) return +(v / f).toPrecision(d) + ' ' + p + (unit || '');
    }
    return +v.toPrecision(d) + (unit ? ' ' + unit : '');
  }
  const bytes = (v, d) => si(v, 'B', d);
  // Axis labels with as many digits as it takes to tell the ticks apart.
  function tickLabels(vs, fmt) {
    for (let d = 3; d < 8; ++d) {
      const l = vs.map((v) => fmt(v, d));
      if (new Set(l).size === l.length) return l;
    }
    return vs.map((v) => fmt(v, 8));
  }
  const pct = (v) => +(v * 100).toPrecision(3) + '%';
  const num = (v) => (typeof v === 'number' && isFinite(v) ? v : null);
  function get(o, path) {
    let cur = o;
    for (const k of path.split('.')) {
      if (cur == null || typeof cur !== 'object') return null;
      cur = cur[k];
    }
    return num(cur);
  }
  function median(xs) {
    const s = xs.filter((x) => x != null).sort((a, b) => a - b);
    if (!s.length) return null;
    const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
  }
  function niceTicks(max, n) {
    if (!(max > 0)) return [0];
    const raw = max / (n || 5);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= raw);
    const out = [];  // 0, step, ... up to the first tick at or above max
    for (let i = 0; out.length === 0 || out[out.length - 1] < max * 0.9999; ++i) {
      out.push(+(i * step).toPrecision(12));
    }
    return out;
  }
  const tipAttr = (lines) => ' data-tip="' + esc(lines.join('\n')) + '"';

  // ---- the arms and workloads ---------------------------------------------
  const arms = [];
  files.forEach((f, fi) => (f.doc.arms || []).forEach((a) =>
    arms.push({ file: fi, arm: a, color: PALETTE[arms.length % PALETTE.length] })));
  const workloadNames = [];
  arms.forEach((a) => (a.arm.workloads || []).forEach((w) => {
    if (!workloadNames.includes(w.name)) workloadNames.push(w.name);
  }));
  const workload = (a, name) => (a.arm.workloads || []).find((w) => w.name === name);

  // ---- horizontal bars, grouped -------------------------------------------
  // rows: {group, label, color, v, lo, hi, bound, tip: [lines]}
  // The label column fits the longest label (about 6.4 px a character at 11.5 px).
  const labelWidth = (labels) => Math.min(440, Math.max(150,
    12 + 6.4 * Math.max(0, ...labels.map((l) => String(l).length))));
  function bars(title, rows, fmtv, axisFmt) {
    rows = rows.filter((r) => r.v != null);
    let h = '<h3>' + esc(title) + '</h3>';
    if (!rows.length) return h + '<p class=empty>not measured in these results</p>';
    const L = labelWidth(rows.map((r) => r.label)), R = 150, bh = 15, gap = 5, gh = 19;
    let max = 0;
    rows.forEach((r) => { max = Math.max(max, r.v, r.hi || 0, r.bound || 0); });
    const ticks = niceTicks(max * 1.02, 5);
    const top = ticks[ticks.length - 1] || 1;
    const x = (v) => L + (W - L - R) * v / top;
    let y = 8, body = '', group = null;
    for (const r of rows) {
      if (r.group !== group) {
        group = r.group;
        y += 4;
        body += `<text x="4" y="${y + 12}" font-weight="600" font-size="12">${esc(group)}</text>`;
        y += gh;
      }
      const t = tipAttr(r.tip);
      body += `<text x="${L - 6}" y="${y + 11}" text-anchor="end" font-size="11.5">` +
        `${esc(r.label)}</text>`;
      body += `<rect class="bar" x="${L}" y="${y}" width="${Math.max(1, x(r.v) - L)}" ` +
        `height="${bh}" fill="${r.color}"${t}/>`;
      if (r.lo != null && r.hi != null) {
        const m = y + bh / 2;
        body += `<path d="M${x(r.lo)} ${m}H${x(r.hi)}M${x(r.lo)} ${m - 4}V${m + 4}` +
          `M${x(r.hi)} ${m - 4}V${m + 4}" stroke="#222" stroke-width="1"/>`;
      }
      if (r.bound != null) {
        body += `<rect class="bound" x="${x(r.bound) - 1.5}" y="${y - 3}" width="3" ` +
          `height="${bh + 6}" fill="#111"${t}/>`;
      }
      const end = Math.max(x(r.v), r.hi != null ? x(r.hi) : 0, r.bound != null ? x(r.bound) : 0);
      body += `<text x="${end + 6}" y="${y + 11}" font-size="11.5">${esc(fmtv(r))}</text>`;
      y += bh + gap;
    }
    let axis = '';
    for (const tv of ticks) {
      axis += `<line x1="${x(tv)}" y1="4" x2="${x(tv)}" y2="${y}" stroke="#e4e6ee"/>` +
        `<text x="${x(tv)}" y="${y + 14}" text-anchor="middle" font-size="10.5" ` +
        `fill="#556">${esc((axisFmt || si)(tv))}</text>`;
    }
    h += `<svg width="${W}" height="${y + 22}" viewBox="0 0 ${W} ${y + 22}" ` +
      `font-family="system-ui,sans-serif">${axis}${body}</svg>`;
    return h;
  }

  function figureRows(key, unit, better) {
    const rows = [];
    for (const wn of workloadNames) {
      for (const a of arms) {
        const w = workload(a, wn);
        if (!w) continue;
        const v = get(w, 'median.' + key), lo = get(w, 'min.' + key), hi = get(w, 'max.' + key);
        const bound = get(w, 'bound.' + key), frac = get(w, 'fraction_of_bound.' + key);
        const n = (w.runs || []).length;
        const lines = [a.arm.name + ' · ' + wn, key + ': ' + (v == null ? '—' : exact(v)) + ' ' +
          unit + ' (median of ' + n + ' run' + (n === 1 ? '' : 's') + ')'];
        if (lo != null && hi != null) lines.push('min ' + exact(lo) + ', max ' + exact(hi));
        if (bound != null) lines.push('bound ' + exact(bound) + ' ' + unit +
          (frac != null ? ' — ' + pct(frac) + ' of bound' : ''));
        if (w.prompt_tokens != null) lines.push(w.prompt_tokens + ' prompt tokens, ' +
          (w.gen_tokens == null ? '?' : w.gen_tokens) + ' generated');
        rows.push({ group: wn, label: a.arm.name, color: a.color, v, lo, hi, bound, frac,
          tip: lines });
      }
    }
    const fmtv = (r) => si(r.v, unit) + (r.frac != null ? ' · ' + pct(r.frac) + ' of bound' : '');
    return { rows, fmtv, better };
  }

  function drawThroughput() {
    const d = figureRows('decode_tps', 'tok/s'), p = figureRows('prompt_tps', 'tok/s');
    const t = figureRows('ttft_s', 's');
    set('chart-decode', bars('Decode tok/s (higher is better)', d.rows, d.fmtv));
    set('chart-prompt', bars('Prompt tok/s (higher is better)', p.rows, p.fmtv));
    set('chart-ttft', bars('Time to first token, s (lower is better)', t.rows, t.fmtv));
  }

  // ---- memory: stacked bars per arm ----------------------------------------
  const MEM = [['core_bytes', 'resident core', '#3f9e5a'], ['arena_bytes', 'expert arena', '#3a5ba0'],
    ['kv_bytes', 'KV cache', '#a04a8c'], ['headroom_bytes', 'headroom', '#b8bcc8']];
  const HOST_COLOR = '#e07b39', PEAK_COLOR = '#2b7a78';
  // The runs' peak device memory (peak_device_bytes): the most, and one line per workload.
  function devicePeaks(arm) {
    let max = null, n = 0;
    const lines = [];
    (arm.workloads || []).forEach((w) => {
      const ps = (w.runs || []).map((r) => num(r.peak_device_bytes));
      if (ps.every((v) => v == null)) return;
      ps.forEach((v) => { if (v != null) { max = max == null ? v : Math.max(max, v); ++n; } });
      lines.push(w.name + ': ' + ps.map((v, i) => 'run ' + (i + 1) + ' ' +
        (v == null ? '—' : exact(v) + ' B')).join(', '));
    });
    return max == null ? null : { max, n, lines };
  }
  // A thin bar under an arm's stack (host RAM tier, peak device memory) with its value.
  function subBar(x, L, y, h, label, v, color, tip) {
    return `<text x="${L - 6}" y="${y + 11}" text-anchor="end" font-size="11" fill="#556">` +
      `${esc(label)}</text><rect class="bar" x="${L}" y="${y}" width="${Math.max(0.5, x(v) - L)}" ` +
      `height="${h}" fill="${color}"${tipAttr(tip)}/><text x="${Math.max(x(v), L) + 6}" ` +
      `y="${y + 11}" font-size="11" fill="#556">${esc(bytes(v))}</text>`;
  }
  function memoryArm(a, x, L, y, bh, gap) {
    const m = a.arm.memory || {};
    let at = 0, body = '';
    body += `<text x="${L - 6}" y="${y + 13}" text-anchor="end" font-size="11.5">` +
      `${esc(a.arm.name)}</text>`;
    for (const [k, label, color] of MEM) {
      const v = num(m[k]);
      if (v == null) continue;
      body += `<rect class="bar" x="${x(at)}" y="${y}" width="${Math.max(0.5, x(at + v) - x(at))}" ` +
        `height="${bh}" fill="${color}"${tipAttr([a.arm.name, label + ': ' + exact(v) + ' B (' +
        bytes(v) + ')'])}/>`;
      at += v;
    }
    const b = num(m.budget_bytes);
    if (b != null) {
      body += `<rect class="bound" x="${x(b) - 1.5}" y="${y - 4}" width="3" height="${bh + 8}" ` +
        `fill="#111"${tipAttr([a.arm.name, 'budget: ' + exact(b) + ' B (' + bytes(b) + ')'])}/>`;
    }
    if (at > 0) {
      body += `<text x="${Math.max(x(at), b != null ? x(b) : 0) + 6}" y="${y + 13}" ` +
        `font-size="11.5">${esc(bytes(at))}</text>`;
    }
    y += bh + gap;
    const host = num(m.host_tier_bytes), peak = devicePeaks(a.arm);
    if (host != null) {
      body += subBar(x, L, y, bh - 4, 'host RAM tier', host, HOST_COLOR,
        [a.arm.name, 'host tier: ' + exact(host) + ' B (' + bytes(host) + ')']);
      y += bh - 4 + gap;
    }
    if (peak) {
      body += subBar(x, L, y, bh - 4, 'peak device memory', peak.max, PEAK_COLOR, [a.arm.name,
        'peak device memory: ' + exact(peak.max) + ' B (' + bytes(peak.max) + '), the most of ' +
        peak.n + ' run' + (peak.n === 1 ? '' : 's')].concat(peak.lines));
      y += bh - 4 + gap;
    }
    return { body, y };
  }
  function drawMemory() {
    const rows = arms.filter((a) => (a.arm.memory && Object.keys(a.arm.memory).length) ||
      devicePeaks(a.arm));
    if (!rows.length) return set('chart-memory', '<p class=empty>not measured in these results</p>');
    const L = labelWidth(rows.map((a) => a.arm.name)), R = 120, bh = 18, gap = 8;
    let max = 0;
    rows.forEach((a) => {
      const m = a.arm.memory || {}, p = devicePeaks(a.arm);
      max = Math.max(max, MEM.reduce((s, k) => s + (num(m[k[0]]) || 0), 0), num(m.budget_bytes) || 0,
        num(m.host_tier_bytes) || 0, p ? p.max : 0);
    });
    const ticks = niceTicks(max * 1.02, 5), top = ticks[ticks.length - 1] || 1;
    const x = (v) => L + (W - L - R) * v / top;
    let y = 8, body = '';
    for (const a of rows) {
      const r = memoryArm(a, x, L, y, bh, gap);
      body += r.body;
      y = r.y;
    }
    let axis = '';
    for (const tv of ticks) {
      axis += `<line x1="${x(tv)}" y1="4" x2="${x(tv)}" y2="${y}" stroke="#e4e6ee"/>` +
        `<text x="${x(tv)}" y="${y + 14}" text-anchor="middle" font-size="10.5" fill="#556">` +
        `${esc(bytes(tv))}</text>`;
    }
    const legend = '<div class=legend>' + MEM.map((k) => `<span><i style="background:${k[2]}">` +
      `</i>${k[1]}</span>`).join('') + `<span><i style="background:${HOST_COLOR}"></i>host RAM ` +
      `tier</span><span><i style="background:${PEAK_COLOR}"></i>peak device memory (the most of ` +
      'the runs)</span><span><i style="background:#111"></i>budget</span></div>';
    set('chart-memory', '<h3>Memory per arm</h3>' + legend + `<svg width="${W}" height="${y + 22}" ` +
      `viewBox="0 0 ${W} ${y + 22}" font-family="system-ui,sans-serif">${axis}${body}</svg>`);
  }

  // ---- storage traffic: cold run and warm median per workload and arm -------
  function drawStorage() {
    const rows = [];
    for (const wn of workloadNames) {
      for (const a of arms) {
        const w = workload(a, wn);
        if (!w || !w.runs) continue;
        const cold = w.runs.filter((r) => r.cold === true), warm = w.runs.filter((r) => r.cold !== true);
        for (const [key, what] of [['expert_read_bytes', 'expert reads'],
          ['physical_read_bytes', 'physical reads']]) {
          const kinds = [['cold', cold.length ? get(cold[0], key) : null, 1],
            ['warm median', median(warm.map((r) => get(r, key))), warm.length]];
          for (const [kind, v, n] of kinds) {
            if (v == null) continue;
            rows.push({ group: wn, label: a.arm.name + ' · ' + what + ' · ' + kind, color: a.color,
              v, tip: [a.arm.name + ' · ' + wn, what + ' (' + kind + (kind === 'cold' ? '' : ' of ' +
                n + ' run' + (n === 1 ? '' : 's')) + '): ' + exact(v) + ' B (' + bytes(v) + ')'] });
          }
        }
      }
    }
    set('chart-storage', bars('Bytes read per request (lower is better)', rows, (r) => bytes(r.v),
      bytes));
  }

  // ---- line charts with a crosshair ----------------------------------------
  // spec: {title, h, xs: [x0, x1], ys: [y0, y1], xfmt, yfmt, series: [{name, color, dash,
  // pts: [[x, y] | null]}], bands: [{x0, x1, label}]}; returns {svg, px(x), inv(px)}.
  const LL = 78, LR = 24;
  function lineChart(spec) {
    const h = spec.h || 170, top = 10, bot = h - 24;
    const [x0, x1] = spec.xs, ticks = niceTicks(spec.ys[1] - (spec.ys[0] || 0), 4);
    const y0 = spec.ys[0] || 0, y1 = y0 + (ticks[ticks.length - 1] || 1);
    const px = (v) => LL + (W - LL - LR) * (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5);
    const py = (v) => bot - (bot - top) * (v - y0) / (y1 - y0);
    let s = '';
    (spec.bands || []).forEach((b, i) => {
      const bw = Math.max(0, px(b.x1) - px(b.x0));
      s += `<rect x="${px(b.x0)}" y="${top}" width="${bw}" height="${bot - top}" ` +
        `fill="${i % 2 ? '#f4f5f9' : '#eceef5'}"/>`;
      const label = fitLabel(b.label, bw - 5);  // within its band (the buttons give full names)
      if (label) {
        s += `<text x="${px(b.x0) + 3}" y="${top + 10}" font-size="9.5" fill="#667">` +
          `${esc(label)}</text>`;
      }
    });
    const yl = tickLabels(ticks.map((t) => y0 + t), spec.yfmt);
    (spec.noGrid ? [] : ticks).forEach((t, i) => {
      s += `<line x1="${LL}" y1="${py(y0 + t)}" x2="${W - LR}" y2="${py(y0 + t)}" stroke="#e4e6ee"/>` +
        `<text x="${LL - 5}" y="${py(y0 + t) + 3.5}" text-anchor="end" font-size="10" fill="#556">` +
        `${esc(yl[i])}</text>`;
    });
    for (const t of niceTicks(x1 - x0, 6).map((v) => v + x0)) {
      if (t > x1) continue;
      s += `<text x="${px(t)}" y="${bot + 14}" text-anchor="middle" font-size="10" fill="#556">` +
        `${esc(spec.xfmt(t))}</text>`;
    }
    for (const ser of spec.series) {
      let d = '', pen = false;
      for (const p of ser.pts) {
        if (!p) { pen = false; continue; }
        d += (pen ? 'L' : 'M') + px(p[0]).toFixed(1) + ' ' + py(p[1]).toFixed(1);
        pen = true;
      }
      s += `<path d="${d}" fill="none" stroke="${ser.color}" stroke-width="1.8"` +
        `${ser.dash ? ' stroke-dasharray="5 3"' : ''}/>`;
      ser.pts.forEach((p, i) => {  // isolated points (between gaps) stay visible
        const alone = p && !ser.pts[i - 1] && !ser.pts[i + 1];
        if (alone || ser.dots) s += `<circle cx="${px(p[0])}" cy="${py(p[1])}" r="2.5" fill="${ser.color}"/>`;
      });
    }
    s += `<line x1="${LL}" y1="${bot}" x2="${W - LR}" y2="${bot}" stroke="#99a"/>`;
    const svg = `<h3>${esc(spec.title)}</h3><svg class="lc" width="${W}" height="${h}" ` +
      `viewBox="0 0 ${W} ${h}" font-family="system-ui,sans-serif">${s}<g class="xh"></g></svg>`;
    return { svg, px, py, inv: (p) => x0 + (p - LL) / (W - LL - LR) * (x1 - x0), top, bot };
  }
  // text cut to fit `width` px at 9.5 px (about 5.4 px a character); '' when too narrow
  function fitLabel(text, width) {
    const n = Math.floor(width / 5.4);
    if (n >= text.length) return text;
    return n >= 4 ? text.slice(0, n - 1) + '…' : '';
  }
  function mouseX(e, svg) {
    const r = svg.getBoundingClientRect();
    return (e.clientX - r.left) * (W / (r.width || W));
  }
  function legend(series) {
    return '<div class=legend>' + series.map((s) => `<span><i style="background:${s.color}"></i>` +
      `${esc(s.name)}</span>`).join('') + '</div>';
  }

  // ---- hit rate versus budget -------------------------------------------------
  function drawSimulate() {
    const el = document.getElementById('chart-simulate');
    const curves = [];
    const multi = files.filter((f) => (f.doc.simulate || []).length).length > 1;
    files.forEach((f) => (f.doc.simulate || []).forEach((c) => {
      const min = /^min/.test(c.policy);
      curves.push({ name: (multi ? f.path + ': ' : '') + c.policy + (min ? ' (optimal)' : ''), c,
        color: min ? '#111' : PALETTE[curves.length % PALETTE.length], dash: min });
    }));
    if (!curves.length) return set('chart-simulate', '<p class=empty>no simulate curves in these ' +
      'results (moetier simulate -o PREFIX writes PREFIX.json; pass it to moetier report)</p>');
    let xmax = 0;
    curves.forEach((s) => s.c.budget_experts.forEach((x) => { xmax = Math.max(xmax, x); }));
    curves.forEach((s) => { s.pts = s.c.budget_experts.map((x, i) => [x, s.c.hit_rate[i]]); s.dots = true; });
    const ch = lineChart({ title: 'Hit rate versus hot-set budget (experts)', h: 260, xs: [0, xmax],
      ys: [0, 1], xfmt: (v) => si(v), yfmt: pct, series: curves });
    el.innerHTML = legend(curves) + ch.svg;
    const svg = el.querySelector('svg.lc'), xh = el.querySelector('g.xh');
    svg.addEventListener('mousemove', (e) => {
      const xv = ch.inv(mouseX(e, svg));
      let best = null;
      curves.forEach((s) => s.c.budget_experts.forEach((x) => {
        if (best == null || Math.abs(x - xv) < Math.abs(best - xv)) best = x;
      }));
      const lines = ['budget ' + exact(best) + ' experts'];
      let marks = `<line x1="${ch.px(best)}" y1="${ch.top}" x2="${ch.px(best)}" y2="${ch.bot}" ` +
        'stroke="#333" stroke-dasharray="3 3"/>';
      curves.forEach((s) => {
        const i = s.c.budget_experts.indexOf(best);
        if (i < 0) return;
        const b = s.c.budget_bytes ? s.c.budget_bytes[i] : null;
        lines.push(s.name + ': hit ' + exact(s.c.hit_rate[i]) + (s.c.all_k_share ? ', all-k ' +
          exact(s.c.all_k_share[i]) : '') + (b != null ? ', ' + exact(b) + ' B (' + bytes(b) + ')' : ''));
        marks += `<circle cx="${ch.px(best)}" cy="${ch.py(s.c.hit_rate[i])}" r="4" fill="none" ` +
          `stroke="${s.color}" stroke-width="2"/>`;
      });
      xh.innerHTML = marks;
      showTip(e, lines.join('\n'));
    });
    svg.addEventListener('mouseleave', () => { xh.innerHTML = ''; hideTip(); });
  }

  // ---- the device monitor -----------------------------------------------------
  const METRICS = [['gpu_temp_c', 'GPU temperature', (v, d) => si(v, '°C', d)],
    ['gpu_power_w', 'GPU power', (v, d) => si(v, 'W', d)],
    ['gpu_sm_clock_mhz', 'GPU SM clock', (v, d) => si(v * 1e6, 'Hz', d)],
    ['gpu_mem_used_bytes', 'GPU memory used', bytes], ['gpu_mem_free_bytes', 'GPU memory free', bytes],
    ['host_mem_available_bytes', 'Host MemAvailable', bytes], ['rss_bytes', 'Process RSS', bytes],
    ['read_bytes', 'Process read bytes (cumulative)', bytes]];
  const THERMAL = /thermal/;

  function monitorGroup(f, fi) {
    const samples = (f.doc.monitor || []).slice().sort((a, b) => a.t_s - b.t_s);
    const phases = [];
    samples.forEach((s) => { if (!phases.includes(s.phase)) phases.push(s.phase); });
    const dts = samples.slice(1).map((s, i) => s.t_s - samples[i].t_s);
    const period = median(dts) || 0;
    const id = 'mon' + fi;
    let h = `<h3>${esc(f.path)}: ${samples.length} samples, every ${si(period, 's')}</h3>` +
      '<div class=phases>' + ['all'].concat(phases).map((p) =>
        `<button data-group="${id}" data-phase="${esc(p)}">${esc(p)}</button>`).join('') +
      `</div><div id="${id}"></div>`;
    return { h, id, samples, phases, period, path: f.path };
  }

  function drawPhase(g, phase) {
    const el = document.getElementById(g.id);
    const ss = phase === 'all' ? g.samples : g.samples.filter((s) => s.phase === phase);
    if (!ss.length) { el.innerHTML = '<p class=empty>no sample in this phase</p>'; return; }
    let t0 = ss[0].t_s, t1 = ss[ss.length - 1].t_s;
    if (t1 <= t0) t1 = t0 + (g.period || 1);
    const bands = [];
    if (phase === 'all') {
      ss.forEach((s, i) => {
        const end = i + 1 < ss.length ? ss[i + 1].t_s : s.t_s;
        const last = bands[bands.length - 1];
        if (last && last.label === s.phase) last.x1 = end;
        else bands.push({ x0: s.t_s, x1: end, label: s.phase });
      });
    }
    const brk = (i) => i > 0 && g.period > 0 && ss[i].t_s - ss[i - 1].t_s > 1.5 * g.period;
    const charts = [];
    for (const [key, title, fmt] of METRICS) {
      const vals = ss.map((s) => num(s[key]));
      if (vals.every((v) => v == null)) continue;
      const pts = [];
      ss.forEach((s, i) => { if (brk(i)) pts.push(null); pts.push(vals[i] == null ? null : [s.t_s, vals[i]]); });
      const known = vals.filter((v) => v != null);
      const lo = Math.min.apply(null, known), hi = Math.max.apply(null, known);
      const y0 = /temp|clock|power/.test(key) ? 0 : Math.max(0, lo - (hi - lo) * 0.1);
      charts.push({ key, title, fmt, ch: lineChart({ title, h: 140, xs: [t0, t1], ys: [y0, hi > y0 ? hi : y0 + 1],
        xfmt: (v) => si(v, 's'), yfmt: fmt, series: [{ name: title, color: '#3a5ba0', pts }], bands }) });
    }
    el.innerHTML = throttleSummary(ss) + throttleStrip(ss, t0, t1, g.period, bands) +
      charts.map((c) => c.ch.svg).join('') + (charts.length ? '' : '<p class=empty>no readings</p>');
    const svgs = el.querySelectorAll('svg.lc'), xhs = el.querySelectorAll('g.xh');
    const move = (e, svg) => {
      if (!charts.length) return;
      const tv = charts[0].ch.inv(mouseX(e, svg));
      let best = ss[0];
      ss.forEach((s) => { if (Math.abs(s.t_s - tv) < Math.abs(best.t_s - tv)) best = s; });
      const lines = ['t = ' + exact(best.t_s) + ' s · phase ' + best.phase];
      charts.forEach((c, i) => {
        const v = num(best[c.key]), X = c.ch.px(best.t_s);
        lines.push(c.title + ': ' + (v == null ? 'gap (not sampled)' : exact(v) + ' (' + c.fmt(v) + ')'));
        if (xhs[i]) xhs[i].innerHTML = `<line x1="${X}" y1="${c.ch.top}" x2="${X}" y2="${c.ch.bot}" ` +
          'stroke="#333" stroke-dasharray="3 3"/>' + (v == null ? '' : `<circle cx="${X}" ` +
          `cy="${c.ch.py(v)}" r="3.5" fill="#e07b39"/>`);
      });
      if (best.throttle) lines.push('throttle: ' + (best.throttle.join(', ') || 'none'));
      showTip(e, lines.join('\n'));
    };
    for (let i = 0; i < svgs.length; ++i) {
      svgs[i].addEventListener('mousemove', (e) => move(e, svgs[i]));
      svgs[i].addEventListener('mouseleave', () => {
        for (let j = 0; j < xhs.length; ++j) xhs[j].innerHTML = '';
        hideTip();
      });
    }
  }

  function throttleSummary(ss) {
    const known = ss.filter((s) => Array.isArray(s.throttle));
    if (!known.length) return '<p class=note>Throttle reasons: not measured (no GPU source).</p>';
    const th = known.filter((s) => s.throttle.some((r) => THERMAL.test(r))).length;
    const pc = known.filter((s) => s.throttle.includes('sw_power_cap')).length;
    return '<p class=note>' + (th ? `Thermal throttling in ${th} of ${known.length} samples. ` :
      `No thermal throttling in ${known.length} sampled readings. `) + (pc ? `Software power cap ` +
      `(sw_power_cap, a power limit, not thermal) in ${pc}.` : 'No software power cap.') + '</p>';
  }

  function throttleStrip(ss, t0, t1, period, bands) {
    if (!ss.some((s) => Array.isArray(s.throttle) && s.throttle.length)) return '';
    const ch = lineChart({ title: 'Throttle reasons', h: 64, xs: [t0, t1], ys: [0, 1],
      xfmt: (v) => si(v, 's'), yfmt: () => '', series: [], bands, noGrid: true });
    let marks = '';
    ss.forEach((s, i) => {
      if (!Array.isArray(s.throttle) || !s.throttle.length) return;
      const color = s.throttle.some((r) => THERMAL.test(r)) ? '#d04b4b' :
        s.throttle.includes('sw_power_cap') ? '#e07b39' : '#99a';
      const w = Math.max(2, ch.px(s.t_s + (period || 1)) - ch.px(s.t_s));
      marks += `<rect x="${ch.px(s.t_s)}" y="${ch.top + 12}" width="${w}" height="${ch.bot - ch.top - 14}" ` +
        `fill="${color}"${tipAttr(['t = ' + exact(s.t_s) + ' s · ' + s.phase, s.throttle.join(', ')])}/>`;
    });
    return ch.svg.replace('<g class="xh"></g>', marks) + '<div class=legend><span><i style="' +
      'background:#d04b4b"></i>thermal</span><span><i style="background:#e07b39"></i>sw_power_cap' +
      '</span><span><i style="background:#99a"></i>other (idle, clocks setting, ...)</span></div>';
  }

  function drawMonitor() {
    const groups = files.map(monitorGroup).filter((g) => g.samples.length);
    if (!groups.length) return set('monitor-charts', '<p class=empty>no monitor samples</p>');
    set('monitor-charts', groups.map((g) => g.h).join(''));
    const byId = {};
    groups.forEach((g) => { byId[g.id] = g; });
    const buttons = document.querySelectorAll('#monitor-charts button[data-phase]');
    const choose = (g, phase) => {
      for (let i = 0; i < buttons.length; ++i) {
        const b = buttons[i];
        if (b.getAttribute('data-group') === g.id) {
          b.className = b.getAttribute('data-phase') === phase ? 'on' : '';
        }
      }
      drawPhase(g, phase);
    };
    for (let i = 0; i < buttons.length; ++i) {
      const b = buttons[i];
      b.addEventListener('click', () => choose(byId[b.getAttribute('data-group')],
        b.getAttribute('data-phase')));
    }
    groups.forEach((g) => choose(g, 'all'));
  }

  // ---- tooltip ------------------------------------------------------------------
  function showTip(e, text) {
    tip.textContent = text;
    tip.hidden = false;
    const vw = window.innerWidth || 1200;
    tip.style.left = Math.min(e.clientX + 14, vw - 380) + 'px';
    tip.style.top = (e.clientY + 14) + 'px';
  }
  function hideTip() { tip.hidden = true; }
  document.addEventListener('mouseover', (e) => {
    const t = e.target && e.target.closest ? e.target.closest('[data-tip]') : null;
    if (t) showTip(e, t.getAttribute('data-tip'));
  });
  document.addEventListener('mousemove', (e) => {
    const t = e.target && e.target.closest ? e.target.closest('[data-tip]') : null;
    if (t) showTip(e, t.getAttribute('data-tip'));
  });
  document.addEventListener('mouseout', (e) => {
    const t = e.target && e.target.closest ? e.target.closest('[data-tip]') : null;
    if (t) hideTip();
  });

  function set(id, html) { document.getElementById(id).innerHTML = html; }

  drawThroughput();
  drawMemory();
  drawStorage();
  drawSimulate();
  drawMonitor();
  document.body.setAttribute('data-charts-ready', '1');
})();
