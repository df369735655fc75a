//! The tool surface: its size, its names, and the portability of its schemas.
//!
//! What this guards, and why:
//!
//! * **Size.** Every character of `tools/list` (names, descriptions, input
//!   schemas) and of the server instructions is put in front of the model in
//!   every conversation, whether or not a tool is ever called; every
//!   character of a result is read back. The budgets below hold the model-
//!   visible surface of the default profile, that of `--tools all` (and its
//!   whole tools array, annotations included), what R adds to either, and
//!   the response line of a `1+1` cell (the numbers are in
//!   `scripts/tool-budgets.json`). They are the same budgets, counted the
//!   same way, as `scripts/tool-surface.py`, which prints the numbers per
//!   tool: run it when a test here fails. What the docs say of these sizes
//!   is checked by `docs_numbers`.
//! * **Names.** Which tools each `--tools` profile exposes is part of the
//!   interface agents and their prompts depend on: a tool appearing,
//!   vanishing or being renamed must be a deliberate change of this file.
//! * **Portability.** Clients validate the schemas they are sent, and warn
//!   or fail on what is not plain JSON Schema: the TypeScript SDK's Ajv warns
//!   on unknown formats such as `uint64` on every `listTools()`, the MCP
//!   Inspector's `--strict` fails on boolean schemas (`items: true`) and on
//!   `type: [X, "null"]`. Every schema is walked recursively for those and
//!   for the other schemars-isms (`default: null`, `$schema`).
//! * **Results.** By default a result is text (and images) only; with
//!   `--structured-content` its structured form omits empty fields rather
//!   than spelling them out as null, "" or [].
//! * **Argument errors** are tool results the model can act on (naming the
//!   argument and the expected type), not JSON-RPC errors with rmcp's
//!   "failed to deserialize parameters" prefix.
//!
//! Sizes are counted in characters (Unicode code points), JSON as compact
//! `serde_json::to_string` output; key order may differ from Python's
//! `json.dumps(..., separators=(',', ':'), ensure_ascii=False)`, the length
//! does not.

use std::collections::BTreeSet;
use std::process::Stdio;

use crate::support::{
    CALL_TIMEOUT, EXIT_TIMEOUT, Launch, START_TIMEOUT, StderrLog, StdioServer, ToolOutput,
    server_command_plain, tail,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

// ------------------------------------------------------------------ budgets

/// The budgets, shared with scripts/tool-surface.py.
pub(crate) fn budget(key: &str) -> usize {
    let all: Value = serde_json::from_str(include_str!("../../scripts/tool-budgets.json"))
        .expect("scripts/tool-budgets.json is JSON");
    all[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no budget {key} in scripts/tool-budgets.json")) as usize
}

// ------------------------------------------------------------------ names

/// `--tools python`.
const PYTHON_TOOLS: &[&str] = &[
    "python_exec",
    "python_wait",
    "python_output",
    "python_sessions",
    "python_inspect",
];
/// The default profile (`python,packages`) adds these to PYTHON_TOOLS.
const PACKAGES_TOOLS: &[&str] = &["python_install"];
/// `--tools all` adds these to the default profile.
const ALL_ONLY_TOOLS: &[&str] = &[
    "python_history",
    "python_run_file",
    "python_complete",
    "python_namespace",
    "python_export",
    "shell_exec",
    "shell_wait",
    "shell_output",
    "file_list",
    "file_read",
    "file_write",
    "file_delete",
];

/// The formats JSON Schema 2020-12 defines; a client may reject any other.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

fn name_set(groups: &[&[&str]]) -> BTreeSet<String> {
    groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|s| s.to_string())
        .collect()
}

// ------------------------------------------------------------------ raw stdio

/// A server driven by hand over stdio (newline-delimited JSON-RPC), so that
/// the test sees the exact lines a client receives, as the script does.
struct RawServer {
    /// Killed on drop (as every process `Launch` starts).
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: StderrLog,
    next_id: u64,
    /// The result of `initialize`.
    init: Value,
    _workdir: tempfile::TempDir,
}

impl RawServer {
    /// Starts `ferrepl --workdir <fresh tempdir> ARGS` and does the
    /// initialize handshake.
    async fn start(args: &[&str]) -> Self {
        let spawned = Launch::new(args).plain().spawn_stdio();
        let mut server = RawServer {
            stdin: spawned.stdin.expect("piped stdin"),
            stdout: BufReader::new(spawned.stdout.expect("piped stdout")),
            child: spawned.child,
            stderr: spawned.stderr,
            next_id: 0,
            init: Value::Null,
            _workdir: spawned.workdir,
        };
        let params = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "ferrepl-tool-surface-test", "version": "0" }
        });
        let (_, init) = tokio::time::timeout(START_TIMEOUT, server.request("initialize", params))
            .await
            .unwrap_or_else(|_| panic!("no initialize result within {START_TIMEOUT:?}"));
        server.init = init;
        server
            .send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await;
        server
    }

    fn stderr_tail(&self) -> String {
        self.stderr.tail(3000)
    }

    /// Panics with `why` and the server's stderr, once the server has
    /// exited and its stderr is read to the end (or after a few seconds).
    async fn fail_gone(&mut self, why: String) -> ! {
        let _ = tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await;
        self.stderr.wait_closed(EXIT_TIMEOUT).await;
        panic!("{why}; stderr:\n{}", self.stderr_tail());
    }

    async fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        let written = match self.stdin.write_all(line.as_bytes()).await {
            Ok(()) => self.stdin.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            self.fail_gone(format!("writing to the server failed ({e})"))
                .await;
        }
    }

    /// Sends a request; returns the raw response line (without its newline)
    /// and its `result`. Panics on a JSON-RPC error, a closed stdout or a
    /// line that is not JSON.
    async fn request(&mut self, method: &str, params: Value) -> (String, Value) {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        loop {
            let mut line = String::new();
            let read = tokio::time::timeout(CALL_TIMEOUT, self.stdout.read_line(&mut line)).await;
            match read {
                Err(_) => panic!(
                    "no answer to {method} within {CALL_TIMEOUT:?}; stderr:\n{}",
                    self.stderr_tail()
                ),
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.fail_gone(format!(
                        "the server closed its stdout while {method} was pending"
                    ))
                    .await
                }
                Ok(Ok(_)) => {}
            }
            let line = line.trim_end_matches(['\n', '\r']).to_string();
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("the server wrote a non-JSON line ({e}): {line:?}"));
            if message["id"] != json!(id) || message.get("method").is_some() {
                continue; // a notification (progress, logging), not ours
            }
            if let Some(error) = message.get("error") {
                panic!(
                    "{method} failed with a JSON-RPC error: {error}; stderr:\n{}",
                    self.stderr_tail()
                );
            }
            let result = message["result"].clone();
            return (line, result);
        }
    }

    /// Every tool of tools/list (following nextCursor).
    async fn list_tools(&mut self) -> Vec<Value> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let (_, listed) = self.request("tools/list", params).await;
            tools.extend(listed["tools"].as_array().cloned().unwrap_or_default());
            cursor = listed["nextCursor"].as_str().map(str::to_string);
            if cursor.is_none() {
                return tools;
            }
        }
    }
}

// ------------------------------------------------------------------ measures

fn chars(s: &str) -> usize {
    s.chars().count()
}

fn compact_len(value: &Value) -> usize {
    chars(&serde_json::to_string(value).expect("serialize JSON"))
}

fn tool_name(tool: &Value) -> &str {
    tool["name"].as_str().unwrap_or("?")
}

/// What the model sees of one tool: name + description + inputSchema.
fn model_visible(tool: &Value) -> usize {
    chars(tool_name(tool))
        + chars(tool["description"].as_str().unwrap_or(""))
        + compact_len(tool.get("inputSchema").unwrap_or(&json!({})))
}

/// One profile's surface as the script measures it.
pub(crate) struct Surface {
    args: Vec<String>,
    instructions: String,
    tools: Vec<Value>,
}

impl Surface {
    pub(crate) async fn of(args: &[&str]) -> Self {
        let mut server = RawServer::start(args).await;
        let tools = server.list_tools().await;
        let instructions = server.init["instructions"]
            .as_str()
            .unwrap_or("")
            .to_string();
        Surface {
            args: args.iter().map(|s| s.to_string()).collect(),
            instructions,
            tools,
        }
    }

    /// All tools' model-visible characters plus the instructions'.
    pub(crate) fn visible(&self) -> usize {
        self.tools.iter().map(model_visible).sum::<usize>() + chars(&self.instructions)
    }

    pub(crate) fn tools_json(&self) -> usize {
        compact_len(&Value::Array(self.tools.clone()))
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.tools
            .iter()
            .map(|t| tool_name(t).to_string())
            .collect()
    }

    /// Per-tool sizes, largest first, for failure messages.
    fn table(&self) -> String {
        let mut rows: Vec<(usize, &str)> = self
            .tools
            .iter()
            .map(|t| (model_visible(t), tool_name(t)))
            .collect();
        rows.sort_by(|a, b| b.cmp(a));
        let mut out = format!("ferrepl {}:\n", self.args.join(" "));
        for (n, name) in rows {
            out.push_str(&format!("  {name:<20} {n:>6}\n"));
        }
        out.push_str(&format!(
            "  {:<20} {:>6}\n  = {} model-visible; tools array {} (compact JSON)\n",
            "(instructions)",
            chars(&self.instructions),
            self.visible(),
            self.tools_json()
        ));
        out
    }
}

#[tokio::test]
async fn default_profile_fits_its_budget() {
    let surface = Surface::of(&[]).await;
    println!("{}", surface.table());
    let limit = budget("default_visible");
    assert!(
        surface.visible() <= limit,
        "the default profile shows the model {} characters, over its budget of {limit} \
         (scripts/tool-surface.py prints the details):\n{}",
        surface.visible(),
        surface.table()
    );
}

#[tokio::test]
async fn r_tools_add_at_most_their_budget_and_only_when_enabled() {
    let python = Surface::of(&[]).await;
    let both = Surface::of(&["--languages", "python,r"]).await;
    let names = |s: &Surface| -> Vec<String> {
        s.tools
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect()
    };
    assert!(
        !names(&python).iter().any(|n| n.starts_with("r_")),
        "R tools are listed without --languages r: {:?}",
        names(&python)
    );
    for tool in ["r_exec", "r_wait", "r_output", "r_inspect", "r_install"] {
        assert!(
            names(&both).iter().any(|n| n == tool),
            "{tool} missing with --languages python,r: {:?}",
            names(&both)
        );
    }
    let added = both.visible() - python.visible();
    println!("{}", both.table());
    // And to --tools all, whose R tools add r_complete.
    let all = Surface::of(&["--tools", "all"]).await;
    let all_r = Surface::of(&["--tools", "all", "--languages", "python,r"]).await;
    let limit = budget("r_added_visible");
    let added_all = all_r.visible() - all.visible();
    assert!(
        added_all <= limit,
        "R adds {added_all} model-visible characters to --tools all, over its budget of {limit}:\n{}",
        all_r.table()
    );
    let limit = budget("r_added_visible");
    assert!(
        added <= limit,
        "R adds {added} model-visible characters to the default profile, over its budget of {limit}:\n{}",
        both.table()
    );
}

#[tokio::test]
async fn all_profile_fits_its_budgets() {
    let surface = Surface::of(&["--tools", "all"]).await;
    println!("{}", surface.table());
    let limit = budget("all_visible");
    assert!(
        surface.visible() <= limit,
        "--tools all shows the model {} characters, over its budget of {limit}:\n{}",
        surface.visible(),
        surface.table()
    );
    let limit = budget("all_tools_json");
    assert!(
        surface.tools_json() <= limit,
        "the tools array of --tools all is {} characters of JSON, over its budget of \
         {limit}:\n{}",
        surface.tools_json(),
        surface.table()
    );
}

// ------------------------------------------------------------------ names

fn assert_names(surface: &Surface, expected: BTreeSet<String>) {
    let names = surface.names();
    let listed: BTreeSet<String> = names.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        names.len(),
        "ferrepl {} lists a tool twice: {names:?}",
        surface.args.join(" ")
    );
    let missing: Vec<_> = expected.difference(&listed).collect();
    let extra: Vec<_> = listed.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "ferrepl {}: tools missing {missing:?}, unexpected {extra:?} (listed: {names:?})",
        surface.args.join(" ")
    );
}

#[tokio::test]
async fn default_profile_is_python_and_packages() {
    let surface = Surface::of(&[]).await;
    assert_names(&surface, name_set(&[PYTHON_TOOLS, PACKAGES_TOOLS]));
}

#[tokio::test]
async fn all_profile_adds_more_shell_and_files() {
    let surface = Surface::of(&["--tools", "all"]).await;
    assert_names(
        &surface,
        name_set(&[PYTHON_TOOLS, PACKAGES_TOOLS, ALL_ONLY_TOOLS]),
    );
}

#[tokio::test]
async fn python_profile_is_the_five_python_tools() {
    let surface = Surface::of(&["--tools", "python"]).await;
    assert_names(&surface, name_set(&[PYTHON_TOOLS]));
}

#[tokio::test]
async fn an_unknown_tool_group_is_refused_at_start() {
    let workdir = tempfile::tempdir().expect("create a temporary workdir");
    let group = "no-such-group";
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(["--tools", &format!("python,{group}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // stdin stays open (piped, never written): a server that accepted the
    // flag would wait for a client rather than exit.
    let output = tokio::time::timeout(EXIT_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("--tools python,{group}: the server did not exit"))
        .expect("run the ferrepl binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "--tools python,{group} was accepted (exit {}); stderr:\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains(group),
        "the refusal of --tools python,{group} does not name the group:\n{stderr}"
    );
}

// ------------------------------------------------------------------ portability

/// Checks the schema at `path` (and every schema inside it).
fn walk_schema(schema: &Value, path: &str, problems: &mut Vec<String>) {
    let map = match schema {
        Value::Object(map) => map,
        Value::Bool(b) => {
            problems.push(format!("{path}: boolean schema `{b}`"));
            return;
        }
        other => {
            problems.push(format!("{path}: not a schema: {other}"));
            return;
        }
    };
    if let Some(format) = map.get("format") {
        let standard = format
            .as_str()
            .is_some_and(|f| STANDARD_FORMATS.contains(&f));
        if !standard {
            problems.push(format!("{path}: non-standard format {format}"));
        }
    }
    if let Some(ty @ Value::Array(_)) = map.get("type") {
        problems.push(format!("{path}: type is an array: {ty}"));
    }
    if map.get("default") == Some(&Value::Null) {
        problems.push(format!("{path}: \"default\": null"));
    }
    if map.contains_key("$schema") {
        problems.push(format!("{path}: $schema"));
    }
    // Keywords whose value is one schema.
    for key in [
        "items",
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "not",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
    ] {
        if let Some(sub) = map.get(key) {
            walk_schema(sub, &format!("{path}/{key}"), problems);
        }
    }
    // Keywords whose value is a list of schemas.
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(list) = map.get(key) {
            match list.as_array() {
                Some(members) => {
                    for (i, member) in members.iter().enumerate() {
                        walk_schema(member, &format!("{path}/{key}/{i}"), problems);
                    }
                }
                None => problems.push(format!("{path}/{key}: not an array")),
            }
        }
    }
    // Keywords whose value maps names to schemas.
    for key in [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ] {
        if let Some(members) = map.get(key) {
            match members.as_object() {
                Some(members) => {
                    for (name, member) in members {
                        walk_schema(member, &format!("{path}/{key}/{name}"), problems);
                    }
                }
                None => problems.push(format!("{path}/{key}: not an object")),
            }
        }
    }
}

/// Walks a tool's inputSchema (and, when `with_output`, its outputSchema);
/// both must be objects of "type": "object".
fn check_tool_schemas(tool: &Value, with_output: bool, problems: &mut Vec<String>) {
    let name = tool_name(tool);
    let mut keys = vec!["inputSchema"];
    if with_output && tool.get("outputSchema").is_some() {
        keys.push("outputSchema");
    }
    for key in keys {
        let path = format!("{name}.{key}");
        match tool.get(key) {
            None => problems.push(format!("{path}: missing")),
            Some(schema) => {
                if schema["type"] != "object" {
                    problems.push(format!(
                        "{path}: \"type\" is {}, not \"object\"",
                        schema["type"]
                    ));
                }
                walk_schema(schema, &path, problems);
            }
        }
    }
}

#[test]
fn the_schema_walk_finds_what_it_looks_for() {
    let bad = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "n": { "type": ["integer", "null"], "format": "uint64", "default": null },
            "v": true,
            "list": { "type": "array", "items": true },
            "e": { "anyOf": [{ "$ref": "#/$defs/E" }, false] },
            "when": { "type": "string", "format": "date-time" }
        },
        "additionalProperties": false,
        "$defs": { "E": { "type": "object", "properties": { "x": { "format": "double" } } } }
    });
    let mut problems = Vec::new();
    walk_schema(&bad, "t", &mut problems);
    let expected = [
        "t: $schema",
        "t/properties/n: non-standard format \"uint64\"",
        "t/properties/n: type is an array",
        "t/properties/n: \"default\": null",
        "t/properties/v: boolean schema",
        "t/properties/list/items: boolean schema",
        "t/properties/e/anyOf/1: boolean schema",
        "t/additionalProperties: boolean schema",
        "t/$defs/E/properties/x: non-standard format \"double\"",
    ];
    for want in expected {
        assert!(
            problems.iter().any(|p| p.starts_with(want)),
            "the walk missed {want:?}; it found {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
}

#[tokio::test]
async fn input_schemas_are_portable_and_there_are_no_output_schemas_by_default() {
    let surface = Surface::of(&["--tools", "all"]).await;
    let mut problems = Vec::new();
    for tool in &surface.tools {
        check_tool_schemas(tool, false, &mut problems);
        if tool.get("outputSchema").is_some() {
            problems.push(format!(
                "{}: has an outputSchema without --structured-content",
                tool_name(tool)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "schema problems in ferrepl --tools all:\n  {}",
        problems.join("\n  ")
    );
}

#[tokio::test]
async fn input_and_output_schemas_are_portable_with_structured_content() {
    let surface = Surface::of(&["--tools", "all", "--structured-content"]).await;
    let mut problems = Vec::new();
    for tool in &surface.tools {
        check_tool_schemas(tool, true, &mut problems);
    }
    assert!(
        problems.is_empty(),
        "schema problems in ferrepl --tools all --structured-content:\n  {}",
        problems.join("\n  ")
    );
    assert!(
        surface
            .tools
            .iter()
            .any(|t| t.get("outputSchema").is_some()),
        "with --structured-content no tool has an outputSchema (names: {:?})",
        surface.names()
    );
}

// ------------------------------------------------------------------ results

#[tokio::test]
async fn one_plus_one_is_one_short_line_of_text() {
    let mut server = RawServer::start(&[]).await;
    let (line, result) = server
        .request(
            "tools/call",
            json!({ "name": "python_exec", "arguments": { "code": "1+1" } }),
        )
        .await;
    println!("{} characters: {line}", chars(&line));
    let limit = budget("one_plus_one_line");
    assert!(
        chars(&line) <= limit,
        "the response line of python_exec 1+1 is {} characters, over its budget of \
         {limit}:\n{line}",
        chars(&line)
    );
    assert!(
        result.get("structuredContent").is_none(),
        "python_exec 1+1 has structuredContent without --structured-content:\n{line}"
    );
    assert_ne!(result["isError"], json!(true), "1+1 failed:\n{line}");
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("the 1+1 result does not start with a text block:\n{line}"));
    assert_eq!(
        text.lines().next(),
        Some("2"),
        "the 1+1 result's text does not start with the value 2:\n{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("-- ok |")),
        "the 1+1 result's text has no `-- ok |` footer:\n{text}"
    );
}

/// Where `value` has a null, "" or [] (which should have been omitted).
fn empty_fields(value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::Null => found.push(format!("{path}: null")),
        Value::String(s) if s.is_empty() => found.push(format!("{path}: \"\"")),
        Value::Array(items) if items.is_empty() => found.push(format!("{path}: []")),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                empty_fields(item, &format!("{path}[{i}]"), found);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                empty_fields(item, &format!("{path}.{key}"), found);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn structured_content_omits_empty_fields() {
    let server = StdioServer::start_plain(&["--structured-content"]).await;
    let out = server.exec("1+1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"), "value of {out:#?}");
    let mut found = Vec::new();
    empty_fields(&out.structured, "structuredContent", &mut found);
    assert!(
        found.is_empty(),
        "structuredContent spells out empty fields instead of omitting them: {found:?}\n{}",
        out.structured
    );
}

// ------------------------------------------------------------------ argument errors

/// Calls `tool` with `args` that are wrong; returns the error text, after
/// checking it is a tool result with isError (not a JSON-RPC error) and has
/// no rmcp prefix.
async fn argument_error(server: &StdioServer, tool: &str, args: Value) -> String {
    let shown = args.to_string();
    let raw = match server.try_call(tool, args).await {
        Ok(raw) => raw,
        Err(e) => panic!(
            "{tool} {shown} was answered with a JSON-RPC error ({e}); it should be a tool \
             result with isError, which the model can read"
        ),
    };
    let out = ToolOutput::from_result(raw);
    let text: Vec<&str> = out
        .raw
        .content
        .iter()
        .filter_map(|block| block.as_text())
        .map(|t| t.text.as_str())
        .collect();
    let text = text.join("\n");
    assert!(out.is_error, "{tool} {shown} did not fail: {out:#?}");
    assert!(
        !text.contains("failed to deserialize parameters"),
        "{tool} {shown}: the error has rmcp's prefix: {text}"
    );
    text
}

#[tokio::test]
async fn argument_errors_name_the_argument_and_the_expected_type() {
    let server = StdioServer::start_plain(&[]).await;

    let text = argument_error(
        &server,
        "python_exec",
        json!({ "code": "1", "wait_s": "5" }),
    )
    .await;
    for want in ["wait_s must be a number of seconds", "got the string \"5\""] {
        assert!(
            text.contains(want),
            "python_exec wait_s \"5\": {want:?} not in {text:?}"
        );
    }

    let text = argument_error(&server, "python_exec", json!({})).await;
    assert!(
        text.contains("code"),
        "python_exec without code: the error does not name `code`: {text:?}"
    );

    let text = argument_error(&server, "python_wait", json!({ "interrupt": "yes" })).await;
    assert!(
        text.contains("interrupt") && text.to_lowercase().contains("boolean"),
        "python_wait interrupt \"yes\": the error should name `interrupt` and ask for a boolean: \
         {text:?}"
    );

    let text = argument_error(&server, "python_sessions", json!({ "action": "explode" })).await;
    assert!(
        text.contains("action"),
        "python_sessions action \"explode\": the error does not name `action`: {text:?}"
    );
    for allowed in ["list", "create", "reset", "delete", "status"] {
        assert!(
            text.contains(allowed),
            "python_sessions action \"explode\": the allowed value {allowed:?} is not listed: \
             {text:?}"
        );
    }

    // The server is still usable after the refusals.
    let out = server.exec("1+1").await;
    assert!(!out.is_error, "1+1 after the argument errors: {out:#?}");
}

/// Arguments a tool does not have are ignored, and the result says so with
/// the tool's real arguments: an agent that sends `timeout` or `expr` learns
/// they had no effect. The note stays short whatever the call sends.
#[tokio::test]
async fn unknown_arguments_are_named_in_a_note_that_stays_short() {
    let server = StdioServer::start_plain(&[]).await;
    let out = server
        .call("python_exec", json!({ "code": "40 + 2", "timeout": 5 }))
        .await;
    assert!(!out.is_error && out.text.contains("42"), "{out:#?}");
    assert!(
        out.text.contains(
            "python_exec ignored 'timeout': its arguments are code, parent, session, wait_s"
        ),
        "{}",
        out.text
    );
    // Known arguments only: no note. Nor for those read without being in
    // the schema: `name` (an alias of `session`) and, with R off, `language`.
    let out = server
        .call("python_exec", json!({ "code": "1", "wait_s": 5 }))
        .await;
    assert!(!out.text.contains("ignored"), "{}", out.text);
    let listed = json!({ "action": "list", "name": "default", "language": "python" });
    let out = server.call("python_sessions", listed).await;
    assert!(
        !out.is_error && !out.text.contains("ignored"),
        "{}",
        out.text
    );

    // An agent that floods the call with long unknown names gets a bounded note.
    let mut args = serde_json::Map::new();
    args.insert("code".into(), json!("2"));
    for i in 0..5000 {
        args.insert(format!("{i:05}{}", "x".repeat(1000)), json!(i));
    }
    let out = server.call("python_exec", Value::Object(args)).await;
    assert!(!out.is_error, "{}", tail(&out.text, 400));
    let note = out
        .text
        .lines()
        .find(|l| l.contains("ignored"))
        .expect("a note of the ignored arguments");
    assert!(note.contains("4995 more") && note.len() < 600, "{note}");
    assert!(!out.text.contains(&"x".repeat(100)), "the names are cut");
}
