//! The R tools that are Python's in R's words: r_exec, r_wait, r_output,
//! r_inspect and r_complete take the Python tools' arguments (described for
//! R in `server.rs`) and run their bodies, which learn their language from
//! the name they were called by. Only names, titles and descriptions are
//! R's own.

use rmcp::handler::server::router::tool::ToolRouter;

use crate::mcp::server::FerreplServer;

/// An R tool made from the Python tool `of`.
struct Twin {
    of: &'static str,
    name: &'static str,
    title: &'static str,
    description: &'static str,
}

const TWINS: &[Twin] = &[
    Twin {
        of: "python_exec",
        name: "r_exec",
        title: "Run R",
        description: "Run R code in a persistent session: output, warnings, plots (PNG), errors with their calls. \
Example: {\"code\": \"summary(rnorm(9))\"}",
    },
    Twin {
        of: "python_wait",
        name: "r_wait",
        title: "Wait for an R cell",
        description: "Follow a 'running' or 'waiting_input' R cell: wait, answer readline(), or interrupt.",
    },
    Twin {
        of: "python_output",
        name: "r_output",
        title: "Read R cell output",
        description: "An R cell's full output: a window, or the lines matching grep.",
    },
    Twin {
        of: "python_inspect",
        name: "r_inspect",
        title: "Inspect R objects",
        description: "The R session's objects (class, size, str), or one in detail. Between cells only.",
    },
    Twin {
        of: "python_complete",
        name: "r_complete",
        title: "Complete R code",
        description: "Completions at the cursor from the R session's live objects. Example: {\"code\": \"mtcars$m\"}",
    },
];

impl FerreplServer {
    pub(crate) fn r_router() -> ToolRouter<Self> {
        let python = Self::python_router() + Self::more_router();
        let mut router = ToolRouter::new();
        for twin in TWINS {
            let Some(route) = python.map.get(twin.of) else {
                continue;
            };
            let mut route = route.clone();
            route.attr.name = twin.name.into();
            route.attr.description = Some(twin.description.into());
            if let Some(annotations) = &mut route.attr.annotations {
                annotations.title = Some(twin.title.into());
            }
            router.add_route(route);
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
        for twin in TWINS {
            let tool = router.get(twin.name).map(|t| t.title.clone());
            assert!(
                tool.is_some(),
                "{} has no route from {}",
                twin.name,
                twin.of
            );
            assert_eq!(
                crate::mcp::groups::language_of(twin.name),
                crate::worker::Language::R
            );
        }
    }
}
