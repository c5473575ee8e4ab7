// Talking to segstore: the public HTTP API and /metrics, with the tab's bearer token.

const TOKEN_KEY = "segstore.console.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An answer the page cannot use: the problem+json of the server, or the status alone. */
export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.code = code;
    this.detail = detail || `HTTP ${status}`;
  }
}

const listeners = [];

/** Called with every 401, so the page can ask for a token. */
export function onUnauthorized(listener) {
  listeners.push(listener);
}

/** A request with the token; throws ApiError on any status outside 2xx and ``ok``. */
export async function request(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (token()) headers.set("Authorization", `Bearer ${token()}`);
  const answer = await fetch(path, { ...options, headers, cache: "no-store" });
  const ok = options.ok || [];
  if (answer.ok || ok.includes(answer.status)) return answer;
  let code = "";
  let detail = "";
  try {
    const body = await answer.json();
    code = body.code || "";
    detail = body.detail || body.title || "";
  } catch {
    detail = answer.statusText;
  }
  const err = new ApiError(answer.status, code, detail);
  if (answer.status === 401) listeners.forEach((listener) => listener(err));
  throw err;
}

export async function json(path, options) {
  const answer = await request(path, options);
  return answer.status === 204 ? null : answer.json();
}

/** A segment name or a stream's path in a URL: each part percent-encoded, the slashes kept. */
export function namePath(name) {
  return name.split("/").map(encodeURIComponent).join("/");
}

export const segmentUrl = (name, suffix = "") => `/v1/segments/${namePath(name)}${suffix}`;

export const streamUrl = (scope, stream, suffix = "") =>
  `/v1/scopes/${encodeURIComponent(scope)}/streams/${encodeURIComponent(stream)}${suffix}`;

/** One page of ``GET /v1/segments``. */
export function listSegments(prefix, after, limit) {
  const query = new URLSearchParams({ prefix, limit: String(limit) });
  if (after) query.set("after", after);
  return json(`/v1/segments?${query}`);
}

/**
 * Prometheus text as {name: [{labels, value}]}. Only what the console charts and counts is kept:
 * names without ``_bucket`` (histogram buckets are many and unused here).
 */
export function parseMetrics(text) {
  const found = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match || match[1].endsWith("_bucket")) continue;
    const labels = {};
    for (const pair of (match[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    (found[match[1]] ||= []).push({ labels, value: Number(match[4]) });
  }
  return found;
}

/** The sum of a metric's samples (every label), or null when the node has none. */
export function total(metrics, name) {
  const samples = metrics[name];
  return samples ? samples.reduce((sum, s) => sum + s.value, 0) : null;
}

export async function metrics() {
  const answer = await request("/metrics");
  return parseMetrics(await answer.text());
}
