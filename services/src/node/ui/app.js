// The slogate console: reads the admin API it is served beside and draws
// pools, live charts, shadow-mode comparisons, the decision log and the
// fleet. Everything shown is text set through textContent (no HTML is
// built from data), and the admin token lives in sessionStorage only.
'use strict';

(() => {
  const TOKEN_KEY = 'slogate.adminToken';
  const SAMPLE_EVERY_MS = 2000;
  const WINDOW_S = 60;
  const SAMPLES_KEPT = 300;
  const DECISIONS_SHOWN = 50;
  const TAU_DEFAULT = 0.1;
  const COLORS = ['#0b5cad', '#c2410c', '#15803d', '#7c3aed', '#b91c1c', '#0e7490', '#a16207', '#be185d'];
  const $ = (id) => document.getElementById(id);

  const state = { samples: [], charts: {}, poolBlocks: new Map(), pools: [], actors: null, node: null };

  // ---- the admin API -------------------------------------------------

  const token = () => sessionStorage.getItem(TOKEN_KEY) || '';

  async function api(path, options = {}) {
    const headers = Object.assign({}, options.headers || {});
    if (token()) headers.Authorization = 'Bearer ' + token();
    const response = await fetch(path, Object.assign({}, options, { headers, cache: 'no-store' }));
    const text = await response.text();
    let body = text;
    if ((response.headers.get('content-type') || '').includes('json')) {
      try { body = JSON.parse(text); } catch (_) { body = text; }
    }
    if (!response.ok) {
      const message = body && body.error ? body.error + ' (' + body.code + ')' : String(text || response.statusText);
      const error = new Error(response.status + ': ' + message);
      error.status = response.status;
      throw error;
    }
    return body;
  }

  function showError(message) {
    const banner = $('error');
    banner.hidden = !message;
    banner.textContent = message || '';
  }

  // ---- DOM helpers ---------------------------------------------------

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else if (key === 'disabled' || key === 'hidden') node[key] = Boolean(value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function table(headings, rows, numeric = []) {
    return el('table', {},
      el('thead', {}, el('tr', {}, headings.map((h, i) => el('th', { class: numeric.includes(i) ? 'num' : null }, h)))),
      el('tbody', {}, rows.map((row) => el('tr', {}, row.map((cell, i) => el('td', { class: numeric.includes(i) ? 'num' : null }, cell))))));
  }

  const pct = (x) => (x === null || x === undefined || Number.isNaN(x) ? '–' : (100 * x).toFixed(x !== 0 && Math.abs(x) < 0.1 ? 1 : 0) + '%');
  const usd = (x) => (x === null || x === undefined ? '–' : '$' + Number(x).toFixed(x < 10 ? 3 : 2));
  const secs = (x) => (x === null || x === undefined ? '–' : Number(x).toFixed(1) + 's');
  const target = (t) => (!t ? 'none' : t === 'elastic' ? 'elastic' : t.cluster !== undefined ? 'c' + t.cluster : JSON.stringify(t));
  const finishedOf = (stats) => stats.completed + stats.timed_out + stats.failed;
  const poolColor = (name) => COLORS[Math.max(0, state.pools.findIndex((p) => p.id === name)) % COLORS.length];
  const isShadow = (pool) => pool.policy.includes('(shadow:');

  // ---- the token -----------------------------------------------------

  function renderToken() {
    const signedIn = Boolean(token());
    $('token-form').hidden = signedIn;
    $('signed-in').hidden = !signedIn;
    for (const button of document.querySelectorAll('button.mutation')) {
      button.disabled = !signedIn;
      button.title = signedIn ? '' : 'Sign in with the admin token to change the pool';
    }
  }

  $('token-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const value = $('token-input').value.trim();
    $('token-input').value = '';
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    renderToken();
    tick();
  });
  $('sign-out').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    renderToken();
  });

  // An operator's change, and what came of it (kept until the next one).
  async function mutate(what, path, options) {
    const notice = $('notice');
    try {
      const body = await api(path, options);
      notice.textContent = what + ': done' + (body && body.state ? ' (' + body.state + ')' : '') + '.';
      notice.className = 'notice';
    } catch (error) {
      notice.textContent = what + ' failed: ' + error.message;
      notice.className = 'notice failed';
    }
    notice.hidden = false;
    tick();
  }

  // ---- pools ---------------------------------------------------------

  function poolBlock(pool) {
    let block = state.poolBlocks.get(pool.id);
    if (block) return block;
    const size = el('select', { 'aria-label': 'size of the new cluster' }, [4, 8, 16, 32, 64, 128].map((s) => el('option', { value: s }, s + ' RPU')));
    size.value = '16';
    const add = el('button', { type: 'button', class: 'mutation', onclick: () => mutate('Add a ' + size.value + ' RPU cluster to ' + pool.id,
      '/v1/pools/' + encodeURIComponent(pool.id) + '/clusters',
      { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ size: Number(size.value) }) }) }, 'Add cluster');
    const tune = el('button', { type: 'button', class: 'mutation', hidden: true, onclick: () => mutate('Tune ' + pool.id,
      '/v1/pools/' + encodeURIComponent(pool.id) + '/tune', { method: 'POST' }) }, 'Tune now');
    const summary = el('span', { class: 'muted' });
    const clusters = el('div');
    const node = el('div', { class: 'pool', 'data-pool': pool.id },
      el('div', { class: 'pool-head' }, el('span', { class: 'name' }, pool.id), summary, el('span', { class: 'actions' }, size, add, tune)),
      clusters);
    block = { node, summary, clusters, tune };
    state.poolBlocks.set(pool.id, block);
    $('pools').append(node);
    return block;
  }

  function renderPools(pools, actors) {
    const seen = new Set(pools.map((p) => p.id));
    for (const [name, block] of state.poolBlocks) {
      if (!seen.has(name)) { block.node.remove(); state.poolBlocks.delete(name); }
    }
    for (const pool of pools) {
      const block = poolBlock(pool);
      const finished = finishedOf(pool.stats);
      block.summary.textContent = [
        pool.policy,
        pool.in_flight + ' in flight',
        pool.stats.accepted + ' accepted',
        'VR ' + pct(finished ? pool.stats.violations / finished : null),
        pool.stats.offloaded + ' offloaded',
        'billed ' + usd(pool.total_billed_usd) + (pool.elastic_billed_usd ? ' (elastic ' + usd(pool.elastic_billed_usd) + ')' : ''),
      ].join(' · ');
      block.tune.hidden = !(actors && actors.tuners && actors.tuners[pool.id]);
      const trackers = (actors && actors.cluster_trackers && actors.cluster_trackers[pool.id]) || [];
      const executing = new Map(((pool.backend && pool.backend.executing) || []).map(([id, n]) => [id, n]));
      const rows = pool.clusters.filter((c) => c.state !== 'gone').map((cluster) => {
        const tracker = trackers.find((t) => t.cluster === cluster.id) || {};
        const running = cluster.running.length;
        const busy = Math.min(running, executing.get(cluster.id) || 0);
        const remove = el('button', { type: 'button', class: 'mutation', onclick: () => {
          if (window.confirm('Drain and remove c' + cluster.id + ' of ' + pool.id + '?')) {
            mutate('Remove c' + cluster.id + ' of ' + pool.id, '/v1/pools/' + encodeURIComponent(pool.id) + '/clusters/c' + cluster.id, { method: 'DELETE' });
          }
        } }, 'Remove');
        return [
          'c' + cluster.id,
          cluster.size + ' RPU',
          el('span', { class: 'state-' + cluster.state }, cluster.state),
          busy, running - busy,
          usd(tracker.billed_usd_estimate),
          tracker.unhealthy_reason ? el('span', { class: 'state-unhealthy' }, tracker.unhealthy_reason) : 'healthy',
          remove,
        ];
      });
      block.clusters.replaceChildren(table(['cluster', 'size', 'state', 'running', 'queued', 'bill', 'health', ''], rows, [3, 4, 5]));
    }
    const filter = $('filter-pool');
    const wanted = [''].concat(pools.map((p) => p.id));
    if (Array.from(filter.options).map((o) => o.value).join('\n') !== wanted.join('\n')) {
      const chosen = filter.value;
      filter.replaceChildren(...wanted.map((name) => el('option', { value: name }, name || 'all')));
      filter.value = wanted.includes(chosen) ? chosen : '';
    }
    renderToken();
  }

  // ---- live charts ---------------------------------------------------

  // Prometheus text: `slogate_query_latency_seconds_bucket{pool="p",le="x"} n`.
  function latencyBuckets(metricsText) {
    const buckets = {};
    const pattern = /^slogate_query_latency_seconds_bucket\{pool="((?:[^"\\]|\\.)*)",le="([^"]+)"\} (\S+)$/;
    for (const line of metricsText.split('\n')) {
      const match = pattern.exec(line);
      if (!match) continue;
      const pool = match[1].replace(/\\(.)/g, '$1');
      (buckets[pool] = buckets[pool] || []).push([match[2] === '+Inf' ? Infinity : Number(match[2]), Number(match[3])]);
    }
    return buckets;
  }

  // The q-quantile of the observations between two cumulative bucket
  // snapshots, interpolated within its bucket (as histogram_quantile).
  function quantile(q, before, after) {
    if (!before || !after || before.length !== after.length) return null;
    const counts = after.map(([le, n], i) => [le, n - before[i][1]]);
    const total = counts[counts.length - 1][1];
    if (total <= 0) return null;
    const rank = q * total;
    let lower = 0;
    let below = 0;
    for (const [le, cumulative] of counts) {
      if (cumulative >= rank) {
        if (le === Infinity) return lower;
        const inBucket = cumulative - below;
        return inBucket > 0 ? lower + (le - lower) * ((rank - below) / inBucket) : le;
      }
      lower = le;
      below = cumulative;
    }
    return lower;
  }

  function sample(node, pools, metricsText) {
    const buckets = latencyBuckets(metricsText);
    const entry = { t: Date.now() / 1000, v: node.virtual_now_s, pools: {} };
    for (const pool of pools) {
      entry.pools[pool.id] = {
        finished: finishedOf(pool.stats),
        violations: pool.stats.violations,
        accepted: pool.stats.accepted,
        offloaded: pool.stats.offloaded,
        billed: pool.total_billed_usd,
        buckets: buckets[pool.id] || null,
      };
    }
    state.samples.push(entry);
    if (state.samples.length > SAMPLES_KEPT) state.samples.shift();
  }

  // For each sample, the earliest sample within the window before it.
  function windowed(measure) {
    const samples = state.samples;
    let start = 0;
    return samples.map((now, i) => {
      while (start < i && samples[start].t < now.t - WINDOW_S) start++;
      return start < i ? measure(samples[start], now) : null;
    });
  }

  function tau(actors) {
    const targets = Object.values((actors && actors.autoscalers) || {}).map((a) => a.config && a.config.target).filter((x) => typeof x === 'number');
    return targets.length ? Math.min(...targets) : TAU_DEFAULT;
  }

  // A share's axis: from 0 to at least `floor`, so that a flat zero line
  // still reads as a share.
  const shareRange = (floor) => (u, min, max) => [0, Math.max(floor, max === null ? 0 : max * 1.1)];

  function drawChart(id, series, data, yFormat, yRange) {
    const container = $(id);
    const width = Math.max(220, container.clientWidth || 280);
    const key = series.map((s) => s.label).join('|');
    let chart = state.charts[id];
    if (!chart || chart.key !== key) {
      if (chart) chart.plot.destroy();
      const opts = {
        width, height: 150,
        scales: yRange ? { x: { time: true }, y: { range: yRange } } : { x: { time: true } },
        legend: { live: false },
        series: [{}].concat(series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, dash: s.dash, spanGaps: true, value: (u, v) => (v === null ? '–' : yFormat(v)) }))),
        axes: [{ size: 30 }, { values: (u, ticks) => ticks.map(yFormat), size: 64 }],
      };
      chart = { key, plot: new uPlot(opts, data, container) };
      state.charts[id] = chart;
    } else {
      chart.plot.setData(data);
    }
    // How many instants have a value: the page's tests read it.
    container.dataset.points = String(data[0].filter((_, i) => data.slice(1).some((s) => s[i] !== null && s[i] !== undefined)).length);
  }

  function renderCharts(pools, actors) {
    if (typeof uPlot === 'undefined' || state.samples.length === 0) return;
    const xs = state.samples.map((s) => s.t);
    const names = pools.map((p) => p.id);
    const per = (field) => (a, b) => (a.pools[field.pool] && b.pools[field.pool] ? field.measure(a.pools[field.pool], b.pools[field.pool], a, b) : null);
    const perPool = (measure) => names.map((pool) => windowed(per({ pool, measure })));
    const limit = tau(actors);
    drawChart('chart-vr',
      names.map((n) => ({ label: n, color: poolColor(n) })).concat([{ label: 'τ ' + pct(limit), color: '#888', dash: [6, 4] }]),
      [xs].concat(perPool((a, b) => (b.finished > a.finished ? (b.violations - a.violations) / (b.finished - a.finished) : null)), [xs.map(() => limit)]),
      (v) => pct(v), shareRange(2 * limit));
    drawChart('chart-latency',
      names.flatMap((n) => [{ label: n + ' p50', color: poolColor(n), dash: [4, 3] }, { label: n + ' p99', color: poolColor(n) }]),
      [xs].concat(names.flatMap((pool) => [0.5, 0.99].map((q) => windowed(per({ pool, measure: (a, b) => quantile(q, a.buckets, b.buckets) }))))),
      (v) => v.toFixed(v < 10 ? 1 : 0) + 's');
    drawChart('chart-cost',
      names.map((n) => ({ label: n, color: poolColor(n) })),
      [xs].concat(perPool((a, b, sa, sb) => (sb.v > sa.v ? ((b.billed - a.billed) * 3600) / (sb.v - sa.v) : null))),
      (v) => '$' + v.toFixed(2));
    drawChart('chart-offload',
      names.map((n) => ({ label: n, color: poolColor(n) })),
      [xs].concat(perPool((a, b) => (b.accepted > a.accepted ? (b.offloaded - a.offloaded) / (b.accepted - a.accepted) : null))),
      (v) => pct(v), shareRange(0.1));
    $('chart-note').textContent = '(sampled every ' + SAMPLE_EVERY_MS / 1000 + ' s in this page, ' + WINDOW_S + ' s window; ' + state.samples.length + ' samples)';
  }

  // ---- shadow mode ---------------------------------------------------

  async function renderShadow(pools) {
    const shadowed = pools.filter(isShadow);
    $('shadow-section').hidden = shadowed.length === 0;
    if (!shadowed.length) return;
    const blocks = [];
    for (const pool of shadowed) {
      const report = await api('/v1/pools/' + encodeURIComponent(pool.id) + '/shadow');
      const predicted = (side) => pct(side.predicted ? side.predicted_vr : null);
      blocks.push(el('h3', {}, pool.id + ': ' + report.acting + ' acts, ' + report.shadow + ' in its shadow'));
      blocks.push(table(['', 'VR', 'cost', 'queries'], [
        [report.acting + ' (actual)', pct(report.actual.finished ? report.actual.vr : null) + ' realised; ' + predicted(report.actual.slogate_predicted) + ' as ' + report.shadow + ' predicted it',
          usd(report.actual.billed_usd) + ' billed; ' + usd(report.actual.slogate_predicted.marginal_cost_usd) + ' as ' + report.shadow + ' predicted it',
          report.actual.finished + ' finished'],
        [report.shadow + ' (its own choices)', predicted(report.slogate.predicted) + ' predicted', usd(report.slogate.predicted.marginal_cost_usd) + ' predicted',
          report.slogate.predicted.offloads + ' would offload'],
      ]));
      blocks.push(el('p', { class: 'muted' }, 'Agreed on ' + report.agreed + ' of ' + report.decisions + ' queries (' + pct(report.agreement) + '); '
        + report.would_provision.length + ' provider request(s) recorded, none carried out.'));
      const disagreements = report.recent.filter((d) => JSON.stringify(d.would) !== JSON.stringify(d.actual)).slice(0, 8);
      if (disagreements.length) {
        blocks.push(table(['query', 'ran on', report.shadow + ' would', 'outcome', 'why'], disagreements.map((d) => [
          String(d.query), target(d.actual), target(d.would),
          d.missed === null || d.missed === undefined ? 'running' : (d.missed ? 'missed' : 'met') + ' (' + secs(d.latency_s) + ' vs ' + secs(d.slo_s) + ')',
          el('span', { class: 'explanation' }, d.explanation),
        ])));
      }
    }
    $('shadow').replaceChildren(...blocks);
  }

  // ---- the decision log ----------------------------------------------

  function splitRunnerUp(explanation) {
    const match = /; runner-up (\S+) \(([^)]*)\)/.exec(explanation);
    return match ? [explanation.replace(match[0], ''), match[1] + ' (' + match[2] + ')'] : [explanation, '–'];
  }

  function scalingDetail(decision) {
    if (decision.selection) {
      const chosen = decision.selection.choice;
      return el('div', {}, decision.mode || '',
        table(['size', 'simulated VR', 'cost', 'copies', ''], decision.selection.candidates.map((c) => [
          c.size === null ? 'none' : c.size + ' RPU', pct(c.violation_rate), usd(c.cost_usd), String(c.copies), c.size === chosen ? 'chosen' : '',
        ]), [1, 2, 3]));
    }
    const parts = [decision.reason, decision.size ? decision.size + ' RPU' : null, decision.cluster !== undefined ? 'c' + decision.cluster : null];
    return parts.filter(Boolean).join(' · ') || JSON.stringify(decision);
  }

  function tuningRows(actors, pool) {
    const rows = [];
    for (const [name, tuner] of Object.entries((actors && actors.tuners) || {})) {
      if (pool && name !== pool) continue;
      const active = tuner.active;
      const plan = active
        ? 'spinups [' + active.config.spinups.map((s) => s.size + ' RPU at ' + (s.at / 3.6e9).toFixed(2) + ' h').join(', ') + ']; expected VR ' + pct(active.expected.violations)
          + ', ' + usd(active.expected.cost_usd) + '/day' + (active.base_expected ? ' (base: ' + pct(active.base_expected.violations) + ', ' + usd(active.base_expected.cost_usd) + ')' : '')
          + (active.accepted ? '; accepted' : '; not better than the base: kept it')
        : 'no run finished yet';
      rows.push([name, tuner.running ? 'running' + (tuner.phase ? ' (' + JSON.stringify(tuner.phase) + ')' : '') : 'idle', String(tuner.runs),
        tuner.last_error ? el('span', { class: 'state-unhealthy' }, tuner.last_error) : '', el('span', { class: 'explanation' }, plan)]);
    }
    return rows;
  }

  async function renderDecisions(actors) {
    const kind = $('filter-kind').value;
    const pool = $('filter-pool').value;
    const tenant = $('filter-tenant').value.trim();
    let content;
    if (kind === 'tuning') {
      const rows = tuningRows(actors, pool);
      content = rows.length ? table(['pool', 'state', 'runs', 'error', 'plan'], rows) : el('p', { class: 'muted' }, 'No pool has a tuner ([pool.tune] enabled = true).');
    } else {
      const query = new URLSearchParams({ kind, limit: String(DECISIONS_SHOWN) });
      if (pool) query.set('pool', pool);
      if (tenant && kind === 'routing') query.set('tenant', tenant);
      const decisions = await api('/v1/decisions?' + query.toString());
      if (kind === 'routing') {
        content = table(['at', 'pool', 'query', 'tenant', 'template', 'target', 'why', 'runner-up'], decisions.map((d) => {
          const [why, runnerUp] = splitRunnerUp(d.explanation);
          return [secs(d.at_s), d.pool, d.client_query_id, d.tenant || '', 't' + d.template, target(d.target), el('span', { class: 'explanation' }, why), runnerUp];
        }));
      } else {
        content = table(['at', 'pool', 'kind', 'detail'], decisions.map((d) => [secs(d.at / 1e6), d.pool, d.kind, scalingDetail(d)]));
      }
      if (!decisions.length) content = el('p', { class: 'muted' }, 'No ' + kind + ' decisions yet.');
    }
    $('decisions').replaceChildren(content);
  }

  for (const id of ['filter-kind', 'filter-pool', 'filter-tenant']) {
    $(id).addEventListener('change', () => renderDecisions(state.actors).catch((e) => showError(e.message)));
  }
  $('decision-filters').addEventListener('submit', (event) => event.preventDefault());

  // ---- the fleet -----------------------------------------------------

  function renderFleet(fleet) {
    const members = Object.entries(fleet.members || {});
    $('fleet-section').hidden = fleet.mode === 'single' && members.length === 0;
    if ($('fleet-section').hidden) return;
    const reports = fleet.reports || {};
    const owners = Object.entries(fleet.owners || {}).map(([pool, owner]) => [pool, owner || '(none)', owner === fleet.node_id ? 'this node' : '']);
    $('fleet').replaceChildren(
      el('p', { class: 'muted' }, 'This node: ' + (fleet.node_id || '(unnamed)') + ' · ' + fleet.mode + ' · deployment ' + (fleet.deployment || '–')
        + ' · coordinator ' + (fleet.coordinator_reachable ? 'reachable' : 'unreachable') + ' · lease ' + secs(fleet.lease_left_s) + ' left'),
      table(['member', 'address', 'pools owned', 'lease left', 'forwarded', 'received'], members.map(([id, addr]) => {
        const report = reports[id] || {};
        if (report.error) return [id + (id === fleet.node_id ? ' (this node)' : ''), addr, el('span', { class: 'state-unhealthy' }, report.error), '', '', ''];
        return [id + (id === fleet.node_id ? ' (this node)' : ''), addr, (report.pools_owned || []).join(', ') || '–', secs(report.lease_left_s), String(report.forwarded ?? '–'), String(report.received ?? '–')];
      }), [3, 4, 5]),
      table(['pool', 'owner', ''], owners));
  }

  // ---- the loop ------------------------------------------------------

  let ticking = false;
  async function tick() {
    if (ticking) return;
    ticking = true;
    try {
      const [node, pools, actors, metricsText, fleet] = await Promise.all([
        api('/v1/node'), api('/v1/pools'), api('/v1/actors'), api('/metrics'), api('/v1/fleet')]);
      state.node = node;
      state.pools = pools;
      state.actors = actors;
      $('node-info').textContent = 'v' + node.version + (node.node_id ? ' · node ' + node.node_id : '') + ' · ' + pools.length + ' pool(s) · virtual time '
        + secs(node.virtual_now_s) + ' at ' + node.time_compression + '× real time';
      $('status').textContent = node.ready ? 'ready' : 'shutting down';
      $('status').className = 'badge ' + (node.ready ? 'ok' : 'bad');
      sample(node, pools, metricsText);
      renderPools(pools, actors);
      renderCharts(pools, actors);
      renderFleet(fleet);
      await renderShadow(pools);
      await renderDecisions(actors);
      showError('');
    } catch (error) {
      showError(error.status === 401 ? 'This node needs the admin token to read its state: sign in above.' : 'Cannot read the admin API: ' + error.message);
    } finally {
      ticking = false;
    }
  }

  renderToken();
  tick();
  setInterval(tick, SAMPLE_EVERY_MS);
})();
