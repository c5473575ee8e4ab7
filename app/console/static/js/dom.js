// Building the page: every name and value goes in as text (textContent), never as markup.

/** An element: h("td", {class: "num"}, "12", child, ...). Strings become text nodes. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An SVG element (charts and bands); attributes only, no markup. */
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children) {
    if (child === undefined || child === null) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace the children of ``el``. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A link to a view of the console: ``#/segments?prefix=...``. */
export function link(view, params, ...children) {
  return h("a", { href: route(view, params) }, ...children);
}

export function route(view, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return `#/${view}${text ? "?" + text : ""}`;
}

/** A table: headers, then rows of cells (a cell is text, a node, a list of them, or {value, class}). */
export function table(headers, rows, attrs) {
  return h(
    "table",
    attrs || {},
    h("thead", {}, h("tr", {}, headers.map((title) => h("th", {}, title)))),
    h(
      "tbody",
      {},
      rows.map((cells) =>
        h(
          "tr",
          {},
          cells.map((cell) =>
            cell !== null && typeof cell === "object" && !(cell instanceof Node) && !Array.isArray(cell)
              ? h("td", { class: cell.class }, cell.value)
              : h("td", {}, cell),
          ),
        ),
      ),
    ),
  );
}

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

/** An error box: the server's problem detail, or what went wrong in the page. */
export function problem(err) {
  const status = err && err.status ? `${err.status} ${err.code || ""}`.trim() : "error";
  return h("div", { class: "problem", role: "alert" }, h("strong", {}, status), " ", String(err.detail || err.message || err));
}

export function note(...children) {
  return h("p", { class: "note" }, ...children);
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${UNITS[unit]}`;
}

export function count(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Number(n).toLocaleString("en-US");
}

export function rate(n, unit) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const shown = n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2);
  return `${shown} ${unit}/s`;
}

export function time(iso) {
  if (!iso) return "–";
  const when = new Date(iso);
  return Number.isNaN(when.getTime()) ? String(iso) : when.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function ago(iso) {
  const when = new Date(iso).getTime();
  if (Number.isNaN(when)) return "–";
  const s = Math.max(0, (Date.now() - when) / 1000);
  if (s < 90) return `${s.toFixed(0)} s ago`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
  if (s < 129600) return `${(s / 3600).toFixed(0)} h ago`;
  return `${(s / 86400).toFixed(0)} d ago`;
}
