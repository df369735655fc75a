//! (escape tests: args)
