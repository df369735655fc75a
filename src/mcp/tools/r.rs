//! The R tools that are Python's in R's words: r_exec, r_wait, r_output,
//! r_inspect and r_complete take the Python tools' arguments (described for
//! R in `server.rs`) and run their bodies, which learn their language from
//! the name they were called by (`Call::language`). Only names, titles and
//! descriptions (tool_docs.rs) are R's own.

use rmcp::handler::server::router::tool::ToolRouter;

use crate::mcp::server::FerreplServer;

/// Each R twin and the Python tool it is made from (its words are in
/// tool_docs.rs).
const TWINS: &[(&str, &str)] = &[
    ("r_exec", "python_exec"),
    ("r_wait", "python_wait"),
    ("r_output", "python_output"),
    ("r_inspect", "python_inspect"),
    ("r_complete", "python_complete"),
];

impl FerreplServer {
    pub(crate) fn r_router() -> ToolRouter<Self> {
        let python = Self::python_router() + Self::more_router();
        let mut router = ToolRouter::new();
        for (name, of) in TWINS {
            if let Some(route) = python.map.get(*of) {
                let mut route = route.clone();
                route.attr.name = (*name).into();
                router.add_route(route);
            }
        }
        router
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_twin_has_its_python_tool_and_language() {
        let router = FerreplServer::r_router();
        for (name, of) in TWINS {
            assert!(router.has_route(name), "{name} has no route from {of}");
            assert_eq!(
                crate::mcp::groups::language_of(name),
                crate::worker::Language::R
            );
        }
    }
}
