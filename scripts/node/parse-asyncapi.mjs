// Reads an AsyncAPI document with the AsyncAPI initiative's own parser (@asyncapi/parser:
// the specification's JSON Schema, its Spectral rules, references to other files resolved)
// and prints its diagnostics as a JSON array of {severity, code, message, path}:
// severity 0 is an error, 1 a warning, 2 information, 3 a hint. A document the parser could
// not read at all has at least one error. Exit 0 when it could run, whatever it found.
import parser from "@asyncapi/parser";

const { Parser, fromFile } = parser;
const [path] = process.argv.slice(2);
const { document, diagnostics } = await fromFile(new Parser(), path).parse();
const found = diagnostics.map((d) => ({
  severity: d.severity,
  code: String(d.code),
  message: d.message,
  path: d.path,
}));
if (document === undefined && !found.some((d) => d.severity === 0)) {
  found.push({ severity: 0, code: "unparsed", message: "no document", path: [] });
}
process.stdout.write(JSON.stringify(found) + "\n");
