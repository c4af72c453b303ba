// Kiln's built-in UI (ADR 0016): one page, plain JavaScript, reading Kiln's own query API
// (querier.v1 over Connect JSON) with the caller's credentials. The view lives in the URL with
// Pyroscope's parameters: ?query=<profile type>{<selector>}&from=now-1h&until=now.
'use strict';

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = 'kiln-token';
const MAX_NODES = 2048;
const ROW = 18;

const state = { type: '', service: '', selector: '', tenants: '', from: 'now-1h', until: 'now', sort: 'self', diff: null };
let flame = null; // decoded flame graph
let zoom = null; // the node zoomed into
let functions = []; // the top table's rows

class UiError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

// ---- time and selectors ----

const UNITS = { s: 1e3, m: 6e4, h: 36e5, d: 864e5, w: 6048e5 };

function parseTime(v, now) {
  if (!v || v === 'now') return now;
  const rel = /^now-(\d+)([smhdw])$/.exec(v);
  if (rel) return now - Number(rel[1]) * UNITS[rel[2]];
  const n = Number(v);
  if (Number.isFinite(n) && n > 0) return n < 1e11 ? n * 1000 : n;
  return now;
}

function range() {
  const now = Date.now();
  const start = parseTime(state.from, now);
  const end = parseTime(state.until, now);
  return [Math.min(start, end - 1000), end];
}

function inner(sel) {
  const s = (sel || '').trim();
  return s.startsWith('{') && s.endsWith('}') ? s.slice(1, -1).trim() : s;
}

// The matchers of a selector's inside, split on commas outside quotes.
function matchers(sel) {
  return inner(sel)
    .split(/,(?=(?:[^"]*"[^"]*")*[^"]*$)/)
    .map((m) => m.trim())
    .filter(Boolean);
}

function fullSelector() {
  const parts = [];
  if (state.service) parts.push(`service_name="${state.service.replace(/["\\]/g, '\\$&')}"`);
  parts.push(...matchers(state.selector).filter((m) => !/^service_name\s*=/.test(m)));
  return `{${parts.join(', ')}}`;
}

function readUrl() {
  const p = new URLSearchParams(location.search);
  const q = p.get('query');
  if (q) {
    const i = q.indexOf('{');
    state.type = i >= 0 ? q.slice(0, i) : q;
    const sel = i >= 0 ? q.slice(i) : '';
    const svc = /service_name\s*=\s*"((?:[^"\\]|\\.)*)"/.exec(sel);
    state.service = svc ? svc[1] : '';
    const rest = matchers(sel).filter((m) => !/^service_name\s*=/.test(m));
    state.selector = rest.length ? `{${rest.join(', ')}}` : '';
  }
  state.from = p.get('from') || 'now-1h';
  state.until = p.get('until') || 'now';
  state.tenants = tenantList(p.get('tenants') || '');
  if (p.get('leftQuery') || p.get('rightQuery') || location.pathname.endsWith('-diff')) {
    const side = (q, from, until) => {
      const i = (q || '').indexOf('{');
      if (!state.type && q) state.type = i >= 0 ? q.slice(0, i) : q;
      return { selector: i >= 0 ? q.slice(i) : '{}', from: from || state.from, until: until || state.until };
    };
    state.diff = {
      left: side(p.get('leftQuery'), p.get('leftFrom'), p.get('leftUntil')),
      right: side(p.get('rightQuery'), p.get('rightFrom'), p.get('rightUntil')),
    };
  }
}

// Tenants typed as `a, b` or `a|b`: what X-Scope-OrgID carries (`a|b`), or '' for the caller's own.
function tenantList(text) {
  return text.split(/[|,\s]+/).filter(Boolean).join('|');
}

function writeUrl() {
  const p = new URLSearchParams();
  p.set('query', state.type + fullSelector());
  p.set('from', state.from);
  p.set('until', state.until);
  if (state.tenants) p.set('tenants', state.tenants);
  if (state.diff) {
    for (const [k, side] of [['left', state.diff.left], ['right', state.diff.right]]) {
      p.set(k + 'Query', state.type + side.selector);
      p.set(k + 'From', side.from);
      p.set(k + 'Until', side.until);
    }
  }
  history.replaceState(null, '', location.pathname + '?' + p.toString());
}

// ---- the API ----

async function call(method, body) {
  const headers = { 'Content-Type': 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  // Several tenants are read as one: each series carries __tenant__.
  if (state.tenants) headers['X-Scope-OrgID'] = state.tenants;
  let resp;
  try {
    resp = await fetch('/querier.v1.QuerierService/' + method, {
      method: 'POST',
      headers,
      body: JSON.stringify(body),
    });
  } catch (e) {
    throw new UiError('unreachable', `Kiln did not answer (${e.message}): is it running?`);
  }
  const text = await resp.text();
  let json = {};
  try {
    json = text ? JSON.parse(text) : {};
  } catch (e) {
    json = { message: text };
  }
  if (!resp.ok) {
    const kinds = { 401: 'auth', 403: 'forbidden', 413: 'limit', 429: 'limit', 400: 'invalid', 422: 'invalid' };
    const kind = kinds[resp.status] || (resp.status >= 502 && resp.status <= 504 ? 'unreachable' : 'api');
    throw new UiError(kind, json.message || `${resp.status} ${resp.statusText}`);
  }
  return json;
}

// The shown profile as pprof: `SelectMergeProfile` in binary protobuf (its answer is the pprof
// itself), the request's four fields encoded here.
function protoRequest(type, selector, start, end) {
  const bytes = [];
  const varint = (n) => {
    let v = BigInt(n);
    do {
      let b = Number(v & 0x7fn);
      v >>= 7n;
      if (v > 0n) b |= 0x80;
      bytes.push(b);
    } while (v > 0n);
  };
  const text = (field, s) => {
    const utf8 = new TextEncoder().encode(s);
    bytes.push((field << 3) | 2);
    varint(utf8.length);
    bytes.push(...utf8);
  };
  text(1, type);
  text(2, selector);
  bytes.push((3 << 3) | 0);
  varint(start);
  bytes.push((4 << 3) | 0);
  varint(end);
  return new Uint8Array(bytes);
}

async function downloadPprof() {
  const [start, end] = range();
  const headers = { 'Content-Type': 'application/proto' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  // Several tenants are read as one: each series carries __tenant__.
  if (state.tenants) headers['X-Scope-OrgID'] = state.tenants;
  try {
    const resp = await fetch('/querier.v1.QuerierService/SelectMergeProfile', {
      method: 'POST',
      headers,
      body: protoRequest(state.type, fullSelector(), start, end),
    });
    if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
    const blob = new Blob([await resp.arrayBuffer()], { type: 'application/octet-stream' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = `${(state.service || 'profile').replace(/[^\w.-]/g, '_')}-${state.type.split(':')[0]}-${Math.floor(start / 1000)}.pb`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  } catch (e) {
    setStatus('The pprof download failed: ' + escapeXml(e.message), true);
  }
}

// ---- formatting ----

function unit() {
  return (state.type.split(':')[2] || '').toLowerCase();
}

function fmt(v) {
  const u = unit();
  if (u === 'nanoseconds') return (v / 1e9).toFixed(v >= 1e10 ? 0 : 2) + ' s';
  if (u === 'bytes') {
    const k = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (v >= 1024 && i < k.length - 1) {
      v /= 1024;
      i++;
    }
    return v.toFixed(i ? 1 : 0) + ' ' + k[i];
  }
  return Math.round(v).toLocaleString('en');
}

function pct(v, total) {
  return total > 0 ? ((100 * v) / total).toFixed(2) + '%' : '0%';
}

function escapeXml(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
}

function hue(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return h % 360;
}

function setStatus(html, error) {
  const s = $('status');
  s.innerHTML = html;
  s.classList.toggle('error', !!error);
}

// ---- the flame graph ----

// Pyroscope's levels (x delta, total, self, name index per node) into nodes with absolute
// offsets and parents.
function decodeFlame(fg) {
  const names = fg.names || [];
  const levels = fg.levels || [];
  const nodes = [];
  let previous = [];
  for (let d = 0; d < levels.length; d++) {
    const v = (levels[d].values || []).map(Number);
    const here = [];
    let x = 0;
    let p = 0;
    for (let i = 0; i + 3 < v.length; i += 4) {
      x += v[i];
      const node = { d, x, total: v[i + 1], self: v[i + 2], name: names[v[i + 3]] ?? '?', parent: -1 };
      while (p < previous.length && nodes[previous[p]].x + nodes[previous[p]].total <= x) p++;
      if (p < previous.length && nodes[previous[p]].x <= x) node.parent = previous[p];
      here.push(nodes.length);
      nodes.push(node);
      x += v[i + 1];
    }
    previous = here;
  }
  return { nodes, total: Number(fg.total || 0) };
}

// Each node's parent: the node one level up whose span holds it (levels are in x order).
function linkParents(nodes) {
  let previous = [];
  let here = [];
  let level = 0;
  let p = 0;
  nodes.forEach((node, i) => {
    if (node.d !== level) {
      previous = node.d === level + 1 ? here : [];
      here = [];
      level = node.d;
      p = 0;
    }
    while (p < previous.length && nodes[previous[p]].x + nodes[previous[p]].total <= node.x) p++;
    if (p < previous.length && nodes[previous[p]].x <= node.x) node.parent = previous[p];
    here.push(i);
  });
}

// A Diff's levels (left x delta, total, self; right x delta, total, self; name index per node):
// nodes spanning both sides' values, each side's own too.
function decodeDiff(fg) {
  const names = fg.names || [];
  const nodes = [];
  for (let d = 0; d < (fg.levels || []).length; d++) {
    const v = (fg.levels[d].values || []).map(Number);
    let l = 0;
    let r = 0;
    for (let i = 0; i + 6 < v.length; i += 7) {
      l += v[i];
      r += v[i + 3];
      nodes.push({
        d,
        x: l + r,
        total: v[i + 1] + v[i + 4],
        self: v[i + 2] + v[i + 5],
        left: v[i + 1],
        right: v[i + 4],
        name: names[v[i + 6]] ?? '?',
        parent: -1,
      });
      l += v[i + 1];
      r += v[i + 4];
    }
  }
  linkParents(nodes);
  const leftTicks = Number(fg.leftTicks || 0);
  const rightTicks = Number(fg.rightTicks || 0);
  return { nodes, total: leftTicks + rightTicks, leftTicks, rightTicks, diff: true };
}

// Red where the comparison holds a larger share than the baseline, green where smaller.
function diffColor(n) {
  const l = flame.leftTicks > 0 ? n.left / flame.leftTicks : 0;
  const r = flame.rightTicks > 0 ? n.right / flame.rightTicks : 0;
  const change = r - l;
  if (Math.abs(change) < 0.001) return 'hsl(0,0%,78%)';
  const k = Math.min(Math.abs(change) * 4, 1);
  return change > 0 ? `hsl(0,70%,${(88 - 28 * k).toFixed(0)}%)` : `hsl(120,55%,${(88 - 33 * k).toFixed(0)}%)`;
}

function matches(name, q) {
  return q && name.toLowerCase().includes(q);
}

// The share of the matching frames: each matching node counted unless an ancestor matched.
function searchShare(q) {
  const sum = { total: 0, left: 0, right: 0 };
  if (!flame || !q) return sum;
  for (const n of flame.nodes) {
    if (!matches(n.name, q)) continue;
    let p = n.parent;
    let covered = false;
    while (p >= 0) {
      if (matches(flame.nodes[p].name, q)) {
        covered = true;
        break;
      }
      p = flame.nodes[p].parent;
    }
    if (!covered) {
      sum.total += n.total;
      sum.left += n.left || 0;
      sum.right += n.right || 0;
    }
  }
  return sum;
}

function drawFlame() {
  const svg = $('flame');
  if (!flame || flame.total === 0) {
    svg.innerHTML = '';
    svg.setAttribute('height', 0);
    return;
  }
  const W = Math.max(svg.clientWidth || 0, 600);
  const z = zoom || { x: 0, total: flame.total, d: 0 };
  const scale = W / Math.max(z.total, 1);
  const q = $('search').value.trim().toLowerCase();
  const out = [];
  let depth = 0;
  flame.nodes.forEach((n, i) => {
    let x0;
    let w;
    if (n.d < z.d) {
      // Ancestors of the zoomed node span the width.
      if (!(n.x <= z.x && n.x + n.total >= z.x + z.total)) return;
      x0 = 0;
      w = W;
    } else {
      if (n.x + n.total <= z.x || n.x >= z.x + z.total) return;
      x0 = (n.x - z.x) * scale;
      w = n.total * scale;
    }
    if (w < 0.5) return;
    depth = Math.max(depth, n.d + 1);
    const cls = q ? (matches(n.name, q) ? 'match' : 'dim') : '';
    const label = w > 30 ? escapeXml(n.name.slice(0, Math.floor(w / 7))) : '';
    out.push(
      `<g class="${cls}" data-i="${i}"><rect x="${x0.toFixed(2)}" y="${n.d * ROW}" width="${w.toFixed(2)}" ` +
        `height="${ROW - 1}" fill="${flame.diff ? diffColor(n) : `hsl(${hue(n.name)},60%,72%)`}" ` +
        `data-name="${escapeXml(n.name)}" data-total="${n.total}"` +
        (flame.diff ? ` data-left="${n.left}" data-right="${n.right}"` : '') +
        '></rect>' +
        (label ? `<text x="${(x0 + 3).toFixed(2)}" y="${n.d * ROW + 13}">${label}</text>` : '') +
        '</g>',
    );
  });
  svg.setAttribute('viewBox', `0 0 ${W} ${depth * ROW}`);
  svg.setAttribute('height', depth * ROW);
  svg.innerHTML = out.join('');
  $('reset-zoom').hidden = !zoom;
  const share = searchShare(q);
  $('search-share').textContent = !q
    ? ''
    : flame.diff
      ? `baseline ${fmt(share.left)} (${pct(share.left, flame.leftTicks)}), ` +
        `comparison ${fmt(share.right)} (${pct(share.right, flame.rightTicks)}) match`
      : `${fmt(share.total)} of ${fmt(flame.total)} (${pct(share.total, flame.total)}) match`;
}

function nodeOf(event) {
  const g = event.target.closest && event.target.closest('g[data-i]');
  return g ? flame.nodes[Number(g.dataset.i)] : null;
}

function tooltip(event) {
  const t = $('tooltip');
  const n = flame && nodeOf(event);
  if (!n) {
    t.hidden = true;
    return;
  }
  t.innerHTML = flame.diff
    ? `<b>${escapeXml(n.name)}</b><br>baseline ${fmt(n.left)} (${pct(n.left, flame.leftTicks)})` +
      `<br>comparison ${fmt(n.right)} (${pct(n.right, flame.rightTicks)})`
    : `<b>${escapeXml(n.name)}</b><br>total ${fmt(n.total)} (${pct(n.total, flame.total)})` +
      `<br>self ${fmt(n.self)} (${pct(n.self, flame.total)})`;
  t.style.left = event.clientX + 12 + 'px';
  t.style.top = event.clientY + 12 + 'px';
  t.hidden = false;
}

// ---- the top table ----

function drawTable() {
  const rows = functions.slice().sort((a, b) =>
    state.sort === 'name' ? a.name.localeCompare(b.name) : b[state.sort] - a[state.sort],
  );
  const total = flame ? flame.total : 0;
  $('top').querySelector('tbody').innerHTML = rows
    .map(
      (f) =>
        `<tr><td>${escapeXml(f.name)}</td><td class="num">${fmt(f.self)} <small>${pct(f.self, total)}</small></td>` +
        `<td class="num">${fmt(f.total)} <small>${pct(f.total, total)}</small></td></tr>`,
    )
    .join('');
}

// ---- the timeline ----

let series = [];
let seriesStart = 0;
let seriesStep = 1000;

function drawTimeline() {
  const svg = $('timeline');
  const [start, end] = range();
  if (!series.length) {
    svg.innerHTML = '';
    return;
  }
  // Every step of the range, 0 where nothing was stored, drawn as an area.
  const byStep = new Map(series.map((p) => [p[0], p[1]]));
  const points = [];
  for (let t = seriesStart; t < end; t += seriesStep) points.push([t, byStep.get(t) || 0]);
  const max = Math.max(...points.map((p) => p[1]), 1);
  const x = (t) => ((t - start) / Math.max(end - start, 1)) * 1200;
  const y = (v) => 88 - (v / max) * 82;
  const line = points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ');
  const area = `${x(seriesStart).toFixed(1)},88 ${line} ${x(points[points.length - 1][0]).toFixed(1)},88`;
  svg.innerHTML =
    `<polygon points="${area}" fill="rgba(179,64,10,.25)" stroke="#b3400a" stroke-width="1" vector-effect="non-scaling-stroke"/>` +
    '<rect id="brush" y="0" height="90" width="0" fill="rgba(179,64,10,.15)"/>';
}

function brush() {
  const svg = $('timeline');
  let x0 = null;
  const at = (e) => {
    const r = svg.getBoundingClientRect();
    return Math.min(Math.max((e.clientX - r.left) / r.width, 0), 1);
  };
  svg.addEventListener('mousedown', (e) => {
    x0 = at(e);
  });
  svg.addEventListener('mousemove', (e) => {
    const b = $('brush');
    if (x0 === null || !b) return;
    const x1 = at(e);
    b.setAttribute('x', Math.min(x0, x1) * 1200);
    b.setAttribute('width', Math.abs(x1 - x0) * 1200);
  });
  window.addEventListener('mouseup', (e) => {
    if (x0 === null) return;
    const x1 = at(e);
    const [a, b] = [Math.min(x0, x1), Math.max(x0, x1)];
    x0 = null;
    if (b - a < 0.005) return;
    const [start, end] = range();
    state.from = String(Math.floor((start + a * (end - start)) / 1000));
    state.until = String(Math.ceil((start + b * (end - start)) / 1000));
    showRange();
    refresh();
  });
}

// ---- loading ----

function showRange() {
  const preset = [...$('range').options].some((o) => o.value === state.from) && state.until === 'now';
  $('range').value = preset ? state.from : 'custom';
  $('custom').hidden = preset;
  const local = (ms) => new Date(ms - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 19);
  const [start, end] = range();
  $('from').value = local(start);
  $('until').value = local(end);
}

function fill(select, values, chosen, first) {
  select.innerHTML =
    (first ? `<option value="">${first}</option>` : '') +
    values.map((v) => `<option value="${escapeXml(v)}"${v === chosen ? ' selected' : ''}>${escapeXml(v)}</option>`).join('');
}

function emptyState() {
  const host = location.host || '127.0.0.1:4040';
  setStatus(
    'No profiles here yet. Send one, then press Refresh:' +
      `<pre>curl --data-binary 'main;work 100' 'http://${escapeXml(host)}/ingest?name=myapp.cpu&amp;format=folded'</pre>`,
  );
}

// Shows a flame graph (or none), its table and its timeline, unzoomed.
function showViews(newFlame, newFunctions, newSeries) {
  flame = newFlame;
  zoom = null;
  functions = newFunctions;
  series = newSeries;
  drawFlame();
  drawTable();
  drawTimeline();
}

function clearViews() {
  showViews(null, [], []);
}

let generation = 0;
// While Kiln does not answer, the page asks again this often.
const RETRY_MS = 5000;
let retryTimer = 0;

async function refresh() {
  const mine = ++generation;
  const [start, end] = range();
  setStatus('Loading…');
  try {
    const types = (await call('ProfileTypes', { start, end })).profileTypes || [];
    if (mine !== generation) return;
    const ids = types.map((t) => t.ID);
    if (!ids.length) {
      fill($('type'), [], '', '');
      fill($('service'), [], '', '');
      clearViews();
      emptyState();
      return;
    }
    if (!ids.includes(state.type)) {
      state.type = ids.find((id) => id.startsWith('process_cpu:')) || ids[0];
    }
    fill($('type'), ids, state.type);
    const services =
      (await call('LabelValues', { name: 'service_name', matchers: [`{__profile_type__="${state.type}"}`], start, end }))
        .names || [];
    if (state.service && !services.includes(state.service)) services.unshift(state.service);
    fill($('service'), services, state.service, 'All services');
    $('selector').value = state.selector;
    writeUrl();
    const selector = fullSelector();
    const names =
      (await call('LabelNames', { matchers: [`{__profile_type__="${state.type}"}`], start, end })).names || [];
    $('label-names').innerHTML = names
      .filter((n) => !n.startsWith('__'))
      .map((n) => `<option value="{${escapeXml(n)}=&quot;&quot;}">`)
      .join('');
    if (state.diff) {
      await refreshDiff(mine);
      return;
    }
    const query = { profileTypeID: state.type, labelSelector: selector, start, end };
    const step = Math.max(Math.round((end - start) / 1000 / 240), 1);
    const [fg, table, sel] = await Promise.all([
      call('SelectMergeStacktraces', { ...query, maxNodes: MAX_NODES }),
      call('SelectMergeStacktraces', { ...query, format: 'PROFILE_FORMAT_FUNCTIONS', formatOptions: { functions: { limit: 500 } } }),
      call('SelectSeries', { ...query, step, groupBy: [] }),
    ]);
    if (mine !== generation) return;
    seriesStart = start;
    seriesStep = step * 1000;
    showViews(
      decodeFlame(fg.flamegraph || {}),
      ((table.functions || {}).functions || []).map((f) => ({
        name: f.name,
        self: Number(f.self || 0),
        total: Number(f.total || 0),
      })),
      (((sel.series || [])[0] || {}).points || []).map((p) => [Number(p.timestamp), Number(p.value)]),
    );
    if (flame.total === 0) {
      setStatus(
        `Nothing matches <code>${escapeXml(state.type + selector)}</code> in this range: ` +
          'widen the range, or loosen the selector (its label names are offered as you type).',
      );
    } else {
      setStatus(`${escapeXml(state.type + selector)}: ${fmt(flame.total)} in all.`);
    }
  } catch (e) {
    if (mine !== generation) return;
    clearViews();
    if (e.kind === 'auth') {
      showToken(sessionStorage.getItem(TOKEN_KEY) ? 'That token was refused: ' + e.message : '');
    } else if (e.kind === 'forbidden' && state.tenants && !/ scope$/.test(e.message)) {
      setStatus(`This token cannot read all of ${escapeXml(state.tenants)}: ` + escapeXml(e.message), true);
    } else if (e.kind === 'forbidden') {
      setStatus('This token cannot read profiles (it needs the read scope): ' + escapeXml(e.message), true);
    } else if (e.kind === 'limit') {
      setStatus(
        `Over this tenant's query limits: ${escapeXml(e.message)}. ` +
          'Press Refresh in a moment, or narrow the range or the selector.',
        true,
      );
    } else if (e.kind === 'invalid') {
      setStatus(
        `Kiln refused this query: ${escapeXml(e.message)}. ` +
          (/range/.test(e.message) ? 'Choose a shorter range.' : 'Check the selector, e.g. <code>{pod="a"}</code>.'),
        true,
      );
    } else if (e.kind === 'unreachable') {
      setStatus(`${escapeXml(e.message)} Trying again every ${RETRY_MS / 1000} s…`, true);
      clearTimeout(retryTimer);
      retryTimer = setTimeout(() => {
        if (mine === generation) refresh();
      }, RETRY_MS);
    } else {
      setStatus(escapeXml(e.message), true);
    }
  }
}

// The diff view: two queries' flame graphs aligned by Kiln (`Diff`), drawn coloured by change.
async function refreshDiff(mine) {
  const now = Date.now();
  const side = (x) => {
    const start = parseTime(x.from, now);
    const end = parseTime(x.until, now);
    return {
      profileTypeID: state.type,
      labelSelector: x.selector || '{}',
      start: Math.min(start, end - 1000),
      end,
      maxNodes: MAX_NODES,
    };
  };
  writeUrl();
  const d = await call('Diff', { left: side(state.diff.left), right: side(state.diff.right) });
  if (mine !== generation) return;
  showViews(decodeDiff(d.flamegraph || {}), [], []);
  setStatus(
    `Diff of ${escapeXml(state.type)}: baseline ${escapeXml(state.diff.left.selector)} ` +
      `${fmt(flame.leftTicks)}, comparison ${escapeXml(state.diff.right.selector)} ${fmt(flame.rightTicks)}.`,
  );
}

function showDiffBar() {
  const on = !!state.diff;
  $('diffbar').hidden = !on;
  $('diff').classList.toggle('on', on);
  $('timeline-box').hidden = on;
  $('table-box').hidden = on;
  if (!on) return;
  for (const k of ['left', 'right']) {
    $(k + '-sel').value = state.diff[k].selector;
    $(k + '-from').value = state.diff[k].from;
    $(k + '-until').value = state.diff[k].until;
  }
}

function showToken(message) {
  setStatus('');
  $('token').hidden = false;
  $('main').hidden = true;
  $('token-error').textContent = message || '';
  $('token-input').focus();
}

function init() {
  readUrl();
  showRange();
  $('logout').hidden = !sessionStorage.getItem(TOKEN_KEY);
  $('type').addEventListener('change', () => {
    state.type = $('type').value;
    refresh();
  });
  $('service').addEventListener('change', () => {
    state.service = $('service').value;
    refresh();
  });
  $('selector').addEventListener('change', () => {
    state.selector = $('selector').value.trim();
    refresh();
  });
  $('tenants').value = state.tenants;
  $('tenants').addEventListener('change', () => {
    state.tenants = tenantList($('tenants').value);
    $('tenants').value = state.tenants;
    refresh();
  });
  $('range').addEventListener('change', () => {
    if ($('range').value === 'custom') {
      $('custom').hidden = false;
      return;
    }
    state.from = $('range').value;
    state.until = 'now';
    showRange();
    refresh();
  });
  for (const id of ['from', 'until']) {
    $(id).addEventListener('change', () => {
      const ms = Date.parse($(id).value);
      if (Number.isFinite(ms)) state[id] = String(Math.floor(ms / 1000));
      refresh();
    });
  }
  $('refresh').addEventListener('click', refresh);
  $('download').addEventListener('click', downloadPprof);
  $('diff').addEventListener('click', () => {
    if (state.diff) {
      state.diff = null;
    } else {
      // Baseline: the range before the current one; comparison: the current one.
      const [start, end] = range();
      const width = end - start;
      const sel = fullSelector();
      state.diff = {
        left: { selector: sel, from: String(Math.floor((start - width) / 1000)), until: String(Math.floor(start / 1000)) },
        right: { selector: sel, from: state.from, until: state.until },
      };
    }
    showDiffBar();
    refresh();
  });
  for (const k of ['left', 'right']) {
    for (const f of ['sel', 'from', 'until']) {
      $(`${k}-${f}`).addEventListener('change', () => {
        state.diff[k][f === 'sel' ? 'selector' : f] = $(`${k}-${f}`).value.trim();
        refresh();
      });
    }
  }
  $('search').addEventListener('input', drawFlame);
  $('reset-zoom').addEventListener('click', () => {
    zoom = null;
    drawFlame();
  });
  $('flame').addEventListener('click', (e) => {
    const n = flame && nodeOf(e);
    if (!n) return;
    zoom = n.d === 0 ? null : n;
    drawFlame();
  });
  $('flame').addEventListener('mousemove', tooltip);
  $('flame').addEventListener('mouseleave', () => {
    $('tooltip').hidden = true;
  });
  for (const th of $('top').querySelectorAll('th')) {
    th.addEventListener('click', () => {
      state.sort = th.dataset.key;
      drawTable();
    });
  }
  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token-input').value.trim());
    $('token').hidden = true;
    $('main').hidden = false;
    $('logout').hidden = false;
    refresh();
  });
  $('logout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  window.addEventListener('resize', drawFlame);
  brush();
  showDiffBar();
  refresh();
}

init();
