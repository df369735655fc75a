//! Code calls tools (issue 33), attacked: upstream secrets, the servers
//! file, foreign servers and orphans.
