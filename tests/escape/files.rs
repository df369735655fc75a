//! (escape tests: files)
