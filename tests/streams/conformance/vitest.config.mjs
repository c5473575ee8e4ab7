// The suite ships its tests in dist/test-runner.js, which vitest's default
// include and exclude patterns skip (node_modules); name it explicitly.
// Its long-poll tests wait out a server's default 20 s long-poll, so each
// test gets the 30 s of the suite's own vitest config (vitest's default is 5).
// connections.mjs sends each request on a connection of its own (it says why).
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["node_modules/@durable-streams/server-conformance-tests/dist/test-runner.js"],
    exclude: [],
    setupFiles: ["./connections.mjs"],
    testTimeout: 30000,
    hookTimeout: 30000,
  },
})
