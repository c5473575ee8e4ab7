// Segments: a prefix browser over GET /v1/segments (a page at a time), and one segment's state and tail.

import * as api from "./api.js";
import { ago, bytes, count, fill, h, link, note, problem, section, table, time } from "./dom.js";
import { tailView } from "./tail.js";

const PAGE = 100;
const PAGE_MAX = 1000;

export async function render(main, params, context) {
  const name = params.get("name");
  if (name !== null) return detail(main, name, context);
  const limit = Math.min(PAGE_MAX, Math.max(1, Number(params.get("limit")) || PAGE));
  return browse(main, params.get("prefix") || "", params.get("after") || "", limit);
}

/** The prefix as links, one per part: each shows the names under it. */
function crumbs(prefix) {
  const parts = prefix.split("/");
  const out = [link("segments", {}, "all")];
  let so = "";
  parts.forEach((part, i) => {
    if (!part) return;
    so += part + (i < parts.length - 1 ? "/" : "");
    out.push(" / ", link("segments", { prefix: so }, part));
  });
  return h("nav", { class: "crumbs" }, out);
}

/** A name whose parts link to the prefixes they end, and whose last part opens the segment. */
function nameCell(name) {
  const parts = name.split("/");
  const out = [];
  let so = "";
  parts.forEach((part, i) => {
    if (i === parts.length - 1) {
      out.push(link("segments", { name }, part));
    } else {
      so += part + "/";
      out.push(link("segments", { prefix: so }, part), "/");
    }
  });
  return h("span", { class: "name", title: name }, out);
}

async function browse(main, prefix, after, limit) {
  const input = h("input", { name: "prefix", value: prefix, placeholder: "a name prefix: sensors/", spellcheck: "false" });
  const form = h(
    "form",
    {
      class: "inline",
      onsubmit: (event) => {
        event.preventDefault();
        location.hash = `#/segments?${new URLSearchParams({ prefix: input.value })}`;
      },
    },
    input,
    h("button", { type: "submit" }, "List"),
  );
  const results = h("div", { id: "segment-list" });
  main.append(h("h1", {}, "Segments"), form, crumbs(prefix), results);
  let page;
  try {
    page = await api.listSegments(prefix, after, limit);
  } catch (err) {
    fill(results, problem(err));
    if (err.status === 403) results.append(note("This token may list only the names under its grants: enter such a prefix."));
    return;
  }
  const rows = page.segments.map((s) => [
    nameCell(s.name),
    { value: count(s.length), class: "num" },
    { value: count(s.start_offset), class: "num" },
    { value: count(s.storage_length), class: "num" },
    s.sealed ? "sealed" : "open",
    { value: count(s.event_count), class: "num" },
    h("span", { title: time(s.last_modified) }, ago(s.last_modified)),
  ]);
  const pager = h(
    "nav",
    { class: "pager" },
    after ? link("segments", { prefix, limit: limit === PAGE ? "" : limit }, "first page") : null,
    page.next ? link("segments", { prefix, after: page.next, limit: limit === PAGE ? "" : limit }, "next page") : null,
  );
  fill(
    results,
    note(
      after ? `After ${after}: ` : "",
      `${page.segments.length} segment${page.segments.length === 1 ? "" : "s"}${page.next ? ` (a page of ${limit}; more follow)` : ""}.`,
    ),
    table(["name", "length", "start offset", "in Tier 2", "state", "events", "last append"], rows, { id: "segments" }),
    pager,
  );
}

async function detail(main, name, context) {
  const slash = name.lastIndexOf("/");
  main.append(h("h1", {}, "Segment ", h("span", { class: "name", id: "segment-name" }, name)), crumbs(name.slice(0, slash + 1)));
  let info;
  try {
    info = await api.json(api.segmentUrl(name, ":info"));
  } catch (err) {
    main.append(problem(err));
    return;
  }
  main.append(
    section(
      "State",
      table(
        ["length", "start offset", "in Tier 2", "state", "events", "created", "last append"],
        [
          [
            count(info.length),
            count(info.start_offset),
            count(info.storage_length),
            info.sealed ? "sealed" : "open",
            count(info.event_count),
            time(info.created),
            time(info.last_modified),
          ],
        ],
        { id: "segment-info" },
      ),
      note(`Readable: ${bytes(info.length - info.start_offset)}; not yet in Tier 2: ${bytes(info.length - info.storage_length)}.`),
    ),
    section("Writers and attributes", lookups(name)),
    tailView(name, info, context),
  );
}

/** Writers and attributes are looked up by id (the API lists neither): a form for each. */
function lookups(name) {
  const writer = h("input", { placeholder: "writer id (a UUID)", size: 38, spellcheck: "false" });
  const keys = h("input", { placeholder: "attribute keys (UUIDs, comma-separated)", size: 50, spellcheck: "false" });
  const out = h("div", { class: "lookup-result" });
  const ask = async (path) => {
    try {
      const answer = await api.json(path);
      const rows = answer.attributes
        ? Object.entries(answer.attributes).map(([k, v]) => [k, v === null ? "none" : count(v)])
        : [[answer.writer_id, answer.event_number === null ? "none" : count(answer.event_number)]];
      fill(out, table([answer.attributes ? "key" : "writer", answer.attributes ? "value" : "last event number"], rows));
    } catch (err) {
      fill(out, problem(err));
    }
  };
  return h(
    "div",
    {},
    h(
      "form",
      { class: "inline", onsubmit: (e) => (e.preventDefault(), ask(api.segmentUrl(name, `:writers/${encodeURIComponent(writer.value.trim())}`))) },
      writer,
      h("button", { type: "submit" }, "Writer's last event"),
    ),
    h(
      "form",
      {
        class: "inline",
        onsubmit: (e) => (e.preventDefault(), ask(`${api.segmentUrl(name, ":attributes")}?${new URLSearchParams({ keys: keys.value.replace(/\s+/g, "") })}`)),
      },
      keys,
      h("button", { type: "submit" }, "Attribute values"),
    ),
    out,
  );
}
