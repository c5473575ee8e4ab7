// Durable Streams: one stream by name (the protocol lists none), its tail offset, configuration
// and first messages, read as the protocol's clients read them.

import * as api from "./api.js";
import { h, note, problem, section, table } from "./dom.js";
import { preview } from "./tail.js";

const PREVIEW_BYTES = 64 * 1024;

export async function render(main, params) {
  const name = params.get("name") || "";
  const input = h("input", { name: "name", value: name, placeholder: "a stream name", size: 40, spellcheck: "false" });
  main.append(
    h("h1", {}, "Durable Streams"),
    h(
      "form",
      { class: "inline", onsubmit: (e) => (e.preventDefault(), (location.hash = `#/durable-streams?${new URLSearchParams({ name: input.value })}`)) },
      input,
      h("button", { type: "submit" }, "Open"),
    ),
  );
  if (!name) return main.append(note("The Durable Streams protocol has no listing: name a stream (/v1/stream/{name}) to see it."));
  const url = `/v1/stream/${api.namePath(name)}`;
  let head;
  let body;
  try {
    head = await api.request(url, { method: "HEAD" });
    body = await api.request(`${url}?offset=-1`);
  } catch (err) {
    return main.append(problem(err));
  }
  const header = (key) => head.headers.get(key) || "–";
  const bytes = new Uint8Array(await body.arrayBuffer());
  main.append(
    section(
      h("span", {}, "Stream ", h("span", { class: "name", id: "durable-name" }, name)),
      table(
        ["tail offset", "content type", "closed", "TTL", "expires"],
        [[header("Stream-Next-Offset"), header("Content-Type"), header("Stream-Closed") === "true" ? "closed" : "open", header("Stream-TTL"), header("Stream-Expires-At")]],
        { id: "durable-info" },
      ),
    ),
    section(
      "From the start",
      h("pre", { class: "preview", id: "durable-preview" }, preview(bytes.subarray(0, PREVIEW_BYTES)).text),
      note(`Read up to ${body.headers.get("Stream-Next-Offset") || "–"}${body.headers.get("Stream-Up-To-Date") === "true" ? ", the tail" : ""}.`),
    ),
  );
}
