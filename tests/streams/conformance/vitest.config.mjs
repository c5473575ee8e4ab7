// The suite ships its tests in dist/test-runner.js, which vitest's default
// include and exclude patterns skip (node_modules); name it explicitly.
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["node_modules/@durable-streams/server-conformance-tests/dist/test-runner.js"],
    exclude: [],
  },
})
