// Reader groups: a group's readers, their segments, positions and lag, its pending checkpoint, and the
// segments unassigned or waiting for their predecessors (GET /v1/scopes/{scope}/reader-groups/{group}).
// The API lists no scope's groups: the page opens one by name.

import * as api from "./api.js";
import { count, h, link, note, problem, section, table } from "./dom.js";

export async function render(main, params) {
  const scope = params.get("scope") || "";
  const group = params.get("group") || "";
  const scopeInput = h("input", { name: "scope", value: scope, placeholder: "scope", spellcheck: "false" });
  const groupInput = h("input", { name: "group", value: group, placeholder: "reader group", spellcheck: "false" });
  const open = (e) => {
    e.preventDefault();
    location.hash = `#/reader-groups?${new URLSearchParams({ scope: scopeInput.value.trim(), group: groupInput.value.trim() })}`;
  };
  main.append(
    h("h1", {}, "Reader groups"),
    h("form", { class: "inline", onsubmit: open }, scopeInput, groupInput, h("button", { type: "submit" }, "Open")),
  );
  if (!scope || !group) return main.append(note("Name a scope and a reader group of it to see its readers, positions and lag."));
  const path = `/v1/scopes/${encodeURIComponent(scope)}/reader-groups/${encodeURIComponent(group)}`;
  let state;
  try {
    state = await api.json(path);
  } catch (err) {
    if (err.status !== 404) return main.append(problem(err));
    return main.append(h("p", { class: "empty", id: "no-reader-group" }, "No such reader group: ", err.detail));
  }
  main.append(...groupView(state));
}

const segmentLink = (name) => link("segments", { name }, name);

const offset = (value) => ({ value: count(value), class: "num" });

function groupView(state) {
  const streams = state.streams.map((stream, i) => [i ? ", " : "", link("streams", { scope: state.scope, stream }, stream)]);
  const readers = state.readers.map((r) => [
    r.reader,
    offset(r.generation),
    offset(Object.keys(r.segments).length),
    offset(r.lag_bytes),
  ]);
  const positions = state.readers.flatMap((r) =>
    Object.entries(r.segments).map(([segment, at]) => [
      r.reader,
      segmentLink(segment),
      offset(at),
      r.releasing.includes(segment) ? "releasing" : "",
    ]),
  );
  const unassigned = Object.entries(state.unassigned).map(([segment, at]) => [segmentLink(segment), offset(at)]);
  const waiting = state.waiting.map((w) => [
    segmentLink(w.segment),
    w.predecessors.map((p, i) => [i ? ", " : "", segmentLink(p)]),
  ]);
  return [
    section(
      "Group",
      table(
        ["scope", "group", "streams", "lease", "pending checkpoint"],
        [[state.scope, state.group, streams, `${state.lease_s} s`, state.checkpoint ?? "none"]],
        { id: "group-info" },
      ),
    ),
    section(
      "Readers",
      readers.length
        ? table(["reader", "generation", "segments", "lag (bytes)"], readers, { id: "readers" })
        : note("No readers: every segment waits unassigned."),
    ),
    section(
      "Committed positions",
      positions.length
        ? table(["reader", "segment", "position", ""], positions, { id: "positions" })
        : note("No reader holds a segment."),
    ),
    section(
      "Unassigned segments",
      unassigned.length ? table(["segment", "position"], unassigned, { id: "unassigned" }) : note("None."),
    ),
    section(
      "Waiting for predecessors",
      waiting.length ? table(["segment", "waits for"], waiting, { id: "waiting" }) : note("None."),
    ),
  ];
}
