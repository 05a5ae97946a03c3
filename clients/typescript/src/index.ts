/**
 * memoryctl serve's HTTP API with its types: every path, request body and reply comes from
 * `schema.ts`, which openapi-typescript generates from clients/openapi.json (itself generated from
 * memoryctl's declaration). Requests are made by openapi-fetch; this file only configures it (the
 * base URL and the bearer token) and reads the two headers every reply carries.
 */
import createClient, { type Client, type ClientOptions } from "openapi-fetch";
import type { components, operations, paths } from "./schema.js";

export type { components, operations, paths };
/** Every named type of the API: the reply types (`QueryReply`, `Added`, …) and those they use (`Hit`, `Entity`, …), `<Op>Params`, `Error`. */
export type Schemas = components["schemas"];
/** The body of every error reply (with the HTTP status of the `response`). */
export type ApiError = components["schemas"]["Error"];
export type MemoryctlClient = Client<paths>;

/** The CLI's exit code of a reply: 0 ok, 3 partial (a store was behind or degraded). */
export const EXIT_HEADER = "Memoryctl-Exit-Code";
/** The lines the CLI would print on stderr, a JSON list. */
export const WARNINGS_HEADER = "Memoryctl-Warnings";
export const PARTIAL = 3;

/**
 * A client of `memoryctl serve` at `baseUrl` (e.g. http://127.0.0.1:8765) with `token`: the
 * operator's, or an agent token from `memoryctl token issue` (bound to its agent). Call it as
 * `client.POST("/v1/query", { body: { text: "…" } })`: `data` is the typed reply, `error` the
 * typed error body, `response` the HTTP response (its status and headers).
 */
export function createMemoryctlClient(
  baseUrl: string,
  token: string,
  options: Omit<ClientOptions, "baseUrl"> = {},
): MemoryctlClient {
  const headers = new Headers(options.headers as HeadersInit | undefined);
  headers.set("Authorization", `Bearer ${token}`);
  return createClient<paths>({ ...options, baseUrl, headers });
}

/** The CLI's exit code for a reply (`Memoryctl-Exit-Code`; 0 when absent). */
export function exitCode(response: Response): number {
  return Number(response.headers.get(EXIT_HEADER) ?? "0");
}

/** True when the answer is partial (exit code 3): a store did not answer, or a write awaits delivery. */
export function isPartial(response: Response): boolean {
  return exitCode(response) === PARTIAL;
}

/** The lines the CLI would print on stderr for this reply (`Memoryctl-Warnings`). */
export function warnings(response: Response): string[] {
  return JSON.parse(response.headers.get(WARNINGS_HEADER) ?? "[]") as string[];
}
