//! kernel_exec: python_exec's body under another name, for sessions on a
//! Jupyter kernel of another language (bash, julia, ...). Its cells are
//! followed by python_wait and python_output, so it is the only tool such
//! kernels add; the session refuses the wrong one of the two cell tools
//! (`session/kernel_tool.rs`). Listed only when --kernels names such a
//! kernel.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;

use crate::mcp::schema;
use crate::mcp::server::FerreplServer;

/// kernel_exec takes python_exec's arguments; what they mean there.
pub(crate) const ARGUMENT_DOCS: &[(&str, &str, &str)] =
    &[("kernel_exec", "code", "Code in the kernel's language.")];

impl FerreplServer {
    pub(crate) fn kernel_router() -> ToolRouter<Self> {
        let mut router = ToolRouter::new();
        if let Some(route) = Self::python_router().map.get("python_exec") {
            let mut route = route.clone();
            route.attr.name = "kernel_exec".into();
            router.add_route(route);
        }
        router
    }

    /// Keeps kernel_exec in `router` only when `other_kernels` (name,
    /// language) offers one, its session argument naming them: only a
    /// server with such a kernel pays for the tool.
    pub(crate) fn offer_kernel_exec(
        router: &mut ToolRouter<Self>,
        other_kernels: &[(String, String)],
    ) {
        if other_kernels.is_empty() {
            router.map.remove("kernel_exec");
            return;
        }
        let Some(route) = router.map.get_mut("kernel_exec") else {
            return;
        };
        let names: Vec<String> = other_kernels
            .iter()
            .map(|(name, lang)| format!("{name} ({lang})"))
            .collect();
        let mut input = (*route.attr.input_schema).clone();
        // Branches need the built-in driver's saved states.
        schema::remove_property(&mut input, "parent");
        schema::describe_property(
            &mut input,
            "session",
            &format!("a session on kernel {}", names.join(", ")),
        );
        route.attr.input_schema = Arc::new(input);
    }
}
