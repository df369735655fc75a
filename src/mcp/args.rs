//! Tool arguments: the `Parameters` extractor every tool uses, and the
//! checked argument types and clamps shared by the tools.
//!
//! The rules (documented in docs/tools.md, "Argument checks"):
//!
//! * An argument of the wrong type, a negative count, or a number of seconds
//!   that is negative, NaN or infinite is refused with a tool error that names
//!   the argument (`wait_s must be a finite number of seconds >= 0, got -1`).
//! * A number too big to mean anything is clamped, never converted as is:
//!   `wait_s` to `--max-wait` (before it becomes a `Duration`), counts and
//!   offsets by saturating conversions ([`index`]) and per-tool maximums.
//!
//! No tool argument can make a handler panic or overflow: a panic there would
//! kill the request's task and leave the call unanswered (tests/suite/arg_fuzz.rs).

use std::borrow::Cow;
use std::fmt;

use rmcp::ErrorData as McpError;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResult, JsonObject};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_json::Value;

/// rmcp answers an extractor error that starts with this text with a tool
/// result (`isError: true`, the message as text) instead of a JSON-RPC error,
/// so that the model sees what to fix.
const ERROR_PREFIX: &str = "failed to deserialize parameters:";

/// The arguments of a tool call, deserialized into `P`. Unlike rmcp's own
/// `Parameters`, a failure names the argument at fault (`wait_s: invalid
/// type: string "5", expected a number of seconds >= 0`). The `#[tool]` macro
/// finds the input schema through any type named `Parameters`.
#[derive(Debug, Clone)]
pub struct Parameters<P>(pub P);

impl<P: JsonSchema> JsonSchema for Parameters<P> {
    fn schema_name() -> Cow<'static, str> {
        P::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        P::json_schema(generator)
    }
}

impl<S, P: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, McpError> {
        let arguments = context.arguments.take().unwrap_or_default();
        parse(arguments)
            .map(Parameters)
            .map_err(|message| McpError::invalid_params(format!("{ERROR_PREFIX} {message}"), None))
    }
}

/// Deserializes tool arguments; the error says which argument is wrong and
/// what it must be (`wait_s must be a number of seconds >= 0, got the string
/// "5"`).
pub fn parse<P: DeserializeOwned>(arguments: JsonObject) -> Result<P, String> {
    serde_path_to_error::deserialize::<_, P>(Value::Object(arguments.clone())).map_err(|e| {
        let path = e.path().to_string();
        let message = plain_types(&e.inner().to_string());
        if path == "." && !message.starts_with("missing field") {
            // A flattened group of fields hides the path: find the field.
            if let Some(field) = culprit::<P>(&arguments) {
                return sentence(&field, &message);
            }
        }
        sentence(&path, &message)
    })
}

/// The argument without which the rest deserializes as `P`. (A wrong
/// required field is named by its path already: it is never flattened.)
fn culprit<P: DeserializeOwned>(arguments: &JsonObject) -> Option<String> {
    arguments.keys().find_map(|key| {
        let mut rest = arguments.clone();
        rest.remove(key);
        serde_json::from_value::<P>(Value::Object(rest))
            .is_ok()
            .then(|| key.clone())
    })
}

/// serde's message about the argument at `path` as one plain sentence.
fn sentence(path: &str, message: &str) -> String {
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        return format!("{field} is required");
    }
    let subject = if path == "." { "the arguments" } else { path };
    // Our own checks already read as a sentence after the name.
    if message.starts_with("must ") {
        return format!("{subject} {message}");
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((given, allowed)) = rest.split_once("`, expected one of ")
    {
        return format!(
            "{subject} must be one of {}, got \"{given}\"",
            allowed.replace('`', "")
        );
    }
    for kind in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(kind)
            && let Some((got, expected)) = rest.split_once(", expected ")
        {
            return format!("{subject} must be {expected}, got {}", plain_value(got));
        }
    }
    format!("{subject}: {message}")
}

/// serde's description of a JSON value ("string \"5\"", "integer `-1`").
fn plain_value(got: &str) -> String {
    let ticked = |prefix: &str| {
        got.strip_prefix(prefix)
            .map(|v| v.trim_matches('`').to_string())
    };
    if let Some(s) = got.strip_prefix("string ") {
        return format!("the string {s}");
    }
    for prefix in ["integer ", "floating point ", "boolean "] {
        if let Some(v) = ticked(prefix) {
            return v;
        }
    }
    match got {
        "map" => "an object".into(),
        "sequence" => "an array".into(),
        "unit value" => "null".into(),
        other => other.into(),
    }
}

/// serde's Rust type names in "expected ..." said the way the schema says them.
fn plain_types(message: &str) -> String {
    const NAMES: &[(&str, &str)] = &[
        ("expected u64", "expected a whole number >= 0"),
        ("expected usize", "expected a whole number >= 0"),
        ("expected u32", "expected a whole number >= 0"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
    ];
    let mut out = message.to_string();
    for (rust, plain) in NAMES {
        if let Some(at) = out.find(rust) {
            let end = at + rust.len();
            // Only a whole word: "expected u64" but not "expected u6400".
            if !out[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                out.replace_range(at..end, plain);
            }
        }
    }
    out
}

/// rmcp turns an argument error into a tool result that starts with its own
/// prefix; the agent only needs what is wrong.
pub fn plain_argument_error(result: &mut CallToolResult) {
    if result.is_error != Some(true) {
        return;
    }
    if let Some(rmcp::model::ContentBlock::Text(text)) = result.content.first_mut()
        && let Some(rest) = text.text.strip_prefix(ERROR_PREFIX)
    {
        text.text = format!("error: {}", rest.trim_start());
    }
}

/// Arguments named in a note at most; the rest are counted.
const UNKNOWN_NAMED: usize = 5;
/// Characters of an unknown argument's name shown at most.
const UNKNOWN_NAME_CHARS: usize = 40;

/// Arguments read although the tool's schema does not list them: an alias
/// (`name` for `session`), and `language`, left out of the schema when R
/// is off (an R session is then refused, not ignored).
const UNLISTED: &[(&str, &str)] = &[("python_sessions", "name"), ("python_sessions", "language")];

/// A note naming the arguments of a call that `tool`'s input schema does
/// not have, which are ignored (`timeout` for `wait_s`, `expr` for `name`):
/// the agent learns that they had no effect and what the tool takes. None
/// when every argument is known.
pub fn unknown_arguments_note(
    tool: &rmcp::model::Tool,
    arguments: Option<&JsonObject>,
) -> Option<String> {
    let known = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let is_known = |key: &str| {
        known.is_some_and(|k| k.contains_key(key)) || UNLISTED.contains(&(tool.name.as_ref(), key))
    };
    let unknown: Vec<&String> = arguments?.keys().filter(|k| !is_known(k)).collect();
    if unknown.is_empty() {
        return None;
    }
    let mut named: Vec<String> = unknown
        .iter()
        .take(UNKNOWN_NAMED)
        .map(|k| {
            format!(
                "'{}'",
                k.chars().take(UNKNOWN_NAME_CHARS).collect::<String>()
            )
        })
        .collect();
    if unknown.len() > UNKNOWN_NAMED {
        named.push(format!("{} more", unknown.len() - UNKNOWN_NAMED));
    }
    let takes = match known {
        Some(k) if !k.is_empty() => {
            let names: Vec<&str> = k.keys().map(String::as_str).collect();
            format!("its arguments are {}", names.join(", "))
        }
        _ => "it takes no arguments".to_string(),
    };
    Some(format!(
        "[ferrepl] {} ignored {}: {takes}.",
        tool.name,
        named.join(", ")
    ))
}

/// Appends `note` as the last line of the result's text (a text block of
/// its own when the result has none first).
pub fn add_note(result: &mut CallToolResult, note: String) {
    if let Some(rmcp::model::ContentBlock::Text(text)) = result.content.first_mut() {
        text.text.push('\n');
        text.text.push_str(&note);
    } else {
        result.content.push(rmcp::model::ContentBlock::text(note));
    }
}

/// The schema of a checked argument type, written where it is used (no
/// `$defs` entry): `inline_schema!(Type, "Name", { ...schema... })`.
macro_rules! inline_schema {
    ($ty:ty, $name:literal, $schema:tt) => {
        impl JsonSchema for $ty {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

/// The message of a refused number of seconds.
pub fn check_seconds(value: f64) -> Result<f64, String> {
    if value.is_finite() && value >= 0.0 {
        // -0.0 passes the test above; make it a plain 0.
        Ok(value.max(0.0))
    } else {
        Err(format!(
            "must be a finite number of seconds >= 0, got {value}"
        ))
    }
}

/// A number of seconds: finite and >= 0 (checked when the arguments are
/// read). How long it may be is up to the tool: waits are clamped to
/// `--max-wait` by `SessionManager::wait_window`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Seconds(f64);

impl Seconds {
    pub fn new(value: f64) -> Result<Self, String> {
        check_seconds(value).map(Seconds)
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// `Option<Seconds>` as the `Option<f64>` the session layer takes.
pub fn secs(value: Option<Seconds>) -> Option<f64> {
    value.map(Seconds::get)
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SecondsVisitor;

        impl Visitor<'_> for SecondsVisitor {
            type Value = Seconds;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of seconds >= 0")
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Seconds, E> {
                Seconds::new(v).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seconds, E> {
                Seconds::new(v as f64).map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seconds, E> {
                Seconds::new(v as f64).map_err(E::custom)
            }
        }

        deserializer.deserialize_f64(SecondsVisitor)
    }
}

inline_schema!(Seconds, "Seconds", { "type": "number", "minimum": 0 });

/// A signal given by name ("TERM", "SIGKILL") or number (9 or "9").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalArg(pub String);

impl SignalArg {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for SignalArg {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SignalVisitor;

        impl Visitor<'_> for SignalVisitor {
            type Value = SignalArg;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a signal name (TERM, KILL, INT...) or number")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<SignalArg, E> {
                Ok(SignalArg(v.to_string()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SignalArg, E> {
                Ok(SignalArg(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SignalArg, E> {
                Ok(SignalArg(v.to_string()))
            }
        }

        deserializer.deserialize_any(SignalVisitor)
    }
}

// A number is accepted too; the schema names the usual form only.
inline_schema!(SignalArg, "Signal", { "type": "string" });

/// A file path argument: any text but NUL, which no path can hold (the
/// interpreter would die on it instead of reporting a missing file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathArg(String);

impl PathArg {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for PathArg {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let path = String::deserialize(deserializer)?;
        if path.contains('\0') {
            return Err(de::Error::custom("must be a path without NUL characters"));
        }
        Ok(PathArg(path))
    }
}

inline_schema!(PathArg, "Path", { "type": "string" });

/// A count or offset from the arguments as an index: saturates instead of
/// truncating where `usize` is narrower than `u64`.
pub fn index(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    struct Args {
        #[serde(default)]
        wait_s: Option<Seconds>,
        #[serde(default)]
        offset: Option<u64>,
        #[serde(default)]
        signal: Option<SignalArg>,
        #[serde(default)]
        names: Option<Vec<String>>,
        #[serde(default)]
        path: Option<PathArg>,
    }

    fn parsed(v: Value) -> Result<Args, String> {
        let Value::Object(map) = v else {
            panic!("arguments must be an object")
        };
        parse(map)
    }

    #[test]
    fn seconds_must_be_finite_and_not_negative() {
        assert_eq!(Seconds::new(1.5).map(Seconds::get), Ok(1.5));
        assert_eq!(Seconds::new(-0.0).map(Seconds::get), Ok(0.0));
        assert_eq!(Seconds::new(1e300).map(Seconds::get), Ok(1e300));
        assert_eq!(
            Seconds::new(f64::NAN),
            Err("must be a finite number of seconds >= 0, got NaN".to_string())
        );
        assert!(Seconds::new(f64::INFINITY).is_err());
        assert!(Seconds::new(-1.0).is_err());
    }

    #[test]
    fn errors_name_the_argument() {
        let e = parsed(json!({"wait_s": "5"})).unwrap_err();
        assert_eq!(
            e,
            r#"wait_s must be a number of seconds >= 0, got the string "5""#
        );
        let e = parsed(json!({"wait_s": -1})).unwrap_err();
        assert_eq!(e, "wait_s must be a finite number of seconds >= 0, got -1");
        let e = parsed(json!({"offset": -1})).unwrap_err();
        assert_eq!(e, "offset must be a whole number >= 0, got -1");
        let e = parsed(json!({"offset": 1e300})).unwrap_err();
        assert_eq!(e, "offset must be a whole number >= 0, got 1e+300");
        let e = parsed(json!({"names": ["a", 1]})).unwrap_err();
        assert_eq!(e, "names[1] must be a string, got 1");
        let e = parsed(json!({"names": "a"})).unwrap_err();
        assert_eq!(e, r#"names must be an array, got the string "a""#);
        let e = parsed(json!({"names": {}})).unwrap_err();
        assert_eq!(e, "names must be an array, got an object");
        let a = parsed(json!({"names": ["a"]})).expect("valid");
        assert_eq!(a.names, Some(vec!["a".to_string()]));
        let e = parsed(json!({"path": "a\u{0}b"})).unwrap_err();
        assert_eq!(e, "path must be a path without NUL characters");
        let a = parsed(json!({"path": "../x.py"})).expect("valid");
        assert_eq!(a.path.expect("path").as_str(), "../x.py");
    }

    #[test]
    fn huge_seconds_and_signals_by_number_are_accepted() {
        let a = parsed(json!({"wait_s": 1e300, "signal": 9})).expect("valid");
        assert_eq!(secs(a.wait_s), Some(1e300));
        assert_eq!(a.signal.expect("signal").as_str(), "9");
        let a = parsed(json!({"signal": "TERM", "offset": u64::MAX})).expect("valid");
        assert_eq!(a.signal.expect("signal").as_str(), "TERM");
        assert_eq!(a.offset, Some(u64::MAX));
        assert!(parsed(json!({"signal": 1.5})).is_err());
    }

    #[test]
    fn a_flattened_field_is_still_named() {
        #[derive(Debug, Deserialize)]
        struct Window {
            #[serde(default)]
            #[allow(dead_code)]
            limit: Option<u64>,
        }
        #[derive(Debug, Deserialize)]
        struct Outer {
            #[allow(dead_code)]
            job: String,
            #[serde(flatten)]
            #[allow(dead_code)]
            window: Window,
        }
        let Value::Object(map) = json!({"job": "j1", "limit": -1}) else {
            panic!("object")
        };
        let e = parse::<Outer>(map).unwrap_err();
        assert_eq!(e, "limit must be a whole number >= 0, got -1");
    }

    #[test]
    fn plain_types_only_rewrites_whole_names() {
        assert_eq!(plain_types("expected u64"), "expected a whole number >= 0");
        assert_eq!(plain_types("expected u6400"), "expected u6400");
    }
}
