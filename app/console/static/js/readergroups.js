// Reader groups: a group's readers, their segments, positions and lag, its checkpoints, and the
// segments unassigned or waiting for their predecessors (GET /v1/scopes/{scope}/reader-groups/{group}).

import * as api from "./api.js";
import { count, h, note, problem, section, table } from "./dom.js";

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
    const what = err.code === "NotFound" ? "This server serves no reader groups." : `Scope ${scope} has no reader group ${group}.`;
    return main.append(h("p", { class: "empty", id: "no-reader-groups" }, "No reader groups. ", what));
  }
  main.append(...groupView(state));
}

/** Text for a value whose shape the table does not know: numbers counted, the rest as JSON. */
function shown(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return count(value);
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** A member of ``state`` as a list of [key, entry], whether it is an array or an object by key. */
function entries(value, key) {
  if (!value) return [];
  if (Array.isArray(value)) return value.map((entry) => [typeof entry === "object" && entry ? entry[key] : entry, entry]);
  return Object.entries(value);
}

function groupView(state) {
  const readers = entries(state.readers, "reader").map(([id, r]) => [
    shown(id ?? r.id),
    shown(r.generation),
    shown(r.segments ?? Object.keys(r.positions || {})),
    shown(r.positions),
    { value: shown(r.lag_bytes ?? r.lag), class: "num" },
  ]);
  const segments = (member) =>
    entries(state[member], "segment").map(([name, entry]) => [shown(name), shown(typeof entry === "object" ? entry : null)]);
  const checkpoints = entries(state.checkpoints, "id").map(([id, c]) => [shown(id), shown(c)]);
  return [
    section(
      "Group",
      table(["streams", "lease"], [[shown(state.streams), state.lease_s ? `${state.lease_s} s` : "–"]]),
    ),
    section("Readers", readers.length ? table(["reader", "generation", "segments", "positions", "lag (bytes)"], readers, { id: "readers" }) : note("No readers.")),
    section("Unassigned segments", table(["segment", "position"], segments("unassigned"))),
    section("Waiting for predecessors", table(["segment", "waits for"], segments("waiting"))),
    section("Checkpoints", checkpoints.length ? table(["checkpoint", "state"], checkpoints) : note("None.")),
  ];
}
