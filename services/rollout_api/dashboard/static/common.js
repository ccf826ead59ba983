// Shared helpers: the token, authenticated fetch, number formats, tiny DOM builders.
"use strict";

const TOKEN_KEY = "rollout-dashboard-token";

const Auth = {
  token() { return sessionStorage.getItem(TOKEN_KEY); },
  set(token) { sessionStorage.setItem(TOKEN_KEY, token); },
  clear() { sessionStorage.removeItem(TOKEN_KEY); },
  // `make run` prints /ui/#token=...: take it, then drop it from the address bar
  fromFragment() {
    const match = location.hash.match(/token=([^&]+)/);
    if (match) {
      Auth.set(decodeURIComponent(match[1]));
      history.replaceState(null, "", location.pathname + "#/fleet");
    }
  },
};

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

async function api(path, params) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const response = await fetch(url, { headers: { Authorization: `Bearer ${Auth.token()}` } });
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, body);
  }
  return response;
}

async function apiJson(path, params) { return (await api(path, params)).json(); }

// Number formats. The browser test formats the API's answers the same way (tests/dashboard).
const Fmt = {
  none: "–",
  int(v) { return v === null || v === undefined ? Fmt.none : Math.round(v).toLocaleString("en-US"); },
  secs(v) { return v === null || v === undefined ? Fmt.none : v.toFixed(2); },
  pct(v) { return v === null || v === undefined ? Fmt.none : (v * 100).toFixed(1); },
  num(v, digits = 2) { return v === null || v === undefined ? Fmt.none : v.toFixed(digits); },
  ago(t) {
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 60) return `${Math.round(s)} s ago`;
    if (s < 3600) return `${Math.round(s / 60)} min ago`;
    return `${(s / 3600).toFixed(1)} h ago`;
  },
  clock(t) { return new Date(t * 1000).toLocaleTimeString("en-GB"); },
};

// el("div.card#x", {title: "t"}, child, "text") -> HTMLElement
function el(spec, attrs, ...children) {
  const [, tag, rest] = spec.match(/^([a-z0-9]+)(.*)$/i);
  const node = document.createElement(tag);
  for (const part of rest.match(/[.#][^.#]+/g) || []) {
    if (part[0] === ".") node.classList.add(part.slice(1)); else node.id = part.slice(1);
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "style" && typeof v === "object") Object.assign(node.style, v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// a weight version as shown: "v3" for the integer versions trainers publish, the name otherwise
function ver(v) {
  if (v === null || v === undefined || v === "") return Fmt.none;
  return /^\d+$/.test(String(v)) ? `v${v}` : String(v);
}

// replaceChildren without the nulls (the DOM would print them as "null")
function fill(node, ...children) { node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false)); }

const STATUS_CLASS = { completed: "ok", truncated: "warn", infra_error: "bad", cancelled: "muted" };

function badge(status, extra) {
  return el(`span.badge.${STATUS_CLASS[status] || "muted"}`, { dataset: { status } }, status, extra ? ` · ${extra}` : "");
}

function kpi(key, label, value, unit, hint) {
  return el("div.kpi", { dataset: { kpi: key }, title: hint || null },
    el("div.kpi-label", {}, label),
    el("div.kpi-line", {}, el("span.kpi-value", {}, value), unit ? el("span.kpi-unit", {}, unit) : null));
}
