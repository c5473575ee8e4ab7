// Overview: the nodes, each container's owner and state, and what this node does (from /metrics).

import * as api from "./api.js";
import { Rates, lineChart } from "./charts.js";
import { bytes, count, fill, h, note, problem, rate, section, table } from "./dom.js";

const EVERY_MS = 2000;
const WINDOW_S = 300;
// The charts survive a visit to another view: their history is the last minutes, not the last visit.
const series = {
  appends: new Rates(WINDOW_S),
  bytes: new Rates(WINDOW_S),
  reads: new Rates(WINDOW_S),
  throttled: new Rates(WINDOW_S),
};

export async function render(main, params, context) {
  const nodes = h("div", { id: "overview-cluster" });
  const live = h("div", { id: "overview-live" });
  main.append(h("h1", {}, "Overview"), nodes, live);
  let cluster = null;
  async function tick() {
    try {
      const [map, health, metrics] = await Promise.all([
        api.json("/v1/cluster"),
        api.json("/healthz", { ok: [503] }),
        api.metrics(),
      ]);
      if (context.stopped) return;
      cluster = map;
      const t = Date.now() / 1000;
      series.appends.push(t, api.total(metrics, "segstore_appends_total"));
      series.bytes.push(t, api.total(metrics, "segstore_append_bytes_total"));
      series.reads.push(t, api.total(metrics, "segstore_read_bytes_total"));
      series.throttled.push(t, api.total(metrics, "segstore_throttled_requests_total"));
      fill(nodes, clusterView(cluster, health, metrics));
      fill(live, liveView(metrics));
    } catch (err) {
      if (!context.stopped) fill(live, problem(err));
    }
  }
  await tick();
  const timer = setInterval(tick, EVERY_MS);
  context.onStop(() => clearInterval(timer));
  return cluster;
}

function clusterView(cluster, health, metrics) {
  const states = new Map((health.containers || []).map((c) => [c.id, c]));
  const lag = new Map((metrics.segstore_writer_lag_bytes || []).map((s) => [Number(s.labels.container), s.value]));
  const here = cluster.node;
  const owned = new Map();
  for (const c of cluster.containers) owned.set(c.owner, (owned.get(c.owner) || 0) + 1);
  const summary = h(
    "div",
    { class: "tiles" },
    tile("this node", here === null ? "single node" : here),
    tile("health", health.status),
    tile("nodes", here === null ? 1 : cluster.nodes.length),
    tile("containers", cluster.container_count),
  );
  const nodeRows = cluster.nodes.map((n) => [
    n.id === here ? h("span", {}, n.id, " ", h("em", {}, "(this node)")) : n.id,
    n.url,
    { value: count(owned.get(n.id) || 0), class: "num" },
  ]);
  const containerRows = cluster.containers.map((c) => {
    const state = states.get(c.id);
    const served = here === null || c.owner === here;
    return [
      { value: String(c.id), class: "num" },
      c.owner === null ? (here === null ? "this node" : "none") : c.owner,
      state ? `${state.state}${state.reason ? ` (${state.reason})` : ""}` : served ? "–" : "on its owner",
      { value: lag.has(c.id) ? bytes(lag.get(c.id)) : "–", class: "num" },
    ];
  });
  return [
    summary,
    here === null ? null : section("Nodes", table(["node", "url", "containers"], nodeRows, { id: "nodes" })),
    section(
      "Containers",
      note("State and Tier 2 lag (acknowledged bytes not yet in Tier 2) are this node's; the owner's node shows its own."),
      table(["container", "owner", "state", "Tier 2 lag"], containerRows, { id: "containers" }),
    ),
  ];
}

function liveView(metrics) {
  const throttled = (metrics.segstore_throttled_requests_total || []).filter((s) => s.value > 0);
  const writes = metrics.segstore_tier1_write_seconds_count;
  const writeSum = api.total(metrics, "segstore_tier1_write_seconds_sum");
  const writeCount = api.total(metrics, "segstore_tier1_write_seconds_count");
  return section(
    "This node, live",
    h(
      "div",
      { class: "charts" },
      lineChart("appends", series.appends.points, WINDOW_S, (v) => rate(v, "appends")),
      lineChart("bytes appended", series.bytes.points, WINDOW_S, (v) => `${bytes(v)}/s`),
      lineChart("bytes read", series.reads.points, WINDOW_S, (v) => `${bytes(v)}/s`),
      lineChart("requests throttled", series.throttled.points, WINDOW_S, (v) => rate(v, "req")),
    ),
    h(
      "div",
      { class: "tiles" },
      tile("Tier 2 lag", bytes(api.total(metrics, "segstore_writer_lag_bytes"))),
      tile("Tier 1 writes", writes ? count(writeCount) : "–"),
      tile("mean Tier 1 write", writeCount ? `${((1000 * writeSum) / writeCount).toFixed(2)} ms` : "–"),
      tile("read cache", bytes(api.total(metrics, "segstore_cache_bytes"))),
      tile("leases held", metrics.segstore_cluster_leases_held ? count(api.total(metrics, "segstore_cluster_leases_held")) : "–"),
      tile("lease renewal errors", count(api.total(metrics, "segstore_cluster_lease_renewal_errors_total") ?? 0)),
      tile("open live tails", count(api.total(metrics, "segstore_event_streams") ?? 0)),
      tile("throttled", throttled.length ? throttled.map((s) => `${s.labels.reason}: ${count(s.value)}`).join(", ") : "none"),
    ),
  );
}

function tile(label, value) {
  return h("div", { class: "tile" }, h("span", {}, label), h("strong", {}, String(value)));
}
