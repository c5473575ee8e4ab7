// Streams: scopes and their streams; a stream's epochs as key-range bands, its current segments' rates.

import * as api from "./api.js";
import { bytes, count, fill, h, link, note, problem, rate, section, svg, table, time } from "./dom.js";

// The epochs drawn: the latest ones, each a request (GET .../segments?epoch=E).
const EPOCHS_SHOWN = 40;
const EVERY_MS = 3000;

export async function render(main, params, context) {
  const scope = params.get("scope");
  const stream = params.get("stream");
  if (scope && stream) return streamView(main, scope, stream, context);
  if (scope) return scopeView(main, scope);
  return scopesView(main);
}

function scopeForm() {
  const input = h("input", { placeholder: "a scope", spellcheck: "false" });
  return h(
    "form",
    { class: "inline", onsubmit: (e) => (e.preventDefault(), (location.hash = `#/streams?${new URLSearchParams({ scope: input.value.trim() })}`)) },
    input,
    h("button", { type: "submit" }, "Open scope"),
  );
}

async function scopesView(main) {
  main.append(h("h1", {}, "Streams"), scopeForm());
  let scopes;
  try {
    scopes = (await api.json("/v1/scopes")).scopes;
  } catch (err) {
    main.append(problem(err));
    if (err.status === 403) main.append(note("Listing scopes needs read on every name: open a scope this token reads."));
    return;
  }
  if (!scopes.length) return main.append(note("No scopes yet: PUT /v1/scopes/{scope} creates one."));
  const rows = await Promise.all(
    scopes.map(async (scope) => {
      const names = await api.json(`/v1/scopes/${encodeURIComponent(scope)}/streams`).then(
        (answer) => answer.streams.map((s) => (typeof s === "string" ? s : s.stream)),
        (err) => err,
      );
      const streams = Array.isArray(names)
        ? names.map((stream, i) => [i ? ", " : "", link("streams", { scope, stream }, stream)])
        : `${names.status || ""} ${names.detail || names.message}`;
      return [link("streams", { scope }, scope), streams];
    }),
  );
  main.append(section("Scopes", table(["scope", "streams"], rows, { id: "scopes" })));
}

async function scopeView(main, scope) {
  main.append(h("h1", {}, "Scope ", h("span", { class: "name" }, scope)), h("nav", { class: "crumbs" }, link("streams", {}, "all scopes")));
  const answer = await api.json(`/v1/scopes/${encodeURIComponent(scope)}/streams`);
  const names = answer.streams.map((s) => (typeof s === "string" ? s : s.stream));
  const rows = await Promise.all(
    names.slice(0, 200).map(async (stream) => {
      const s = await api.json(api.streamUrl(scope, stream)).catch((err) => ({ state: err.detail, epoch: null, config: {} }));
      const policy = s.config.scaling ? policyText(s.config.scaling) : "–";
      return [link("streams", { scope, stream }, stream), s.state, s.epoch === null ? "–" : count(s.epoch), policy];
    }),
  );
  main.append(names.length ? table(["stream", "state", "epoch", "scaling"], rows, { id: "streams" }) : note("No streams in this scope."));
  if (names.length > 200) main.append(note(`The first 200 of ${count(names.length)} streams.`));
}

function policyText(scaling) {
  if (scaling.type === "fixed") return `fixed, at least ${scaling.min_segments ?? 1} segment(s)`;
  const unit = scaling.type === "events_per_s" ? "events/s" : "KiB/s";
  return `${scaling.type}: target ${scaling.target} ${unit} a segment, factor ${scaling.factor}, at least ${scaling.min_segments}`;
}

async function streamView(main, scope, stream, context) {
  main.append(
    h("h1", {}, "Stream ", h("span", { class: "name", id: "stream-name" }, `${scope}/${stream}`)),
    h("nav", { class: "crumbs" }, link("streams", {}, "all scopes"), " / ", link("streams", { scope }, scope)),
  );
  const info = await api.json(api.streamUrl(scope, stream));
  const first = Math.max(0, info.epoch - EPOCHS_SHOWN + 1);
  const epochs = await Promise.all(
    Array.from({ length: info.epoch - first + 1 }, (_, i) => api.json(api.streamUrl(scope, stream, `/segments?epoch=${first + i}`))),
  );
  const ids = [...new Set(epochs.flatMap((e) => e.segments.map((s) => s.name)))];
  const infos = new Map(
    await Promise.all(ids.map((name) => api.json(api.segmentUrl(name, ":info")).then((i) => [name, i], () => [name, null]))),
  );
  const current = epochs[epochs.length - 1].segments;
  const rates = h("div", { id: "stream-segments" });
  main.append(
    section(
      "State and policy",
      table(
        ["state", "epoch", "segments now", "scaling", "pending scale"],
        [[info.state, count(info.epoch), count(current.length), policyText(info.config.scaling), info.pending_scale ? JSON.stringify(info.pending_scale) : "none"]],
        { id: "stream-info" },
      ),
    ),
    section(
      "Epochs",
      note("Each column is an epoch, each band a segment's key range [lo, hi) from 0 (top) to 1 (bottom): a split or merge starts a new epoch."),
      bands(epochs, infos),
      first > 0 ? note(`The latest ${EPOCHS_SHOWN} epochs of ${count(info.epoch + 1)}.`) : null,
    ),
    section("Current segments", rates),
  );
  let before = null;
  async function tick() {
    const now = await Promise.all(current.map((s) => api.json(api.segmentUrl(s.name, ":info")).catch(() => null)));
    if (context.stopped) return;
    const t = Date.now() / 1000;
    const rows = current.map((s, i) => {
      const seg = now[i];
      const old = before && before.infos[i];
      const dt = before ? t - before.t : 0;
      const byteRate = seg && old && dt > 0 ? (seg.length - old.length) / dt : null;
      const eventRate = seg && old && dt > 0 ? (seg.event_count - old.event_count) / dt : null;
      return [
        link("segments", { name: s.name }, String(s.id)),
        `[${s.key_lo.toFixed(4)}, ${s.key_hi.toFixed(4)})`,
        { value: seg ? bytes(seg.length) : "–", class: "num" },
        { value: seg ? count(seg.event_count) : "–", class: "num" },
        { value: byteRate === null ? "…" : `${bytes(byteRate)}/s`, class: "num" },
        { value: eventRate === null ? "…" : rate(eventRate, "events"), class: "num" },
      ];
    });
    before = { t, infos: now };
    fill(rates, table(["segment", "key range", "length", "events", "bytes/s", "events/s"], rows, { id: "current-segments" }));
  }
  await tick();
  const timer = setInterval(() => tick().catch((err) => fill(rates, problem(err))), EVERY_MS);
  context.onStop(() => clearInterval(timer));
}

const W = 760;
const H = 240;
const LABEL = 18;

/** The epochs as an SVG: a column per epoch, a band per segment spanning the epochs it was current. */
function bands(epochs, infos) {
  const columns = epochs.length;
  const cw = W / columns;
  const spans = new Map();
  epochs.forEach((epoch, col) => {
    for (const s of epoch.segments) {
      const span = spans.get(s.id);
      if (span && span.last === col - 1) span.last = col;
      else spans.set(s.id, { segment: s, first: col, last: col });
    }
  });
  const shapes = [...spans.values()].map(({ segment, first, last }) => {
    const x = first * cw + 1;
    const y = segment.key_lo * H;
    const w = (last - first + 1) * cw - 2;
    const bh = Math.max(1, (segment.key_hi - segment.key_lo) * H - 1);
    const seg = infos.get(segment.name);
    const tip = `segment ${segment.id} (${segment.name}): keys [${segment.key_lo}, ${segment.key_hi}), epochs ${epochs[first].epoch}–${epochs[last].epoch}${seg ? `, ${seg.length} bytes${seg.sealed ? ", sealed" : ""}` : ""}`;
    return svg(
      "g",
      { class: "band", "data-segment": segment.id },
      svg("rect", { x, y, width: Math.max(1, w), height: bh, fill: `hsl(${(segment.id * 67) % 360} 55% 62%)` }, svg("title", {}, tip)),
      bh > 14 && w > 16 ? svg("text", { x: x + 4, y: y + 13 }, String(segment.id)) : null,
    );
  });
  const labels = epochs.map((epoch, col) => {
    const born = epoch.segments.map((s) => infos.get(s.name)?.created).filter(Boolean).sort().pop();
    return svg("text", { x: col * cw + 2, y: H + 13, class: "epoch" }, String(epoch.epoch), svg("title", {}, born ? `epoch ${epoch.epoch}, from ${time(born)}` : `epoch ${epoch.epoch}`));
  });
  return svg("svg", { viewBox: `0 0 ${W} ${H + LABEL}`, class: "bands", id: "epochs", role: "img", "aria-label": "epochs" }, ...shapes, ...labels);
}
