// Offline KQL check: parses and semantically analyses every management command in schemas/kusto/*.kql (in file
// order), every query or body in deploy/adx-mon/*.yaml and every example query (one per line of a ```kusto block)
// in schemas/kusto/README.md against the declared schema (schemas/kusto/schema.json), with Microsoft's
// Kusto.Language (npm @kusto/language-service-next; no cluster needed). Run by tests/deploy/test_kusto.py.
//
//   node tests/kql/check.mjs [--schema FILE] [--kql DIR] [--deploy DIR] [--readme FILE] [--queries FILE] [--json]
//
// --queries FILE: a JSON list of {"file", "line", "label", "text"}: queries taken from elsewhere (the dashboards,
// tests/deploy/test_dashboards.py), each analysed whole after the schema's functions, reported at file:line.
//
// Prints one line per diagnostic (file:line:col: Severity Code Message) and exits 1 if there is any, 0 otherwise.
// With --json it prints {"diagnostics": [...], "commands": {file: [command text, ...]}} instead.
//
// Materialized views and functions become symbols as their commands are met, so later commands, functions and
// alert rules are analysed against them. adx-mon's query wrapping is reproduced: an AlertRule query gets the
// _startTime/_endTime/_region bindings the alerter prepends; Function and ManagementCommand bodies are scripts.

import { readFileSync, readdirSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const require = createRequire(import.meta.url);
require("@kusto/language-service-next/bridge"); // defines the Bridge and System globals
require("@kusto/language-service-next/Kusto.Language.Bridge"); // defines the Kusto global
const { Kusto, Bridge } = globalThis;
const S = Kusto.Language.Symbols;

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..", "..");

function parseArgs(argv) {
  const opts = {
    schema: join(repo, "schemas", "kusto", "schema.json"),
    kql: join(repo, "schemas", "kusto"),
    deploy: join(repo, "deploy", "adx-mon"),
    readme: join(repo, "schemas", "kusto", "README.md"),
    queries: null,
    json: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--json") opts.json = true;
    else if (["--schema", "--kql", "--deploy", "--readme", "--queries"].includes(a) && i + 1 < argv.length) opts[a.slice(2)] = resolve(argv[++i]);
    else throw new Error(`unknown argument ${a}`);
  }
  return opts;
}

// AlertRule queries run after these lines (adx-mon alerter/engine/context.go wrapQuery), with the _adxmon* names
// bound as query parameters.
const ALERT_PREFIX =
  "declare query_parameters(_adxmonStartTime:datetime, _adxmonEndTime:datetime, _adxmonRegion:string);\n" +
  "let _startTime = _adxmonStartTime;\nlet _endTime = _adxmonEndTime;\nlet _region = _adxmonRegion;\n";

class Checker {
  constructor(schema) {
    this.database = schema.database;
    this.symbols = new Map();
    for (const [name, table] of Object.entries(schema.tables)) {
      const cols = Object.entries(table.columns).map(([c, t]) => `${c}:${t}`).join(", ");
      this.symbols.set(name, new S.TableSymbol.$ctor7(name, `(${cols})`, null));
    }
    this.rebuild();
    this.diagnostics = [];
    this.commands = {};
    this.resources = 0;
    this.examples = 0;
    this.queries = 0;
  }

  rebuild() {
    const db = new S.DatabaseSymbol.ctor(this.database, [...this.symbols.values()]);
    this.globals = Kusto.Language.GlobalState.Default.WithDatabase(db);
  }

  report(file, where, severity, code, message) {
    this.diagnostics.push({ file, line: where.line, column: where.column, severity, code, message });
  }

  // Every diagnostic of `code` analysed against the current symbols; `locate` maps an offset in `code` to a
  // position in the file.
  analyse(file, code, locate, label = "") {
    const parsed = Kusto.Language.KustoCode.ParseAndAnalyze(code, this.globals);
    for (const d of Bridge.toArray(parsed.GetDiagnostics())) {
      this.report(file, locate(d.Start), d.Severity, d.Code, label + d.Message);
    }
    return parsed;
  }

  // A script of management commands separated by blank lines, split as Kusto.Language (and `tracker kusto
  // apply`) split it. Each command is analysed against the symbols defined by the commands before it.
  script(file, text, locate, label = "") {
    const script = Kusto.Language.Editor.CodeScript.From$1(text, this.globals);
    const commands = [];
    for (let i = 0; i < script.Blocks.Count; i++) {
      const block = script.Blocks.getItem(i);
      const body = stripComments(block.Text);
      if (!body) continue;
      const start = block.Start + block.Text.indexOf(body);
      commands.push(body);
      if (!body.startsWith(".")) {
        this.report(file, locate(start), "Error", "TG001", label + "not a management command (a schema script holds commands only)");
        continue;
      }
      this.analyse(file, body, (offset) => locate(start + offset), label);
      this.define(body);
    }
    return commands;
  }

  // Registers the materialized view or function a command creates, so that later commands can use it.
  define(command) {
    const view = command.match(
      /^\.create(?:\s+async)?(?:\s+ifnotexists)?\s+materialized-view\s+(?:with\s*\((?:[^()"]|"[^"]*")*\)\s*)?(\w+)\s+on\s+table\s+\w+\s*\{([\s\S]*)\}\s*$/,
    );
    if (view) {
      const [, name, query] = view;
      const result = Kusto.Language.KustoCode.ParseAndAnalyze(query, this.globals).ResultType;
      this.symbols.set(name, new S.MaterializedViewSymbol.$ctor2(name, columnsOf(result), query, null));
      this.rebuild();
      return;
    }
    const fn = command.match(/^\.create-or-alter\s+function\s+(?:with\s*\((?:[^()"]|"[^"]*")*\)\s*)?(\w+)\s*\(/);
    if (fn) {
      const open = fn[0].length - 1;
      const close = matchingParen(command, open);
      const bodyStart = command.indexOf("{", close);
      const bodyEnd = command.lastIndexOf("}");
      if (close < 0 || bodyStart < 0 || bodyEnd < bodyStart) return; // the analysis has reported it
      const params = command.slice(open, close + 1);
      this.symbols.set(fn[1], new S.FunctionSymbol.$ctor16(fn[1], params, command.slice(bodyStart, bodyEnd + 1), null));
      this.rebuild();
    }
  }

  kqlFiles(dir) {
    for (const name of readdirSync(dir).filter((n) => n.endsWith(".kql")).sort()) {
      const path = join(dir, name);
      const file = relative(repo, path);
      const text = readFileSync(path, "utf8");
      this.commands[file] = this.script(file, text, (offset) => lineColumn(text, offset));
    }
  }

  deployFiles(dir) {
    if (!existsSync(dir)) return;
    for (const name of readdirSync(dir).filter((n) => /\.ya?ml$/.test(n)).sort()) {
      const path = join(dir, name);
      const file = relative(repo, path);
      const text = readFileSync(path, "utf8");
      for (const doc of parseAllDocuments(text)) {
        for (const e of doc.errors) this.report(file, lineColumn(text, e.pos[0]), "Error", "TG002", `YAML: ${e.message}`);
        if (doc.contents !== null) this.resource(file, text, doc);
      }
    }
  }

  readmeExamples(path) {
    if (!existsSync(path)) return;
    const file = relative(repo, path);
    const text = readFileSync(path, "utf8");
    for (const block of text.matchAll(/```kusto\n([\s\S]*?)```/g)) {
      let offset = block.index + "```kusto\n".length;
      for (const line of block[1].split("\n")) {
        if (line.trim()) {
          this.examples++;
          const start = offset;
          this.analyse(file, line, (o) => lineColumn(text, start + o));
        }
        offset += line.length + 1;
      }
    }
  }

  // Queries from elsewhere, each analysed whole; a diagnostic is reported at the query's line plus its own.
  queryList(path) {
    for (const q of JSON.parse(readFileSync(path, "utf8"))) {
      this.queries++;
      this.analyse(q.file, q.text, (offset) => {
        const at = lineColumn(q.text, offset);
        return { line: (q.line ?? 1) + at.line - 1, column: at.column };
      }, q.label ? `${q.label}: ` : "");
    }
  }

  resource(file, text, doc) {
    this.resources++;
    const obj = doc.toJS();
    const label = `${obj.kind ?? "?"}/${obj.metadata?.name ?? "?"}: `;
    const spec = obj.spec ?? {};
    const at = lineColumn(text, doc.range[0]);
    if (obj.apiVersion !== "adx-mon.azure.com/v1") {
      this.report(file, at, "Error", "TG003", label + "apiVersion must be adx-mon.azure.com/v1");
      return;
    }
    if (spec.database !== this.database) {
      this.report(file, at, "Error", "TG004", label + `spec.database ${JSON.stringify(spec.database)} is not the declared database ${this.database}`);
    }
    const field = obj.kind === "AlertRule" ? "query" : "body";
    const node = doc.getIn(["spec", field], true);
    const code = spec[field];
    if (typeof code !== "string" || !node) {
      this.report(file, at, "Error", "TG005", label + `spec.${field} is missing`);
      return;
    }
    const locate = blockScalarLocator(text, node, code);
    if (obj.kind === "AlertRule") {
      for (const k of ["interval", "destination"]) {
        if (!spec[k]) this.report(file, at, "Error", "TG005", label + `spec.${k} is missing`);
      }
      const parsed = this.analyse(file, ALERT_PREFIX + code, (offset) => locate(Math.max(0, offset - ALERT_PREFIX.length)), label);
      const columns = new Set(columnsOf(parsed.ResultType).map((c) => c.Name));
      for (const c of ["Title", "Severity", "CorrelationId"]) {
        if (!columns.has(c)) this.report(file, at, "Error", "TG006", label + `the query returns no ${c} column`);
      }
    } else if (obj.kind === "Function" || obj.kind === "ManagementCommand") {
      this.script(file, code, locate, label);
    } else {
      this.report(file, at, "Error", "TG003", label + "unsupported kind (expected AlertRule, Function or ManagementCommand)");
    }
  }
}

function stripComments(text) {
  const lines = text.split("\n");
  while (lines.length && (/^\s*$/.test(lines[0]) || /^\s*\/\//.test(lines[0]))) lines.shift();
  return lines.join("\n").trim();
}

function matchingParen(text, open) {
  let depth = 0;
  let quote = null;
  for (let i = open; i < text.length; i++) {
    const c = text[i];
    if (quote) {
      if (c === quote) quote = null;
    } else if (c === '"' || c === "'") quote = c;
    else if (c === "(") depth++;
    else if (c === ")" && --depth === 0) return i;
  }
  return -1;
}

function lineColumn(text, offset) {
  const before = text.slice(0, offset).split("\n");
  return { line: before.length, column: before[before.length - 1].length + 1 };
}

function columnsOf(type) {
  const columns = [];
  for (let i = 0; type && type.Columns && i < type.Columns.Count; i++) columns.push(type.Columns.getItem(i));
  return columns;
}

// Maps an offset in the value of a literal block scalar (`key: |`) to its line and column in the YAML file:
// line i of the value is line i after the `|` line, shifted right by the block's indentation.
function blockScalarLocator(text, node, value) {
  const first = text.indexOf("\n", node.range[0]) + 1;
  const firstLine = lineColumn(text, first).line;
  const indent = text.slice(first).match(/^ */)[0].length;
  return (offset) => {
    const at = lineColumn(value, offset);
    return { line: firstLine + at.line - 1, column: indent + at.column };
  };
}

const opts = parseArgs(process.argv.slice(2));
const checker = new Checker(JSON.parse(readFileSync(opts.schema, "utf8")));
checker.kqlFiles(opts.kql);
checker.deployFiles(opts.deploy);
checker.readmeExamples(opts.readme);
if (opts.queries) checker.queryList(opts.queries);
if (opts.json) {
  const out = { diagnostics: checker.diagnostics, commands: checker.commands, examples: checker.examples, queries: checker.queries };
  process.stdout.write(JSON.stringify(out, null, 2) + "\n");
} else {
  for (const d of checker.diagnostics) console.log(`${d.file}:${d.line}:${d.column}: ${d.severity} ${d.code} ${d.message}`);
  const files = Object.keys(checker.commands).length;
  const commands = Object.values(checker.commands).reduce((n, c) => n + c.length, 0);
  console.log(`${checker.diagnostics.length} diagnostic(s): ${files} .kql files (${commands} commands), ${checker.resources} adx-mon resources, ${checker.examples} README examples, ${checker.queries} other queries`);
}
// exitCode, not process.exit(): exiting at once would cut what is still queued for a pipe (the --json output is
// more than a pipe's buffer, 64 KiB)
process.exitCode = checker.diagnostics.length ? 1 : 0;
