//! (escape tests: privileges)
