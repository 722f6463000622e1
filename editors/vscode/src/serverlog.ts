/**
 * The server's stderr into the "Ditto" log channel at the right level.
 *
 * `ditto-lsp serve` logs with Python's logging ("2026-11-30 17:30:10,825 INFO lsp_server.server:
 * model ready"); languageclient would show every stderr line as an error. Lines without a level
 * (traceback lines, continuations) keep the level of the line before; a traceback is an error.
 * Pure logic (no `vscode` import).
 */

export type Level = "debug" | "info" | "warn" | "error";

const LINE = /^\d{4}-\d\d-\d\d[ T][\d:.,]+\s+(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+(.*)$/;

const LEVELS: Record<string, Level> = {
  DEBUG: "debug",
  INFO: "info",
  WARNING: "warn",
  WARN: "warn",
  ERROR: "error",
  CRITICAL: "error",
  FATAL: "error",
};

/** The level of one stderr line and its text without the timestamp (the channel adds its own). */
export function classify(line: string, previous: Level): { level: Level; text: string } {
  const m = LINE.exec(line);
  if (m) return { level: LEVELS[m[1]], text: m[2] };
  if (line.startsWith("Traceback (most recent call last)")) return { level: "error", text: line };
  return { level: previous, text: line };
}
