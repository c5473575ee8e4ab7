// Small SVG charts drawn here (no charting library): a live line over the last minutes.

import { h, svg } from "./dom.js";

const WIDTH = 480;
const HEIGHT = 120;
const PAD = 4;

const SPAN_MIN_S = 60;

/**
 * A chart of ``points`` ([seconds since epoch, value]) over the last ``windowS`` at most (the time
 * since the first point, one minute at least); ``format`` labels the values.
 */
export function lineChart(title, points, windowS, format) {
  const now = Date.now() / 1000;
  const span = points.length ? Math.min(windowS, Math.max(SPAN_MIN_S, now - points[0][0])) : SPAN_MIN_S;
  const shown = points.filter(([t]) => t >= now - span);
  const top = Math.max(0, ...shown.map(([, v]) => v));
  const max = top || 1;
  const x = (t) => PAD + ((t - (now - span)) / span) * (WIDTH - 2 * PAD);
  const y = (v) => HEIGHT - PAD - (v / max) * (HEIGHT - 2 * PAD);
  const line = shown.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  const last = shown.length ? shown[shown.length - 1][1] : null;
  return h(
    "figure",
    { class: "chart" },
    h("figcaption", {}, h("span", {}, title), h("strong", {}, last === null ? "–" : format(last))),
    svg(
      "svg",
      { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, preserveAspectRatio: "none", role: "img", "aria-label": title },
      svg("line", { x1: 0, x2: WIDTH, y1: HEIGHT - PAD, y2: HEIGHT - PAD, class: "axis" }),
      shown.length > 1 ? svg("polyline", { points: line, class: "series" }) : null,
    ),
    h("div", { class: "scale" }, h("span", {}, span < 120 ? `${Math.round(span)} s ago` : `${Math.round(span / 60)} min ago`), h("span", {}, `max ${format(top)}`), h("span", {}, "now")),
  );
}

/** Samples of counters turned into rates: ``push`` a total, read the per-second series. */
export class Rates {
  constructor(keep) {
    this.keep = keep;
    this.last = null;
    this.points = [];
  }

  push(t, value) {
    if (value === null) return;
    if (this.last && t > this.last[0] && value >= this.last[1]) {
      this.points.push([t, (value - this.last[1]) / (t - this.last[0])]);
      if (this.points.length > this.keep) this.points.shift();
    }
    this.last = [t, value];
  }

  latest() {
    return this.points.length ? this.points[this.points.length - 1][1] : null;
  }
}
