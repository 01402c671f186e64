//! mountguard controller.
