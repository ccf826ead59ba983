// Time-series charts (uPlot, vendored under static/vendor with its MIT licence).
"use strict";

const PALETTE = ["#60a5fa", "#f59e0b", "#34d399", "#f472b6", "#a78bfa", "#f87171", "#22d3ee", "#facc15"];
const AXIS = { stroke: "#8b93a7", grid: { stroke: "#232a3b", width: 1 }, ticks: { stroke: "#232a3b" } };

const Charts = {
  instances: new Map(),

  // series: [{label, values, color?, fill?}]; times in unix seconds
  draw(container, times, series, opts = {}) {
    const key = container.id || container.dataset.chart;
    const width = Math.max(240, container.clientWidth - 8);
    const height = opts.height || 170;
    const data = [times, ...series.map((s) => s.values)];
    const existing = Charts.instances.get(key);
    if (existing && existing.series.length === series.length + 1 && existing.root.isConnected) {
      if (existing.width !== width) existing.setSize({ width, height });
      existing.setData(data);
      return existing;
    }
    if (existing) existing.destroy();
    container.textContent = "";
    const chart = new uPlot({
      width, height,
      cursor: { drag: { x: false, y: false } },
      legend: { show: true, live: false },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [{ ...AXIS, space: 60 }, { ...AXIS, size: 52, values: (u, ticks) => ticks.map(compact) }],
      series: [{}, ...series.map((s, i) => ({
        label: s.label,
        stroke: s.color || PALETTE[i % PALETTE.length],
        width: 1.6,
        fill: s.fill ? (s.color || PALETTE[i % PALETTE.length]) + "22" : undefined,
        spanGaps: true,
        points: { show: false },
      }))],
    }, data, container);
    Charts.instances.set(key, chart);
    return chart;
  },

  empty(container, text) {
    const key = container.id || container.dataset.chart;
    const existing = Charts.instances.get(key);
    if (existing) { existing.destroy(); Charts.instances.delete(key); }
    container.textContent = "";
    container.append(el("div.chart-empty", {}, text));
  },
};

function compact(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(a < 1 ? 2 : 1);
}

// Rate per hour of a cumulative counter over a trailing window (default 60 s), so one sample's
// burst of finishes does not draw a spike.
function ratePerHour(samples, field, windowS = 60) {
  const out = [];
  let j = 0;
  for (let i = 0; i < samples.length; i++) {
    while (j < i && samples[i].t - samples[j].t > windowS) j++;
    const dt = samples[i].t - samples[j].t;
    const dv = samples[i][field] - samples[j][field];
    out.push(i > 0 && dt > 0 && dv >= 0 ? (dv / dt) * 3600 : null);
  }
  return out;
}
