// Wiring: sign-in, routing between the two views, and the polling loop (no page reloads).
"use strict";

const POLL_MS = 2000;
const HISTORY_EVERY = 3; // polls between history refreshes

const App = {
  view: "fleet",
  polls: 0,
  timer: null,

  start() {
    Auth.fromFragment();
    document.getElementById("token-form").addEventListener("submit", App.signIn);
    document.getElementById("token-button").addEventListener("click", () => App.askToken(""));
    document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); Viewer.load(false).catch(App.fail); });
    document.getElementById("filter-job").addEventListener("change", () => Viewer.load(false).catch(App.fail));
    document.getElementById("more").addEventListener("click", () => Viewer.load(true).catch(App.fail));
    document.getElementById("download").addEventListener("click", () => Viewer.download().catch(App.fail));
    window.addEventListener("hashchange", App.route);
    window.addEventListener("resize", () => { App.polls = 0; });
    if (!Auth.token()) { App.askToken(""); return; }
    App.route();
    App.tick();
  },

  askToken(message) {
    document.getElementById("token-error").textContent = message;
    const dialog = document.getElementById("token-dialog");
    if (!dialog.open) dialog.showModal();
  },

  signIn() {
    Auth.set(document.getElementById("token-input").value.trim());
    App.polls = 0;
    App.route();
    App.tick();
  },

  route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    App.view = parts[0] === "trajectories" ? "trajectories" : "fleet";
    for (const name of ["fleet", "trajectories"]) {
      document.getElementById(`view-${name}`).hidden = name !== App.view;
      document.querySelector(`.tab[data-view="${name}"]`).classList.toggle("active", name === App.view);
    }
    if (App.view === "trajectories") {
      const select = document.getElementById("filter-job");
      if (parts[1] && select.value !== parts[1]) {
        if (![...select.options].some((o) => o.value === parts[1])) select.append(el("option", { value: parts[1] }, parts[1]));
        select.value = parts[1];
      }
      const list = document.querySelector("#traj-table tbody");
      const loading = list.children.length ? Promise.resolve() : Viewer.load(false);
      loading.then(() => { if (parts[2]) Viewer.open(parts[1], parts[2]); }).catch(App.fail);
    }
  },

  async tick() {
    clearTimeout(App.timer);
    try {
      const overview = await apiJson("/ui/api/overview");
      Fleet.render(overview);
      Viewer.setJobs(overview.jobs);
      if (App.polls % HISTORY_EVERY === 0) await App.history(overview);
      App.problems(overview.problems);
      App.live(true, `updated ${Fmt.clock(overview.generated_at)}`);
      document.body.dataset.loaded = String(overview.generated_at);
      if (App.view === "trajectories" && !document.querySelector("#traj-table tbody").children.length) await Viewer.load(false);
      App.polls += 1;
    } catch (err) {
      App.fail(err);
      if (err.status === 401 || err.status === 403) return;
    }
    App.timer = setTimeout(App.tick, POLL_MS);
  },

  async history(overview) {
    if (!overview.jobs.length) {
      Fleet.fleetHistory((await apiJson("/ui/api/history")).fleet);
      return;
    }
    for (const view of overview.jobs) Fleet.history(view.status.job, await apiJson("/ui/api/history", { job: view.status.job }));
  },

  problems(list) {
    const box = document.getElementById("problems");
    box.hidden = !list.length;
    box.textContent = list.length ? `Not answering: ${list.join(" · ")}` : "";
  },

  live(ok, text) {
    document.getElementById("live-dot").className = ok ? "dot live" : "dot down";
    document.getElementById("updated").textContent = text;
  },

  fail(err) {
    if (err.status === 401 || err.status === 403) {
      Auth.clear();
      App.askToken(err.status === 401 ? "That token was not accepted." : "That token cannot see this.");
    }
    App.live(false, err.message || String(err));
  },
};

document.addEventListener("DOMContentLoaded", App.start);
