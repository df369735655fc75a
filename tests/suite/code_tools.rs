//! Code calls tools (issue 33): a session's code calls the operator's MCP
//! servers through `import ferrepl`.
