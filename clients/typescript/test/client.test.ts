/**
 * The generated client against a real `memoryctl serve` (embedded profile), started by
 * tests/clients/test_typescript_client.py, which passes its URL and tokens in the environment.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import { createMemoryctlClient, exitCode, isPartial, warnings, type Schemas } from "../src/index.js";

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: tests/clients/test_typescript_client.py runs this with a service`);
  return value;
}

test("add, query and forget with an agent token", async () => {
  const client = createMemoryctlClient(env("MEMORYCTL_URL"), env("MEMORYCTL_AGENT_TOKEN"));
  const text = "typescript: the canary stage finished on Tuesday";
  const added = await client.POST("/v1/add", { body: { text, entities: ["User:Alice"] } });
  assert.equal(added.response.status, 200);
  assert.ok(added.data, JSON.stringify(added.error));
  assert.equal(exitCode(added.response), 0);
  const id: string = added.data.id;

  const found = await client.POST("/v1/query", { body: { text: "canary stage", limit: 5 } });
  assert.ok(found.data, JSON.stringify(found.error));
  const hits: Schemas["Hit"][] = found.data.hits; // every reply type is named, the nested ones too
  assert.equal(hits[0]?.id, id);
  assert.equal(hits[0]?.agent_id, env("MEMORYCTL_AGENT"));
  assert.deepEqual(found.data.degraded, []);

  const forgotten = await client.POST("/v1/forget", { body: { ids: [id] } });
  assert.deepEqual(forgotten.data?.forgotten, [id]);
  const again = await client.POST("/v1/query", { body: { text: "canary stage" } });
  assert.ok(!again.data?.hits.some((hit) => hit.id === id));
});

test("another agent's memory is refused with the typed error body", async () => {
  const client = createMemoryctlClient(env("MEMORYCTL_URL"), env("MEMORYCTL_AGENT_TOKEN"));
  const read = await client.POST("/v1/get", { body: { id: env("MEMORYCTL_OTHER_ID") } });
  assert.equal(read.response.status, 404);
  assert.equal(read.data, undefined);
  assert.equal(read.error?.exit_code, 1);
  assert.match(read.error?.error ?? "", /not found|no memory/i);

  const scoped = await client.POST("/v1/query", { body: { text: "anything", agent: env("MEMORYCTL_OTHER_AGENT") } });
  assert.equal(scoped.response.status, 403);
  assert.match(scoped.error?.error ?? "", /bound to agent/);

  const wrong = createMemoryctlClient(env("MEMORYCTL_URL"), "not-a-token");
  const refused = await wrong.POST("/v1/query", { body: { text: "anything" } });
  assert.equal(refused.response.status, 401);
});

test("a degraded answer is partial: exit code 3 and the store named", async () => {
  const client = createMemoryctlClient(env("MEMORYCTL_DEGRADED_URL"), env("MEMORYCTL_DEGRADED_TOKEN"));
  const added = await client.POST("/v1/add", { body: { text: "typescript: written while the vectors are away" } });
  assert.ok(added.data, JSON.stringify(added.error));
  assert.equal(exitCode(added.response), 3);
  assert.ok(warnings(added.response).some((line) => line.includes("pending")));
  const found = await client.POST("/v1/query", { body: { text: "vectors away" } });
  assert.ok(found.data, JSON.stringify(found.error));
  assert.ok(isPartial(found.response));
  assert.deepEqual(found.data.degraded, ["qdrant"]);
  assert.ok(found.data.hits.some((hit) => hit.id === added.data?.id));
});
