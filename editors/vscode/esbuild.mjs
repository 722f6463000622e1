// Bundles the extension (out/extension.js, `vscode` left external) or, with --tests, the
// unit tests (out/test/*.test.js, run by `node --test`; they import no `vscode`).
import * as esbuild from "esbuild";
import { readdirSync } from "node:fs";

const production = process.argv.includes("--production");
const watch = process.argv.includes("--watch");
const tests = process.argv.includes("--tests");

const common = { bundle: true, platform: "node", target: "node20", format: "cjs", logLevel: "info" };

const options = tests
  ? {
      ...common,
      entryPoints: readdirSync("test/unit").filter((f) => f.endsWith(".test.ts")).map((f) => `test/unit/${f}`),
      outdir: "out/test",
      sourcemap: "inline",
    }
  : {
      ...common,
      entryPoints: ["src/extension.ts"],
      outfile: "out/extension.js",
      external: ["vscode"],
      minify: production,
      sourcemap: !production,
    };

if (watch) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else {
  await esbuild.build(options);
}
