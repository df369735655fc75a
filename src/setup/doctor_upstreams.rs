//! doctor's `mcp-servers` item: each server of `--mcp-servers` started, its
//! tools listed (and how many code may call), then ended.

use crate::config::settings::Settings;
use std::time::Duration;

use super::doctor::{Item, Status, item};
use crate::upstream::UpstreamConfig;

/// How long one server may take to start and list its tools here.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// None when no servers file is configured.
pub(super) async fn servers_item(settings: &Settings) -> Option<Item> {
    let path = settings.own_files.mcp_servers.as_ref()?;
    // As the server runs them: never from what sessions write.
    let rules = crate::upstream::SpawnRules {
        writable: crate::startup::places::named(settings).writable(),
        base_dir: std::path::absolute(path)
            .ok()
            .and_then(|p| p.canonicalize().ok())
            .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_else(|| "/".into()),
    };
    let config = match UpstreamConfig::read(path) {
        Ok(c) => c,
        Err(e) => {
            return Some(item(
                "mcp-servers",
                Status::Missing,
                format!("{e}; the server would refuse to start"),
            ));
        }
    };
    if config.servers.is_empty() {
        return Some(item(
            "mcp-servers",
            Status::Warn,
            format!("{}: no servers", path.display()),
        ));
    }
    let probes = config.servers.iter().map(|spec| {
        let rules = rules.clone();
        async move {
            (
                spec,
                crate::upstream::probe(spec, rules, PROBE_TIMEOUT).await,
            )
        }
    });
    let results = futures::future::join_all(probes).await;
    let mut lines = Vec::new();
    let mut failed = 0;
    for (spec, result) in results {
        let tenants = match &spec.tenants {
            Some(t) => format!(" (tenants: {})", t.join(", ")),
            None => String::new(),
        };
        match result {
            Ok(tools) => {
                let allowed = tools.iter().filter(|(_, ok)| *ok).count();
                let denied = tools.len() - allowed;
                let note = if denied > 0 {
                    format!(", {denied} not allowed by allowTools")
                } else {
                    String::new()
                };
                let s = if allowed == 1 { "" } else { "s" };
                lines.push(format!(
                    "{}: {allowed} tool{s} for code{note}{tenants}",
                    spec.name
                ));
            }
            Err(why) => {
                failed += 1;
                lines.push(format!("{}: {why}{tenants}", spec.name));
            }
        }
    }
    let status = if failed > 0 {
        Status::Warn
    } else {
        Status::Good
    };
    Some(item("mcp-servers", status, lines.join("; ")))
}
