// The fleet view: one panel per job, the proxy's engines, the broker's sandboxes; charts of the last hour.
"use strict";

const STATUS_ORDER = ["completed", "truncated", "infra_error", "cancelled"];

const Fleet = {
  overview: null,

  render(overview) {
    Fleet.overview = overview;
    const jobs = document.getElementById("jobs");
    const keep = new Set(overview.jobs.map((j) => j.status.job));
    for (const panel of [...jobs.children]) if (!keep.has(panel.dataset.job)) panel.remove();
    if (!overview.jobs.length) jobs.replaceChildren(el("div.card.empty", {}, "No jobs yet."));
    for (const view of overview.jobs) Fleet.jobPanel(jobs, view);
    Fleet.engines(overview);
    Fleet.broker(overview.broker);
  },

  jobPanel(root, view) {
    const s = view.status;
    let panel = root.querySelector(`[data-job="${CSS.escape(s.job)}"]`);
    if (!panel) {
      panel = el("section.job", { dataset: { job: s.job } },
        el("div.job-head", {}, el("h2", {}, "job ", el("span.job-name", {}, s.job)), el("span.dim.job-meta")),
        el("div.kpis"), el("div.grid.three.job-extra"),
        el("div.grid.three.job-charts", {},
          Fleet.chartCard(`chart-tph-${s.job}`, "Trajectories per hour (60 s window)"),
          Fleet.chartCard(`chart-load-${s.job}`, "In flight and queue depth"),
          Fleet.chartCard(`chart-episode-${s.job}`, "Episode time p50 / p99 (s)")));
      root.append(panel);
    }
    panel.querySelector(".job-meta").textContent =
      `pool ${s.pool} · weight ${s.weight} · quotas ${Fmt.int(s.quotas.max_in_flight)} in flight, ` +
      `${Fmt.int(s.quotas.max_queued)} queued`;
    panel.querySelector(".kpis").replaceChildren(...Fleet.kpis(view));
    panel.querySelector(".job-extra").replaceChildren(
      Fleet.statusCard(s), Fleet.infraCard(s), Fleet.weightsCard(view));
  },

  chartCard(id, title) {
    return el("div.card", {}, el("div.card-title", {}, title, el("span.dim", {}, " · last hour")), el("div.chart", { id }));
  },

  kpis(view) {
    const s = view.status;
    const st = view.staleness;
    return [
      kpi("trajectories_per_hour", "trajectories / hour", Fmt.int(s.trajectories_per_hour), "/h",
        "over the job's latest 1,000 finishes"),
      kpi("in_flight", "in flight", Fmt.int(s.in_flight)),
      kpi("queue_depth", "queue depth", Fmt.int(s.queue_depth)),
      kpi("finished", "finished", Fmt.int(s.finished)),
      kpi("episode_p50_s", "episode p50", Fmt.secs(s.tail.episode_p50_s), "s"),
      kpi("episode_p99_s", "episode p99", Fmt.secs(s.tail.episode_p99_s), "s"),
      kpi("tail_share_after_90pct", "time after 90% done", Fmt.pct(s.tail.tail_share_after_90pct), "%",
        "share of a rollout's time spent after 90% of its trajectories finished (latest 20 rollouts)"),
      kpi("turn_cap_hit_rate", "turn-cap hit rate", Fmt.pct(s.tail.turn_cap_hit_rate), "%"),
      kpi("infra_error_rate", "infra-error rate", Fmt.pct(s.infra_error_rate), "%"),
      kpi("staleness", "trainer staleness", st && st.mean !== null ? Fmt.num(st.mean, 2) : Fmt.none,
        st && st.max !== null ? `max ${st.max}` : "",
        "weight versions between the pool's current version and what the trainer consumed last"),
    ];
  },

  statusCard(s) {
    const total = STATUS_ORDER.reduce((a, k) => a + (s.by_status[k] || 0), 0);
    const bar = el("div.stack");
    for (const k of STATUS_ORDER) {
      const n = s.by_status[k] || 0;
      if (n) bar.append(el(`div.seg.${STATUS_CLASS[k]}`, { style: { flex: String(n) }, title: `${k}: ${n}` }));
    }
    const legend = STATUS_ORDER.map((k) => el("div.legend-row", { dataset: { statusCount: k } },
      el(`span.swatch.${STATUS_CLASS[k]}`), el("span", {}, k), el("span.num", {}, Fmt.int(s.by_status[k] || 0))));
    return el("div.card", {}, el("div.card-title", {}, "Status counts"), total ? bar : el("div.stack.empty-bar"), ...legend);
  },

  infraCard(s) {
    const rows = Object.entries(s.infra_failed_attempts_by_stage).filter(([, n]) => n > 0);
    const body = rows.length
      ? rows.map(([stage, n]) => el("div.legend-row", { dataset: { infraStage: stage } },
        el("span.swatch.bad"), el("span", {}, stage), el("span.num", {}, Fmt.int(n))))
      : [el("div.dim", {}, "none")];
    return el("div.card", {}, el("div.card-title", {}, "Infra failures by stage ", el("span.dim", {}, "(failed attempts)")), ...body);
  },

  weightsCard(view) {
    const entries = Object.entries(view.weight_versions);
    const total = entries.reduce((a, [, n]) => a + n, 0) || 1;
    const pool = (Fleet.overview.pools || []).find((p) => p.name === view.status.pool);
    const rows = entries.map(([v, n]) => el("div.bar-row", {},
      el("span.bar-label", {}, ver(v)), el("span.bar", {}, el("span.fill", { style: { width: `${(100 * n) / total}%` } })),
      el("span.num", {}, Fmt.int(n))));
    const st = view.staleness;
    const hist = st && st.sampled ? Object.entries(st.histogram).map(([k, n]) => `${k}: ${n}`).join(" · ") : null;
    return el("div.card", {},
      el("div.card-title", {}, "Weight versions ", el("span.dim", {}, "(turns of the latest 50 trajectories)")),
      el("div.dim.small", {}, `pool ${view.status.pool} serves `, el("b", {}, ver(pool && pool.version)),
        view.trainer_lag !== null ? ` · trainer lag ${Fmt.int(view.trainer_lag)} trajectories` : ""),
      ...(rows.length ? rows : [el("div.dim", {}, "no trajectories yet")]),
      hist ? el("div.dim.small", {}, `staleness of consumed (versions: count) ${hist}`) : null);
  },

  engines(overview) {
    const tbody = document.querySelector("#engines-table tbody");
    const maxLoad = Math.max(1, ...overview.engines.map((e) => e.load));
    tbody.replaceChildren(...overview.engines.map((e) => el("tr", { dataset: { engine: e.engine_id } },
      el("td.mono", {}, e.engine_id), el("td", {}, e.pool),
      el("td", {}, el(`span.badge.${e.ejected ? "bad" : e.state === "active" ? "ok" : "warn"}`, {}, e.ejected ? "ejected" : e.state)),
      el("td", {}, ver(e.weight_version)),
      el("td.num", {}, Fmt.int(e.in_flight)),
      el("td", {}, el("span.bar.small", { title: `load ${e.load}` }, el("span.fill", { style: { width: `${(100 * e.load) / maxLoad}%` } }))),
      el("td.num", {}, Fmt.int(e.calls)), el("td.num" + (e.errors ? ".bad" : ""), {}, Fmt.int(e.errors)),
      el("td.num", {}, e.latency_p50_s === null ? Fmt.none : `${Fmt.secs(e.latency_p50_s)} s`))));
    document.getElementById("engines-empty").hidden = overview.engines.length > 0;
    document.getElementById("pools-summary").textContent = overview.pools
      .map((p) => `· pool ${p.name}: ${p.engines} engine${p.engines === 1 ? "" : "s"}, weights ${ver(p.version)}${p.updating ? " (updating)" : ""}`)
      .join(" ");
  },

  broker(b) {
    const card = document.getElementById("broker-card");
    if (!b) { card.replaceChildren(el("div.empty", {}, "No broker configured or reachable.")); return; }
    const pools = b.pools.map((p) => el("div.bar-row", { dataset: { sandboxPool: p.pool } },
      el("span.bar-label", {}, p.pool),
      el("span.bar", {}, el("span.fill.ok", { style: { width: `${p.target ? Math.min(100, (100 * p.ready) / p.target) : 0}%` } })),
      el("span.num", {}, `${p.ready} / ${p.target}`)));
    const kinds = Object.entries(b.lease_p50_by_kind).map(([k, v]) => `${k} ${Fmt.secs(v)} s`).join(" · ");
    fill(card,
      el("div.kpis.compact", {},
        kpi("leases", "leases", Fmt.int(b.leases), b.lease_limit ? `of ${Fmt.int(b.lease_limit)}` : ""),
        kpi("admission_waiting", "admission queue", Fmt.int(b.admission_waiting)),
        kpi("lease_p50_s", "lease start p50", Fmt.secs(b.lease_p50_s), "s"),
        kpi("lease_p99_s", "lease start p99", Fmt.secs(b.lease_p99_s), "s")),
      el("div.card-title", {}, "Warm pools ", el("span.dim", {}, "(ready / target)")),
      ...(pools.length ? pools : [el("div.dim", {}, "no warm pools")]),
      kinds ? el("div.dim.small", {}, `lease start p50 by backend/kind: ${kinds}`) : null,
      Object.keys(b.errors).length ? el("div.small.bad", {}, "errors: " +
        Object.entries(b.errors).map(([c, n]) => `${c} ${n}`).join(" · ")) : null);
  },

  history(job, history) {
    const js = history.job;
    const t = js.map((s) => s.t);
    const need = (id, text) => { const c = document.getElementById(id); if (c) Charts.empty(c, text); return !!c; };
    if (js.length < 2) {
      ["tph", "load", "episode"].forEach((k) => need(`chart-${k}-${job}`, "collecting samples…"));
    } else {
      const c1 = document.getElementById(`chart-tph-${job}`);
      if (c1) Charts.draw(c1, t, [{ label: "traj/h", values: ratePerHour(js, "finished"), fill: true }]);
      const c2 = document.getElementById(`chart-load-${job}`);
      if (c2) Charts.draw(c2, t, [{ label: "in flight", values: js.map((s) => s.in_flight), fill: true },
        { label: "queued", values: js.map((s) => s.queue_depth) }]);
      const c3 = document.getElementById(`chart-episode-${job}`);
      if (c3) Charts.draw(c3, t, [{ label: "p50", values: js.map((s) => s.episode_p50_s) },
        { label: "p99", values: js.map((s) => s.episode_p99_s) }]);
    }
    Fleet.fleetHistory(history.fleet);
  },

  fleetHistory(fs) {
    const engines = document.getElementById("chart-engines");
    const sandboxes = document.getElementById("chart-sandboxes");
    if (fs.length < 2) { Charts.empty(engines, "collecting samples…"); Charts.empty(sandboxes, "collecting samples…"); return; }
    const t = fs.map((s) => s.t);
    const ids = [...new Set(fs.flatMap((s) => Object.keys(s.engines_in_flight)))].sort();
    if (ids.length) Charts.draw(engines, t, ids.map((id) => ({ label: id, values: fs.map((s) => s.engines_in_flight[id] ?? null) })));
    else Charts.empty(engines, "no engines");
    Charts.draw(sandboxes, t, [
      { label: "ready", values: fs.map((s) => s.sandboxes_ready), fill: true },
      { label: "leases", values: fs.map((s) => s.leases) },
      { label: "waiting", values: fs.map((s) => s.admission_waiting) }]);
  },
};
