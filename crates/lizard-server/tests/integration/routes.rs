//! The control plane's OpenAPI document against the one route table,
//! [`lizard_api::routes::SERVER`]: every route of the table is documented with its method,
//! success status, error statuses and body types, and every documented route is in the
//! table. The node's router is built from the same table and the clients take their paths
//! from it, so a route cannot drift between server, node and clients unnoticed.

use lizard_api::routes::{self, Body, Route};
use serde_json::Value;
use std::collections::BTreeSet;

const METHODS: [&str; 8] = ["get", "post", "put", "patch", "delete", "head", "options", "trace"];

fn document() -> Value {
    let doc = lizard_server::openapi_document(lizard_server::api::all_routes());
    serde_json::to_value(doc).expect("the document serializes")
}

fn operation<'a>(doc: &'a Value, r: &Route) -> Option<&'a Value> {
    doc["paths"].get(r.path)?.get(r.method.as_str().to_ascii_lowercase())
}

fn name(r: &Route) -> String {
    format!("{} {}", r.method.as_str(), r.path)
}

/// `(is a list, schema name)` of a JSON schema that names one (`$ref`, or an array of one).
fn named_schema(schema: &Value) -> Option<(bool, String)> {
    let last = |v: &Value| v.as_str().and_then(|s| s.rsplit('/').next()).map(str::to_string);
    if let Some(r) = schema.get("$ref") {
        return last(r).map(|n| (false, n));
    }
    if schema.get("type").and_then(Value::as_str) == Some("array") {
        return schema.get("items").and_then(|i| i.get("$ref")).and_then(last).map(|n| (true, n));
    }
    None
}

/// Check `body` against an OpenAPI `content` map (absent: no body).
fn check_body(what: &str, body: Body, content: Option<&Value>) -> Result<(), String> {
    let json = content.and_then(|c| c.get("application/json")).and_then(|j| j.get("schema"));
    match body {
        Body::Empty if content.is_some_and(|c| c.as_object().is_some_and(|o| !o.is_empty())) => {
            Err(format!("{what}: the table says no body, the document has {content:?}"))
        }
        Body::Empty => Ok(()),
        Body::Bytes if content.and_then(|c| c.get("application/octet-stream")).is_none() => {
            Err(format!("{what}: the table says bytes, the document has {content:?}"))
        }
        Body::Text if content.and_then(|c| c.get("text/plain")).is_none() => {
            Err(format!("{what}: the table says text, the document has {content:?}"))
        }
        Body::Frames if content.and_then(|c| c.get(lizard_agent_proto::routes::FRAMES_CONTENT_TYPE)).is_none() => {
            Err(format!("{what}: the table says exec frames, the document has {content:?}"))
        }
        Body::Bytes | Body::Text | Body::Frames => Ok(()),
        Body::Ndjson(n) => {
            let schema = content.and_then(|c| c.get("application/x-ndjson")).and_then(|j| j.get("schema"));
            match schema.and_then(named_schema) {
                Some((false, doc_name)) if doc_name == n => Ok(()),
                _ => Err(format!("{what}: the table says NDJSON of {n}, the document has {content:?}")),
            }
        }
        Body::Json(_) | Body::JsonList(_) if json.is_none() => {
            Err(format!("{what}: the table says {body:?}, the document has no JSON body"))
        }
        Body::Json(n) | Body::JsonList(n) => {
            let list = matches!(body, Body::JsonList(_));
            // An inline schema (e.g. `Object`) names no type to compare; a named one must match.
            match json.and_then(named_schema) {
                Some((l, doc_name)) if (l, doc_name.as_str()) != (list, n) => Err(format!(
                    "{what}: the table says {body:?}, the document {}{doc_name}",
                    if l { "[]" } else { "" }
                )),
                _ => Ok(()),
            }
        }
    }
}

#[test]
fn every_table_route_is_documented_with_its_method() {
    let doc = document();
    let missing: Vec<_> = routes::SERVER.iter().filter(|r| operation(&doc, r).is_none()).map(name).collect();
    assert!(missing.is_empty(), "in lizard_api::routes::SERVER but not in /openapi.json: {missing:?}");
}

#[test]
fn every_documented_route_is_in_the_table() {
    let doc = document();
    let table: BTreeSet<_> = routes::SERVER.iter().map(|r| (r.method.as_str().to_ascii_lowercase(), r.path)).collect();
    let mut extra = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS.iter().filter(|m| item.get(**m).is_some()) {
            if !table.contains(&(method.to_string(), path.as_str())) {
                extra.push(format!("{} {path}", method.to_ascii_uppercase()));
            }
        }
    }
    assert!(extra.is_empty(), "in /openapi.json but not in lizard_api::routes::SERVER: {extra:?}");
}

/// Where `r`'s statuses or bodies differ from its operation in `doc`.
fn disagreements(doc: &Value, r: &Route) -> Vec<String> {
    let Some(op) = operation(doc, r) else { return vec![format!("{}: not documented", name(r))] };
    let mut wrong = Vec::new();
    let responses = op["responses"].as_object().expect("responses");
    let documented: BTreeSet<u16> = responses.keys().filter_map(|k| k.parse().ok()).collect();
    let mut expected: BTreeSet<u16> = r.errors.iter().map(|e| e.status()).collect();
    expected.insert(r.status);
    // Every route that takes a key may be refused by its rate limit.
    if r.errors.contains(&lizard_api::ErrorCode::Unauthenticated) {
        expected.insert(lizard_api::ErrorCode::RateLimited.status());
    }
    if documented != expected {
        wrong.push(format!("{}: statuses {expected:?} in the table, {documented:?} documented", name(r)));
    }
    let checks = [
        check_body(&format!("{} request", name(r)), r.request, op.get("requestBody").map(|b| &b["content"])),
        // The document does not describe its own schema.
        if *r == routes::OPENAPI {
            Ok(())
        } else {
            check_body(
                &format!("{} response", name(r)),
                r.response,
                responses.get(&r.status.to_string()).and_then(|s| s.get("content")),
            )
        },
    ];
    wrong.extend(checks.into_iter().filter_map(Result::err));
    wrong
}

#[test]
fn statuses_and_bodies_match_the_table() {
    let doc = document();
    let wrong: Vec<_> = routes::SERVER.iter().flat_map(|r| disagreements(&doc, r)).collect();
    assert!(wrong.is_empty(), "the document and lizard_api::routes disagree:\n{}", wrong.join("\n"));
}

#[test]
fn the_checks_catch_a_route_that_differs() {
    let doc = document();
    let unknown = Route { path: "/v1/no-such-route", ..routes::WHOAMI };
    assert!(operation(&doc, &unknown).is_none());
    let differs = [
        Route { status: 200, ..routes::CREATE_SANDBOX },
        Route { errors: &[lizard_api::ErrorCode::Unauthenticated], ..routes::CREATE_SANDBOX },
        Route { request: Body::Json("CreateSandboxRequest"), ..routes::CREATE_SANDBOX },
        Route { response: Body::JsonList("SandboxInfo"), ..routes::GET_SANDBOX },
        Route { request: Body::Empty, ..routes::WRITE_FILE },
        Route { response: Body::Json("Workspace"), ..routes::KILL_SANDBOX },
        Route { response: Body::Ndjson("BuildStepInfo"), ..routes::TEMPLATE_BUILD_EVENTS },
        Route { response: Body::Json("BuildEvent"), ..routes::TEMPLATE_BUILD_EVENTS },
        Route { response: Body::Frames, ..routes::LIST_PROCESSES },
    ];
    for r in &differs {
        assert!(!disagreements(&doc, r).is_empty(), "{r:?}");
    }
}

#[test]
fn path_parameters_are_documented() {
    let doc = document();
    for r in routes::SERVER {
        let Some(op) = operation(&doc, r) else { continue };
        let documented: BTreeSet<_> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "path")
            .filter_map(|p| p["name"].as_str())
            .collect();
        let table: BTreeSet<_> = r.params().collect();
        assert_eq!(documented, table, "{}", name(r));
    }
}
