//! kernel_exec: python_exec's body under another name, for sessions on a
//! Jupyter kernel of another language (bash, julia, ...). Its cells are
//! followed by python_wait and python_output, so it is the only tool such
//! kernels add; the session refuses the wrong one of the two cell tools
//! (`session/kernel_tool.rs`). Listed only when --kernels names such a
//! kernel (`server.rs`).

use rmcp::handler::server::router::tool::ToolRouter;

use crate::mcp::server::FerreplServer;

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
}
