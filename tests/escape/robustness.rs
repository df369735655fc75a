//! (escape tests: robustness)
