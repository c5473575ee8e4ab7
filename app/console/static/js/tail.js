// A segment's tail, followed live with long-polls (GET ?offset=o&wait=s), events decoded when framed.

import * as api from "./api.js";
import { count, fill, h, section } from "./dom.js";

const WAIT_S = 20;
const READ_BYTES = 256 * 1024;
const SHOWN = 200;
const PREVIEW = 512;
// A frame longer than this is no frame of segstore's (appends are at most a few MiB): raw bytes.
const FRAME_MAX = 64 * 1024 * 1024;

/**
 * Split ``bytes`` into frames (a 4-byte big-endian length, then the payload), from ``offset``:
 * {events: [{offset, payload}], rest} where ``rest`` is an incomplete last frame; null when the
 * bytes are not frames.
 */
export function frames(bytes, offset) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const events = [];
  let at = 0;
  while (at + 4 <= bytes.length) {
    const size = view.getUint32(at);
    if (size > FRAME_MAX) return null;
    if (at + 4 + size > bytes.length) break;
    events.push({ offset: offset + at, payload: bytes.subarray(at + 4, at + 4 + size) });
    at += 4 + size;
  }
  return { events, rest: bytes.subarray(at) };
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Bytes as text when they are printable UTF-8, else as hex; at most PREVIEW bytes. */
export function preview(bytes) {
  const cut = bytes.subarray(0, PREVIEW);
  const more = bytes.length > PREVIEW ? ` … (${count(bytes.length)} bytes)` : "";
  try {
    const text = utf8.decode(cut);
    if (!/[\u0000-\u0008\u000e-\u001f\u007f]/.test(text)) return { text: text + more, kind: "text" };
  } catch {
    // not UTF-8 (or cut inside a character): hex below
  }
  const hex = Array.from(cut.subarray(0, 64), (b) => b.toString(16).padStart(2, "0")).join(" ");
  return { text: hex + (bytes.length > 64 ? ` … (${count(bytes.length)} bytes)` : ""), kind: "hex" };
}

function concat(a, b) {
  if (!a.length) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

export function tailView(name, info, context) {
  const from = h("select", {}, h("option", { value: "end" }, "from the end"), h("option", { value: "start" }, "from the start offset"));
  const mode = h(
    "select",
    {},
    h("option", { value: "auto" }, "decode frames when framed"),
    h("option", { value: "frames" }, "always as frames"),
    h("option", { value: "raw" }, "raw bytes"),
  );
  const button = h("button", { type: "button", id: "tail-toggle" }, "Follow");
  const state = h("span", { id: "tail-state", role: "status" }, "stopped");
  const list = h("ol", { id: "tail", class: "tail" });
  let controller = null;

  const stop = (why) => {
    if (controller) controller.abort();
    controller = null;
    button.textContent = "Follow";
    state.textContent = why;
  };
  context.onStop(() => stop("stopped"));

  const show = (offset, bytes, framed) => {
    const { text, kind } = preview(bytes);
    list.append(
      h(
        "li",
        { class: kind },
        h("span", { class: "offset" }, `@${count(offset)}`),
        h("span", { class: "size" }, `${count(bytes.length)} B${framed ? " event" : ""}`),
        h("code", {}, text),
      ),
    );
    while (list.childElementCount > SHOWN) list.firstElementChild.remove();
  };

  async function follow(signal) {
    const start = await api.json(api.segmentUrl(name, ":info"));
    let offset = from.value === "start" ? start.start_offset : start.length;
    let framed = mode.value === "raw" ? false : mode.value === "frames" ? true : null;
    let pending = new Uint8Array(0);
    let pendingAt = offset;
    fill(list);
    while (!signal.aborted) {
      state.textContent = `following at offset ${count(offset)}`;
      const query = new URLSearchParams({ offset: String(offset), wait: String(WAIT_S), length: String(READ_BYTES) });
      let answer;
      try {
        answer = await api.request(`${api.segmentUrl(name)}?${query}`, { signal, ok: [204, 410] });
      } catch (err) {
        if (signal.aborted) return;
        throw err;
      }
      if (answer.status === 410) {
        offset = pendingAt = Number(answer.headers.get("Segment-Start-Offset"));
        pending = new Uint8Array(0);
        continue;
      }
      const next = Number(answer.headers.get("Segment-Next-Offset"));
      if (answer.status === 204) {
        if (answer.headers.get("Segment-Sealed") === "true") return stop(`sealed at ${count(next)}: the end`);
        continue;
      }
      const bytes = new Uint8Array(await answer.arrayBuffer());
      offset = next;
      if (framed === false) {
        show(offset - bytes.length, bytes, false);
        continue;
      }
      const parsed = frames(concat(pending, bytes), pendingAt);
      if (framed === null) framed = parsed !== null && parsed.rest.length === 0 && parsed.events.length > 0;
      if (!framed || parsed === null) {
        framed = false;
        show(pendingAt, concat(pending, bytes), false);
        pending = new Uint8Array(0);
        pendingAt = offset;
        continue;
      }
      parsed.events.forEach((e) => show(e.offset, e.payload, true));
      pending = parsed.rest;
      pendingAt = offset - pending.length;
    }
  }

  button.addEventListener("click", () => {
    if (controller) return stop("stopped");
    controller = new AbortController();
    button.textContent = "Stop";
    const mine = controller;
    follow(mine.signal).catch((err) => {
      if (controller === mine) stop(`${err.status || ""} ${err.detail || err.message}`.trim());
    });
  });

  return section(
    "Tail",
    h("div", { class: "inline" }, from, mode, button, state),
    h("p", { class: "note" }, `Long-polls the segment (up to ${WAIT_S} s each); events are 4-byte length frames.`),
    list,
    info.sealed ? h("p", { class: "note" }, "This segment is sealed: following it reads to its end.") : null,
  );
}
