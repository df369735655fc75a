//! Argument fuzzing: every tool, called with edge-case and random arguments
//! built from its own input schema, must answer every call (a tool result or
//! a JSON-RPC error, never silence), and the server must stay up and usable.
//!
//! A panic in a tool handler kills the request's task, so the call is never
//! answered: that shows up here as a call timeout. Panics that are answered
//! anyway are caught by scanning the server's stderr for "panicked at", and
//! an argument that kills the session's interpreter by a `crashed` status.
//!
//! Deterministic: a fixed-seed xorshift generator (the seed is printed with
//! any failure; set ARG_FUZZ_SEED to try another one).

use std::time::{Duration, Instant};

use crate::support::{CALL_TIMEOUT, StdioServer, tail};
use rmcp::model::CallToolRequestParams;
use serde_json::{Map, Value, json};

/// A call that takes longer than this is a hang (every legitimate wait in
/// these calls is bounded by `--max-wait 2` or returns at once).
const CALL_LIMIT: Duration = Duration::from_secs(20);
/// Random argument objects per tool, after the systematic edge cases.
const RANDOM_CALLS_PER_TOOL: usize = 120;

/// Fewer random calls for tools whose every call costs a lot (a fresh
/// interpreter, a completion engine import) or that take no arguments, so
/// that the whole run stays well under a minute.
fn random_calls(tool: &Tool) -> usize {
    match tool.name.as_str() {
        _ if tool.properties.is_empty() => 10,
        // python_sessions: create and reset start interpreters.
        "python_complete" | "python_sessions" => 40,
        _ => RANDOM_CALLS_PER_TOOL,
    }
}

const DEFAULT_SEED: u64 = 0x5EED_F00D_CAFE_0001;

/// xorshift64*: small, deterministic, good enough for picking test values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// Numbers that break careless conversions. JSON has no NaN or infinity, so
/// the extremes stand in for them.
fn numbers() -> Vec<Value> {
    let two_pow_64: Value = serde_json::from_str("18446744073709551616").expect("2^64");
    vec![
        json!(1e300),
        json!(-1e300),
        json!(1e308),
        json!(-1e308),
        json!(f64::MAX),
        json!(-0.0),
        two_pow_64,
        json!(u64::MAX),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u32::MAX as u64 + 1),
        json!(-1),
        json!(0),
        json!(1),
        json!(0.5),
        json!(-0.5),
        json!(5e-324),
        json!(3),
    ]
}

fn strings() -> Vec<String> {
    vec![
        String::new(),
        "5".into(),
        "-1".into(),
        "NaN".into(),
        "Infinity".into(),
        "a".repeat(100 * 1024),
        "\u{0}".into(),
        "a\u{0}b".into(),
        "../../etc/passwd".into(),
        "/etc/passwd".into(),
        "\u{FFFD}\u{FEFF}\u{202E}\u{10FFFF}\u{1F600}e\u{301}\u{200B}".into(),
        "\r\n\t\u{1b}[31m".into(),
        "TERM".into(),
        "KILL".into(),
        "9".into(),
        "default".into(),
        "j1".into(),
        "99999999999999999999999".into(),
        "(".into(),
        "*".into(),
        "$(true)".into(),
        "..".into(),
        ".".into(),
        "/".into(),
    ]
}

fn nested(depth: usize) -> Value {
    (0..depth).fold(json!([]), |inner, _| json!([inner]))
}

fn arrays() -> Vec<Value> {
    vec![
        json!([]),
        json!([1, "a", null, true]),
        json!(vec!["x"; 200]),
        nested(60),
        json!([1e308, -1]),
    ]
}

fn objects() -> Vec<Value> {
    vec![
        json!({}),
        json!({"a": 1}),
        json!({"": ""}),
        json!({"\u{0}": "x"}),
        json!({"A": "\u{0}"}),
        json!({"A=B": "c"}),
        json!({"PATH": ""}),
        json!({"x": {"y": [1, {"z": null}]}}),
    ]
}

/// Any JSON value, of any type.
fn any_value(rng: &mut Rng) -> Value {
    match rng.below(7) {
        0 | 1 => rng.pick(&numbers()),
        2 | 3 => Value::String(rng.pick(&strings())),
        4 => rng.pick(&[Value::Null, json!(true), json!(false)]),
        5 => rng.pick(&arrays()),
        _ => rng.pick(&objects()),
    }
}

/// Follows a local `$ref` ("#/$defs/Name") against the tool's whole schema.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/")
            .map(|p| p.split('/').fold(root, |v, k| &v[k]))
            .unwrap_or(schema),
        None => schema,
    }
}

/// The JSON types and enum values a property schema allows (through $ref,
/// anyOf and oneOf).
fn shape(root: &Value, schema: &Value, types: &mut Vec<String>, enums: &mut Vec<Value>) {
    let schema = resolve(root, schema);
    match schema.get("type") {
        Some(Value::String(t)) => types.push(t.clone()),
        Some(Value::Array(ts)) => {
            types.extend(ts.iter().filter_map(Value::as_str).map(String::from))
        }
        _ => {}
    }
    if let Some(Value::Array(values)) = schema.get("enum") {
        enums.extend(values.iter().cloned());
    }
    if let Some(c) = schema.get("const") {
        enums.push(c.clone());
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(options)) = schema.get(key) {
            for o in options {
                shape(root, o, types, enums);
            }
        }
    }
}

/// A value of a type the schema allows, but an edge case of it.
fn typed_value(rng: &mut Rng, root: &Value, schema: &Value) -> Value {
    let (mut types, mut enums) = (Vec::new(), Vec::new());
    shape(root, schema, &mut types, &mut enums);
    if !enums.is_empty() && rng.chance(70) {
        return rng.pick(&enums);
    }
    types.retain(|t| t != "null");
    if types.is_empty() {
        return any_value(rng);
    }
    match rng.pick(&types).as_str() {
        "integer" | "number" => rng.pick(&numbers()),
        "string" => Value::String(rng.pick(&strings())),
        "boolean" => json!(rng.chance(50)),
        "array" => {
            let items = resolve(root, schema)
                .get("items")
                .cloned()
                .unwrap_or(json!({}));
            let n = rng.below(4);
            Value::Array((0..n).map(|_| typed_value(rng, root, &items)).collect())
        }
        "object" => {
            if rng.chance(50) {
                rng.pick(&objects())
            } else {
                let mut m = Map::new();
                for _ in 0..rng.below(3) {
                    m.insert(rng.pick(&strings()), Value::String(rng.pick(&strings())));
                }
                Value::Object(m)
            }
        }
        _ => any_value(rng),
    }
}

/// A plausible value for a required property, so that the other arguments
/// get looked at.
fn plain_value(root: &Value, schema: &Value) -> Value {
    let (mut types, mut enums) = (Vec::new(), Vec::new());
    shape(root, schema, &mut types, &mut enums);
    if let Some(e) = enums.first() {
        return e.clone();
    }
    match types.iter().find(|t| *t != "null").map(String::as_str) {
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(false),
        Some("array") => json!([]),
        Some("object") => json!({}),
        _ => json!("fuzz-missing"),
    }
}

/// Keeps the calls cheap and harmless: the point is the other arguments.
fn make_safe(tool: &str, args: &mut Map<String, Value>) {
    match tool {
        "python_exec" => {
            args.insert("code".into(), json!("1"));
        }
        "shell_exec" => {
            args.insert("command".into(), json!("true"));
        }
        "python_install" => {
            args.insert("packages".into(), json!([]));
        }
        _ => {}
    }
}

struct Tool {
    name: String,
    schema: Value,
    properties: Vec<(String, Value)>,
    required: Vec<String>,
}

impl Tool {
    fn base_args(&self) -> Map<String, Value> {
        let mut args = Map::new();
        for (name, schema) in &self.properties {
            if self.required.contains(name) {
                args.insert(name.clone(), plain_value(&self.schema, schema));
            }
        }
        args
    }

    fn random_args(&self, rng: &mut Rng) -> Map<String, Value> {
        let mut args = Map::new();
        for (name, schema) in &self.properties {
            let keep = if self.required.contains(name) { 95 } else { 70 };
            if !rng.chance(keep) {
                continue;
            }
            let value = if rng.chance(60) {
                typed_value(rng, &self.schema, schema)
            } else {
                any_value(rng)
            };
            args.insert(name.clone(), value);
        }
        if rng.chance(5) {
            args.insert("unknown_argument".into(), any_value(rng));
        }
        args
    }
}

/// A shortened rendering of arguments for failure messages.
fn shown(args: &Map<String, Value>) -> String {
    let short: Map<String, Value> = args
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) if s.len() > 80 => {
                    json!(format!("<{} bytes: {}...>", s.len(), &s[..40]))
                }
                other => {
                    let text = other.to_string();
                    if text.len() > 200 {
                        json!(format!("<{} bytes of JSON>", text.len()))
                    } else {
                        other.clone()
                    }
                }
            };
            (k.clone(), v)
        })
        .collect();
    Value::Object(short).to_string()
}

struct Fuzzer<'a> {
    server: &'a StdioServer,
    seed: u64,
    calls: usize,
    protocol_errors: usize,
    slowest: (Duration, String),
    /// Time spent per tool, for the summary.
    per_tool: std::collections::BTreeMap<String, Duration>,
}

impl Fuzzer<'_> {
    async fn call(&mut self, tool: &str, mut args: Map<String, Value>) {
        make_safe(tool, &mut args);
        let what = format!("{tool} {}", shown(&args));
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        let started = Instant::now();
        let answer = tokio::time::timeout(CALL_LIMIT, self.server.peer().call_tool(params)).await;
        let took = started.elapsed();
        self.calls += 1;
        *self.per_tool.entry(tool.to_string()).or_default() += took;
        if took > self.slowest.0 {
            self.slowest = (took, what.clone());
        }
        match answer {
            // An argument may be refused, never take the interpreter down
            // (the only code run here is "1" and scripts that cannot exit).
            Ok(Ok(result)) => {
                let status = result
                    .structured_content
                    .as_ref()
                    .and_then(|s| s.get("status"))
                    .and_then(Value::as_str);
                assert_ne!(
                    status,
                    Some("crashed"),
                    "seed {:#x}: tools/call {what} crashed the session's interpreter: {result:#?}",
                    self.seed
                );
            }
            // A JSON-RPC error is an answer too; only a closed connection is not.
            Ok(Err(rmcp::ServiceError::McpError(_))) => self.protocol_errors += 1,
            Ok(Err(e)) => panic!(
                "seed {:#x}: tools/call {what} failed at the transport level: {e}\nserver stderr:\n{}",
                self.seed,
                tail(&self.server.stderr_log(), LOG_TAIL)
            ),
            Err(_) => panic!(
                "seed {:#x}: tools/call {what} was not answered within {CALL_LIMIT:?} (a panic in the handler?)\nserver stderr:\n{}",
                self.seed,
                tail(&self.server.stderr_log(), LOG_TAIL)
            ),
        }
    }
}

/// How much of the server's stderr a failure shows.
const LOG_TAIL: usize = 6000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_tool_answers_every_argument_and_the_server_survives() {
    let seed = std::env::var("ARG_FUZZ_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .filter(|s| *s != 0)
        .unwrap_or(DEFAULT_SEED);
    eprintln!("arg_fuzz seed {seed:#x} (set ARG_FUZZ_SEED=<hex> to change)");
    let mut server = StdioServer::start(&["--max-wait", "2", "--default-wait", "2"]).await;
    let listed = tokio::time::timeout(CALL_TIMEOUT, server.peer().list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list failed");
    let tools: Vec<Tool> = listed
        .iter()
        .map(|t| {
            let schema = Value::Object((*t.input_schema).clone());
            let properties = schema["properties"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let required = schema["required"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            Tool {
                name: t.name.to_string(),
                schema,
                properties,
                required,
            }
        })
        .collect();
    assert!(
        tools.len() >= 10,
        "expected the full tool list, got {}",
        tools.len()
    );

    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut fuzz = Fuzzer {
        server: &server,
        seed,
        calls: 0,
        protocol_errors: 0,
        slowest: (Duration::ZERO, String::new()),
        per_tool: Default::default(),
    };
    // Systematic: each property alone set to each edge-case number, and to a
    // value of each other JSON type.
    let mismatched = [
        json!("5"),
        Value::Null,
        json!(true),
        json!([]),
        json!({}),
        json!("a".repeat(100 * 1024)),
        json!("\u{0}"),
    ];
    for tool in &tools {
        for (name, _) in &tool.properties {
            for value in numbers().into_iter().chain(mismatched.iter().cloned()) {
                let mut args = tool.base_args();
                args.insert(name.clone(), value);
                fuzz.call(&tool.name, args).await;
            }
        }
        // Nothing at all, and something that is not an argument.
        fuzz.call(&tool.name, Map::new()).await;
    }
    // Random: several arguments at once, mostly of the right type.
    for tool in &tools {
        for _ in 0..random_calls(tool) {
            let args = tool.random_args(&mut rng);
            fuzz.call(&tool.name, args).await;
        }
    }
    let (calls, protocol_errors) = (fuzz.calls, fuzz.protocol_errors);
    let mut per_tool: Vec<_> = fuzz.per_tool.iter().collect();
    per_tool.sort_by_key(|(_, took)| std::cmp::Reverse(**took));
    let costliest: Vec<String> = per_tool
        .iter()
        .take(5)
        .map(|(tool, took)| format!("{tool} {:.1} s", took.as_secs_f64()))
        .collect();
    eprintln!(
        "arg_fuzz: {calls} calls to {} tools in {:.1} s ({protocol_errors} JSON-RPC errors); slowest {:.2} s: {}",
        tools.len(),
        started.elapsed().as_secs_f64(),
        fuzz.slowest.0.as_secs_f64(),
        &fuzz.slowest.1[..fuzz.slowest.1.len().min(300)]
    );
    eprintln!("arg_fuzz: most time in {}", costliest.join(", "));

    server.assert_alive();
    server.assert_clean_stdout();
    let log = server.stderr_log();
    assert!(
        !log.contains("panicked at"),
        "seed {seed:#x}: the server panicked during the run:\n{}",
        tail(&log, LOG_TAIL)
    );
    let out = server.exec("1+1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"), "{out:#?}");
}
