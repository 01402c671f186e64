//! mountguard node agent.
