// The trajectory viewer: filters, the list (newest first, paged with a cursor), one trajectory's detail.
"use strict";

// the phases of the attempt (total_s); the wait in the queue came before it and is shown apart
const PHASES = [["sandbox_start_s", "sandbox", "#a78bfa"],
  ["setup_s", "setup", "#22d3ee"], ["llm_s", "LLM", "#60a5fa"], ["exec_s", "exec", "#f59e0b"],
  ["reward_s", "reward", "#34d399"]];

const Viewer = {
  next: null,
  selected: null,

  params() {
    const form = document.getElementById("filters");
    return Object.fromEntries([...new FormData(form).entries()].filter(([, v]) => v !== ""));
  },

  setJobs(jobs) {
    const select = document.getElementById("filter-job");
    const current = select.value;
    const names = jobs.map((j) => j.status.job);
    if ([...select.options].map((o) => o.value).join() === names.join()) return;
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(current)) select.value = current;
  },

  async load(append = false) {
    const params = Viewer.params();
    if (!params.job) return;
    if (append && Viewer.next) params.before = Viewer.next;
    const page = await apiJson("/ui/api/trajectories", params);
    const tbody = document.querySelector("#traj-table tbody");
    const rows = page.items.map((r) => Viewer.row(params.job, r));
    if (append) tbody.append(...rows); else tbody.replaceChildren(...rows);
    Viewer.next = page.next;
    document.getElementById("more").hidden = !page.next;
    document.getElementById("traj-count").textContent = `${tbody.children.length} shown`;
  },

  row(job, r) {
    const reward = r.reward === null ? Fmt.none : Fmt.num(r.reward, 2);
    return el("tr", {
      dataset: { entry: r.entry_id, trajectory: r.trajectory_id },
      class: Viewer.selected === r.entry_id ? "selected" : null,
      onclick: () => { location.hash = `#/trajectories/${encodeURIComponent(job)}/${r.entry_id}`; },
    },
    el("td.dim", { title: new Date(r.finished_at * 1000).toISOString() }, Fmt.clock(r.finished_at)),
    el("td.mono", { title: r.trajectory_id }, r.trajectory_id.slice(r.rollout_id.length + 1),
      r.attempt > 1 ? el("span.dim", {}, ` #${r.attempt}`) : null),
    el("td", {}, badge(r.status, r.truncation || r.infra_stage)),
    el("td.num", {}, reward), el("td.num", {}, r.turns),
    el("td.mono.small", {}, r.weight_versions.map(ver).join(" ")),
    el("td.num", {}, `${Fmt.secs(r.total_s)} s`));
  },

  async download() {
    const params = Viewer.params();
    const blob = await (await api("/ui/api/trajectories.jsonl", params)).blob();
    const link = el("a", { href: URL.createObjectURL(blob), download: `${params.job}-trajectories.jsonl` });
    document.body.append(link);
    link.click();
    link.remove();
  },

  async open(job, entryId) {
    Viewer.selected = entryId;
    document.querySelectorAll("#traj-table tr.selected").forEach((tr) => tr.classList.remove("selected"));
    const tr = document.querySelector(`#traj-table tr[data-entry="${entryId}"]`);
    if (tr) tr.classList.add("selected");
    const pane = document.getElementById("detail");
    pane.replaceChildren(el("div.empty", {}, "loading…"));
    try {
      const data = await apiJson(`/ui/api/trajectories/${encodeURIComponent(job)}/${entryId}`);
      fill(pane, Viewer.detail(data));
    } catch (err) {
      pane.replaceChildren(el("div.empty.bad", {}, `cannot load ${entryId}: ${err.message}`));
    }
  },

  detail(data) {
    const t = data.trajectory;
    const generated = t.loss_mask.reduce((a, m) => a + m, 0);
    return [
      el("div.card.detail-head", { dataset: { trajectory: t.trajectory_id } },
        el("div.detail-title", {}, el("span.mono", {}, t.trajectory_id), badge(t.status, t.truncation)),
        el("div.detail-grid", {},
          Viewer.fact("reward", t.status === "infra_error" || t.status === "cancelled" || t.reward === null ? Fmt.none : Fmt.num(t.reward, 2)),
          Viewer.fact("attempt", t.attempt), Viewer.fact("turns", t.turns.length),
          Viewer.fact("task", t.task_id), Viewer.fact("rollout", t.rollout_id), Viewer.fact("worker", t.worker || Fmt.none),
          Viewer.fact("prompt tokens", Fmt.int(t.prompt_ids.length)),
          Viewer.fact("response tokens", `${Fmt.int(t.response_ids.length)} (${Fmt.int(generated)} generated)`),
          Viewer.fact("weights", [...new Set(t.turns.map((x) => ver(x.weight_version)))].join(" ") || Fmt.none)),
        Viewer.phases(t.timings)),
      t.infra ? Viewer.infra(t.infra) : null,
      t.reward_details ? Viewer.reward(t.reward_details, t.reward) : null,
      t.turns.length ? Turns.legend(data.token_texts !== null) : null,
      ...Turns.render(t, data.token_texts),
      data.prompt_text ? el("details.card", {}, el("summary", {}, "First prompt (as tokenized)"), el("pre.wrap", {}, data.prompt_text)) : null,
    ];
  },

  fact(label, value) {
    return el("div.fact", {}, el("div.fact-label", {}, label), el("div.fact-value", { dataset: { fact: label } }, value));
  },

  phases(timings) {
    const total = PHASES.reduce((a, [k]) => a + (timings[k] || 0), 0);
    const bar = el("div.stack.phases");
    const legend = el("div.phase-legend");
    for (const [k, label, color] of PHASES) {
      const v = timings[k] || 0;
      if (total > 0 && v > 0) bar.append(el("div.seg", { style: { flex: String(v), background: color }, title: `${label} ${v.toFixed(3)} s` }));
      legend.append(el("span.phase", { dataset: { phase: k } }, el("span.swatch", { style: { background: color } }), `${label} ${Fmt.secs(v)} s`));
    }
    legend.append(el("span.phase.dim", { dataset: { phase: "queued_s" } }, `(queued ${Fmt.secs(timings.queued_s)} s before)`));
    return el("div", {}, el("div.card-title", {}, `Time per phase · ${Fmt.secs(timings.total_s)} s in all`), bar, legend);
  },

  infra(infra) {
    return el("div.card.infra", { dataset: { infraStage: infra.stage } },
      el("div.card-title.bad", {}, `Infrastructure failure at ${infra.stage}`),
      el("div", {}, el("span.mono", {}, infra.code), ` after ${infra.attempts} attempt${infra.attempts === 1 ? "" : "s"}`),
      el("pre.wrap", {}, infra.message),
      el("div.dim.small", {}, "Not scored: infra failures never enter the loss as reward 0."));
  },

  reward(details, reward) {
    const tests = Viewer.testResults(details.output || "");
    return el("div.card.reward", {},
      el("div.card-title", {}, "Reward ", el("b", { dataset: { reward: String(reward) } }, Fmt.num(reward, 2)),
        el("span.dim", {}, ` · exit ${details.exit_code ?? "–"} · ${Fmt.secs(details.duration_s)} s${details.parsed ? " · parsed from output" : ""}`)),
      tests.length ? el("table.table.tests", {}, el("tbody", {}, ...tests.map(([name, outcome]) =>
        el("tr", {}, el("td.mono", {}, name), el("td", {}, el(`span.badge.${outcome === "PASSED" ? "ok" : outcome === "SKIPPED" ? "muted" : "bad"}`, {}, outcome)))))) : null,
      details.output ? el("pre.wrap.output", {}, details.output) : el("div.dim", {}, "(no output)"));
  },

  // per-test results where the reward command printed them (pytest -rA / -v style lines)
  testResults(output) {
    const found = new Map();
    for (const line of output.split("\n")) {
      let m = line.match(/^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)/);
      if (m) { found.set(m[2], m[1]); continue; }
      m = line.match(/^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)/);
      if (m) found.set(m[1], m[2]);
    }
    return [...found.entries()];
  },
};
