// S3 buckets: ListBuckets and ListObjectsV2 of the S3 surface (unsigned: it serves them when no S3
// keys are set and the node is bound to loopback), each object linked to its segment.

import * as api from "./api.js";
import { ago, bytes, h, link, note, problem, section, table, time } from "./dom.js";

const PAGE = 100;

async function s3(path) {
  const answer = await fetch(path, { cache: "no-store" });
  const doc = new DOMParser().parseFromString(await answer.text(), "application/xml");
  if (!answer.ok) {
    const code = doc.querySelector("Error > Code")?.textContent || answer.status;
    const err = new api.ApiError(answer.status, code, doc.querySelector("Error > Message")?.textContent || answer.statusText);
    if (answer.status === 403 || answer.status === 400) {
      err.detail += " (this S3 surface wants signed requests: a console has no S3 keys; the buckets' objects are segments)";
    }
    throw err;
  }
  return doc;
}

const text = (node, tag) => node.getElementsByTagName(tag)[0]?.textContent ?? "";

export async function render(main, params) {
  const bucket = params.get("bucket");
  main.append(h("h1", {}, "S3 buckets"));
  try {
    if (bucket) await objects(main, bucket, params.get("token") || "");
    else await buckets(main);
  } catch (err) {
    main.append(problem(err), note("A bucket is the first part of segment names: ", link("segments", {}, "browse the segments"), "."));
  }
}

async function buckets(main) {
  const doc = await s3("/");
  const rows = [...doc.getElementsByTagName("Bucket")].map((b) => {
    const name = text(b, "Name");
    return [link("buckets", { bucket: name }, name), time(text(b, "CreationDate")), link("segments", { prefix: `${name}/` }, `${name}/…`)];
  });
  main.append(rows.length ? table(["bucket", "created", "segments"], rows, { id: "buckets" }) : note("No buckets."));
}

async function objects(main, bucket, token) {
  const query = new URLSearchParams({ "list-type": "2", "max-keys": String(PAGE) });
  if (token) query.set("continuation-token", token);
  const doc = await s3(`/${encodeURIComponent(bucket)}?${query}`);
  const rows = [...doc.getElementsByTagName("Contents")].map((o) => {
    const key = text(o, "Key");
    return [
      link("segments", { name: `${bucket}/${key}` }, key),
      { value: bytes(Number(text(o, "Size"))), class: "num" },
      h("span", { title: time(text(o, "LastModified")) }, ago(text(o, "LastModified"))),
    ];
  });
  const next = text(doc, "NextContinuationToken");
  main.append(
    h("nav", { class: "crumbs" }, link("buckets", {}, "all buckets"), " / ", h("span", { class: "name" }, bucket)),
    section(
      "Objects",
      rows.length ? table(["key (its segment)", "size", "last modified"], rows, { id: "objects" }) : note("No objects."),
      h("nav", { class: "pager" }, token ? link("buckets", { bucket }, "first page") : null, next ? link("buckets", { bucket, token: next }, "next page") : null),
    ),
  );
}
