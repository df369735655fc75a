//! Makes the JSON Schemas that schemars generates acceptable to every client.
//!
//! schemars writes Rust-specific formats (`uint64`, `double`), nullable types
//! as `type: [X, "null"]`, `default: null` for every optional field and
//! boolean schemas (`items: true`). The TypeScript SDK's Ajv warns once per
//! unknown format on every `listTools()`, the Inspector's `--strict` fails on
//! boolean schemas, and all of it costs the agent characters. An optional
//! field is simply not required; that is all a client needs to know.

use serde_json::{Map, Value};

/// The formats JSON Schema 2020-12 defines; any other is dropped.
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

/// Keywords whose value is one schema.
const SCHEMA_KEYWORDS: &[&str] = &[
    "items",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
];
/// Keywords whose value is a list of schemas.
const LIST_KEYWORDS: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems"];
/// Keywords whose value maps names to schemas.
const MAP_KEYWORDS: &[&str] = &["properties", "$defs", "definitions", "patternProperties"];

/// Rewrites a top-level schema in place (see the module comment).
pub fn portable(schema: &mut Map<String, Value>) {
    schema.remove("$schema");
    schema.remove("title");
    inline_definitions(schema);
    clean(schema);
}

/// Removes a top-level property (and its `required` entry).
pub fn remove_property(schema: &mut Map<String, Value>, name: &str) {
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.remove(name);
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|r| r != name);
    }
}

/// Sets the description of a top-level property, if the schema has it
/// (an empty `doc` removes it).
pub fn describe_property(schema: &mut Map<String, Value>, name: &str, doc: &str) {
    if let Some(Value::Object(prop)) = schema.get_mut("properties").and_then(|p| p.get_mut(name)) {
        if doc.is_empty() {
            prop.remove("description");
        } else {
            prop.insert("description".into(), Value::from(doc));
        }
    }
}

/// Replaces each `$ref` to a local definition with the definition itself:
/// shorter for one use, and some clients do not resolve references. A
/// recursive type keeps its references (and definitions).
fn inline_definitions(schema: &mut Map<String, Value>) {
    let Some(Value::Object(defs)) = schema.remove("$defs") else {
        return;
    };
    let mut unresolved = false;
    for value in schema.values_mut() {
        inline_refs(value, &defs, 0, &mut unresolved);
    }
    if unresolved {
        schema.insert("$defs".into(), Value::Object(defs));
    }
}

const MAX_INLINE_DEPTH: usize = 8;

fn inline_refs(value: &mut Value, defs: &Map<String, Value>, depth: usize, unresolved: &mut bool) {
    match value {
        Value::Object(map) => {
            let target = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
                .and_then(|name| defs.get(name));
            if let Some(Value::Object(def)) = target {
                if depth >= MAX_INLINE_DEPTH {
                    *unresolved = true;
                    return;
                }
                map.remove("$ref");
                for (k, v) in def {
                    map.entry(k.clone()).or_insert_with(|| v.clone());
                }
                inline_refs(value, defs, depth + 1, unresolved);
                return;
            }
            for v in map.values_mut() {
                inline_refs(v, defs, depth, unresolved);
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| inline_refs(v, defs, depth, unresolved)),
        _ => {}
    }
}

/// Removes null members of objects, recursively.
pub fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Whether a schema admits null (`type: [X, "null"]`, or a null member of
/// `anyOf`/`oneOf`).
fn is_nullable(schema: &Value) -> bool {
    let in_type = match schema.get("type") {
        Some(Value::Array(types)) => types.iter().any(|t| t.as_str() == Some("null")),
        Some(t) => t.as_str() == Some("null"),
        None => false,
    };
    in_type
        || ["anyOf", "oneOf"].iter().any(|key| {
            schema
                .get(*key)
                .and_then(Value::as_array)
                .is_some_and(|members| members.iter().any(is_null_schema))
        })
}

fn clean(schema: &mut Map<String, Value>) {
    // A field that may be null is left out instead (results strip nulls), so
    // it is not required.
    let nullable: Vec<String> = match schema.get("properties") {
        Some(Value::Object(props)) => props
            .iter()
            .filter(|(_, p)| is_nullable(p))
            .map(|(k, _)| k.clone())
            .collect(),
        _ => Vec::new(),
    };
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|r| r.as_str().is_none_or(|r| !nullable.iter().any(|n| n == r)));
    }
    if schema.get("default") == Some(&Value::Null) {
        schema.remove("default");
    }
    if let Some(format) = schema.get("format").and_then(Value::as_str)
        && !STANDARD_FORMATS.contains(&format)
    {
        schema.remove("format");
    }
    if let Some(Value::Array(types)) = schema.get("type") {
        let mut kept: Vec<Value> = types
            .iter()
            .filter(|t| t.as_str() != Some("null"))
            .cloned()
            .collect();
        if kept.len() == 1 {
            schema.insert("type".into(), kept.remove(0));
        } else {
            // Several types: the form every validator reads without a warning.
            schema.remove("type");
            let members = kept
                .into_iter()
                .map(|t| serde_json::json!({ "type": t }))
                .collect();
            schema.insert("anyOf".into(), Value::Array(members));
        }
    }
    // `anyOf: [X, {"type": "null"}]` (an optional struct or enum) becomes X.
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(members)) = schema.get(key) else {
            continue;
        };
        let non_null: Vec<&Value> = members.iter().filter(|m| !is_null_schema(m)).collect();
        if non_null.len() == 1 && members.len() == 2 {
            let only = non_null[0].clone();
            schema.remove(key);
            if let Value::Object(inner) = only {
                for (k, v) in inner {
                    schema.entry(k).or_insert(v);
                }
            }
        }
    }
    if schema.get("nullable") == Some(&Value::Bool(true)) {
        schema.remove("nullable");
    }
    for key in SCHEMA_KEYWORDS {
        if let Some(sub) = schema.get_mut(*key) {
            clean_value(sub);
        }
    }
    for key in LIST_KEYWORDS {
        if let Some(Value::Array(list)) = schema.get_mut(*key) {
            list.iter_mut().for_each(clean_value);
        }
    }
    for key in MAP_KEYWORDS {
        if let Some(Value::Object(map)) = schema.get_mut(*key) {
            map.values_mut().for_each(clean_value);
        }
    }
}

/// A boolean schema becomes its object form (`true`: any JSON value, spelled
/// out; `false`: `{"not": {}}`), which every validator reads the same way.
fn clean_value(value: &mut Value) {
    match value {
        Value::Bool(true) => *value = Value::Object(any_value()),
        Value::Bool(false) => {
            let mut not = Map::new();
            not.insert("not".into(), Value::Object(Map::new()));
            *value = Value::Object(not);
        }
        Value::Object(map) => {
            if map.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) {
                map.extend(any_value());
            }
            clean(map)
        }
        _ => {}
    }
}

/// A schema for any JSON value. The Inspector's `--strict` flags a schema
/// without a validation keyword (`{}`), so the types are listed.
fn any_value() -> Map<String, Value> {
    let types = ["object", "array", "string", "number", "boolean", "null"]
        .iter()
        .map(|t| serde_json::json!({ "type": t }))
        .collect();
    let mut map = Map::new();
    map.insert("anyOf".into(), Value::Array(types));
    map
}

/// Keywords that say nothing about what a value may be.
const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples"];

fn is_null_schema(value: &Value) -> bool {
    value.get("type").and_then(Value::as_str) == Some("null")
}

#[cfg(test)]
mod tests {
    #[test]
    fn nullable_fields_are_not_required_and_nulls_are_stripped() {
        let got = run(json!({
            "type": "object",
            "properties": {
                "a": {"type": ["integer", "null"]},
                "b": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "c": {"type": "string"}
            },
            "required": ["a", "b", "c"]
        }));
        assert_eq!(got["required"], json!(["c"]));
        let mut v = json!({"a": null, "c": "x", "list": [{"d": null, "e": 1}]});
        strip_nulls(&mut v);
        assert_eq!(v, json!({"c": "x", "list": [{"e": 1}]}));
    }

    #[test]
    fn recursive_definitions_stay_references() {
        let got = run(json!({
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/T"}},
            "$defs": {"T": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/T"}}}}}
        }));
        assert!(got.get("$defs").is_some(), "{got}");
        assert!(got.to_string().contains("#/$defs/T"), "{got}");
    }

    use super::*;
    use serde_json::json;

    fn run(v: Value) -> Value {
        let Value::Object(mut map) = v else {
            panic!("not an object")
        };
        portable(&mut map);
        Value::Object(map)
    }

    #[test]
    fn rust_shapes_become_plain_json_schema() {
        let got = run(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "P",
            "type": "object",
            "properties": {
                "n": {"type": ["integer", "null"], "format": "uint64", "minimum": 0, "default": null},
                "x": {"type": "number", "format": "double"},
                "v": true,
                "list": {"type": "array", "items": true},
                "e": {"anyOf": [{"$ref": "#/$defs/E"}, {"type": "null"}], "description": "d"},
                "when": {"type": "string", "format": "date-time"}
            },
            "$defs": {"E": {"type": "string", "enum": ["a"]}}
        }));
        assert_eq!(
            got,
            json!({
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 0},
                    "x": {"type": "number"},
                    "v": {"anyOf": [{"type": "object"}, {"type": "array"}, {"type": "string"},
                        {"type": "number"}, {"type": "boolean"}, {"type": "null"}]},
                    "list": {"type": "array", "items": {"anyOf": [{"type": "object"}, {"type": "array"},
                        {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]}},
                    "e": {"type": "string", "enum": ["a"], "description": "d"},
                    "when": {"type": "string", "format": "date-time"}
                }
            })
        );
    }
}
