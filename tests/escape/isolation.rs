//! (escape tests: isolation)
