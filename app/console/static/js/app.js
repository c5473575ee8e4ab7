// The console's shell: the views by the URL's fragment (#/segments?prefix=...), and the token form.

import * as api from "./api.js";
import { fill, problem } from "./dom.js";
import * as buckets from "./buckets.js";
import * as durable from "./durable.js";
import * as overview from "./overview.js";
import * as readerGroups from "./readergroups.js";
import * as segments from "./segments.js";
import * as streams from "./streams.js";

const VIEWS = {
  overview,
  segments,
  streams,
  "reader-groups": readerGroups,
  buckets,
  "durable-streams": durable,
};

const main = document.getElementById("main");
const form = document.getElementById("token-form");
const input = document.getElementById("token-input");
const status = document.getElementById("token-status");
let cleanup = null;

function current() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const view = VIEWS[path] ? path : "overview";
  return { view, params: new URLSearchParams(query || "") };
}

/** Show the view the fragment names; the one before stops its timers and tails first. */
async function show() {
  if (cleanup) cleanup();
  cleanup = null;
  const { view, params } = current();
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.view === view);
  }
  const stops = [];
  const context = { onStop: (stop) => stops.push(stop), stopped: false };
  cleanup = () => {
    context.stopped = true;
    stops.forEach((stop) => stop());
  };
  fill(main);
  main.dataset.view = view;
  try {
    await VIEWS[view].render(main, params, context);
  } catch (err) {
    if (!context.stopped) main.append(problem(err));
  }
}

function askForToken(message) {
  form.hidden = false;
  status.textContent = message || "";
  input.focus();
}

api.onUnauthorized((err) => askForToken(api.token() ? err.detail : ""));

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  api.setToken(input.value.trim());
  input.value = "";
  try {
    await api.json("/v1/cluster");
    form.hidden = true;
    status.textContent = "";
    show();
  } catch (err) {
    // A token the server does not know: forgotten, the form open with the server's word for it.
    api.setToken("");
    status.textContent = `${err.status || ""} ${err.detail || err.message}`.trim();
  }
});

document.getElementById("token-forget").addEventListener("click", () => {
  api.setToken("");
  status.textContent = "forgotten";
  show();
});

document.getElementById("token-button").addEventListener("click", () => {
  if (form.hidden) askForToken(api.token() ? "a token is in use" : "");
  else form.hidden = true;
});

window.addEventListener("hashchange", show);
show();
