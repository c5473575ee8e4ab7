// Each request of the suite on a connection of its own (undici's pipelining 0: no keep-alive).
// Some of its tests hold the event loop for seconds (comparing 100 KiB byte by byte), longer than
// the server keeps an idle connection open (gunicorn's keepalive, 5 s) on a busy machine; the next
// test's first request then went out on a pooled connection the server had closed meanwhile, and
// failed with "fetch failed" (UND_ERR_SOCKET), whatever the server answers. Node's fetch takes its
// dispatcher from the global key that undici's setGlobalDispatcher sets; its own default Agent
// (there once a fetch ran) is replaced by one of the same class without keep-alive.
const GLOBAL_DISPATCHER = Symbol.for("undici.globalDispatcher.1")

await fetch("data:,")
const Agent = globalThis[GLOBAL_DISPATCHER].constructor
globalThis[GLOBAL_DISPATCHER] = new Agent({ pipelining: 0 })
